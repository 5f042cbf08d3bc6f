"""The `gpuyard` command line: one module per command group, put together here.

`server` runs the control plane's processes (up, scheduler, api, relay, migrate); `jobs` submits and
follows jobs (submit, jobs, show, cancel, fleet, logs); `tokens`, `teams`, `secrets` and `kubernetes`
are the `token`, `team`, `secret` and `kubernetes` groups; `common` holds what they share (the
options --home, --url, --token, --json and the call to the API). `plan` comes from the worker
runtime, `sim` from the simulator.
"""

import typer

from gpuyard.cli import jobs, kubernetes, secrets, server, teams, tokens
from gpuyard.sim.cli import sim
from training.planner_cli import plan

app = typer.Typer(help="gpuyard: a GPU training platform's control plane.", no_args_is_help=True)
# The planner lives with the worker runtime (training/); it is pure arithmetic, no torch import.
app.command("plan")(plan)
# The trace simulator drives the scheduler's own cycle with a virtual clock.
app.command("sim")(sim)
app.add_typer(server.app)  # no name: its commands are top-level ones, as are jobs'
app.add_typer(jobs.app)
app.add_typer(tokens.app, name="token")
app.add_typer(teams.app, name="team")
app.add_typer(secrets.app, name="secret")
app.add_typer(kubernetes.app, name="kubernetes")

__all__ = ["app"]
