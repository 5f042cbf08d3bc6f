"""Randomized fault injection against the control plane's real processes (issue 11).

`campaign.run_campaign` runs one seeded campaign and checks `invariants` over its whole history;
`python -m tests.faults.run` runs campaigns for as long as asked; `test_faults.py` runs a bounded one
in `make test`. What each component does when cut off, and after how long: docs/faults.md.
"""
