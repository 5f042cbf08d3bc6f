"""Run fault campaigns for as long as asked, each with the next seed; exit 1 if any broke a promise.

    python -m tests.faults.run --minutes 30 --seed 100       # campaigns of seeds 100, 101, ... for 30 min
    python -m tests.faults.run --seed 104 --campaigns 1      # replay seed 104

Each campaign prints its seed, the faults it injected per kind, its jobs and attempts by state and
every invariant violation; the run directories of failing seeds are kept (logs, journal, fault log).
The last line sums them up for machines: `RESULT violations=V faults=F kinds=kind:count,...` (every
kind the suite knows, those never injected with 0).

`--launcher local` (the default) runs the workers as the local launcher's processes; `--launcher
kubernetes` as pods of the emulated cluster (deploy/local), whose own faults strike too
(tests/faults/kubernetes.py: nodes lost, partitioned and NotReady, pulls, evictions, deleted pods, the
API server's link).
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: its `servers` module, as in pytest

from .campaign import Campaign, run_campaign
from .faults import FAULTS
from .kubernetes import KUBERNETES_FAULTS

LAUNCHERS = {"local": FAULTS, "kubernetes": KUBERNETES_FAULTS}  # what strikes where


def result_line(violations: int, injected: Counter[str], launcher: str = "local") -> str:
    """The summary a machine reads: violations, faults injected, and each kind's count (0s included)."""
    known = set(LAUNCHERS[launcher]) | set(injected)
    kinds = ",".join(f"{kind}:{injected.get(kind, 0)}" for kind in sorted(known))
    return f"RESULT violations={violations} faults={sum(injected.values())} kinds={kinds}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.run", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="first seed [default: a random one, printed]")
    parser.add_argument("--minutes", type=float, help="keep starting campaigns until this much time passed")
    parser.add_argument("--campaigns", type=int, help="run exactly this many campaigns")
    parser.add_argument("--fault-seconds", type=float, default=75.0, help="faults per campaign [75]")
    parser.add_argument(
        "--min-faults", type=int, default=0, help="strike past the window (as long again) until this many [0]"
    )
    parser.add_argument("--rate", type=float, default=0.4, help="jobs submitted per second [0.4]")
    parser.add_argument("--min-jobs", type=int, default=0, help="at least this many jobs a campaign [0]")
    parser.add_argument("--work", type=Path, help="where run directories go [a new temporary directory]")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local", help="the launcher [local]")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every campaign part started is stopped (no server, mount or worker left).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if (args.minutes is None) == (args.campaigns is None):
        parser.error("give one of --minutes or --campaigns")
    if min(args.fault_seconds, args.rate, args.minutes or 1, args.campaigns or 1) <= 0:
        parser.error("--fault-seconds, --rate, --minutes and --campaigns must be positive")
    if min(args.min_faults, args.min_jobs) < 0:
        parser.error("--min-faults and --min-jobs must be at least 0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    work = args.work
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="gpuyard-faults-"))
        work.chmod(0o755)  # the pods' workers run as the Kubernetes launcher's user, not root
    started, done, failing = time.monotonic(), 0, []
    totals: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    while True:
        if args.campaigns is not None and done >= args.campaigns:
            break
        if args.minutes is not None and time.monotonic() - started >= args.minutes * 60:
            break
        report = run_campaign(
            Campaign(
                seed=seed,
                fault_s=args.fault_seconds,
                min_faults=args.min_faults,
                rate_per_s=args.rate,
                min_jobs=args.min_jobs,
                launcher=args.launcher,
            ),
            work,
            echo=print,
        )
        print(report.render(), flush=True)
        totals.update(faults=sum(report.injected.values()), jobs=sum(report.jobs.values()))
        totals.update(attempts=sum(report.attempts.values()), violations=len(report.violations))
        totals.update(violations=len(report.rejected))  # a refused valid submission is a broken promise
        kinds.update(report.injected)
        if report.ok:
            shutil.rmtree(report.run, ignore_errors=True)
        else:
            failing.append(seed)
        done, seed = done + 1, seed + 1
    minutes = (time.monotonic() - started) / 60
    print(
        f"{done} campaign(s) in {minutes:.1f} min: {totals['faults']} faults, {totals['jobs']} jobs, "
        f"{totals['attempts']} attempts, {totals['violations']} invariant violations"
        + (f"; failing seeds {failing} (run directories under {work})" if failing else "")
    )
    print(result_line(totals["violations"], kinds, args.launcher), flush=True)
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
