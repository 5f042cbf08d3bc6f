"""Clients ride out an API outage: `submit --wait`, `logs --follow` and the Airflow trigger's followers
keep going while a proxy in front of a real `gpuyard up` refuses and resets every connection, and
give up with one clear line past their deadline.

The outage is forced: the proxy is cut, and the test heals it only once the client has said on
stderr (or in its log) that it is retrying. Each job waits for a file the test writes, so it ends
while the API is away.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from faults.proxy import FaultProxy
from gpuyard_client import ApiUnreachable, Endpoint, GpuyardClient
from servers import GpuyardUp, wait_until, without_gpuyard_settings

pytestmark = pytest.mark.slow  # a `gpuyard up`, a proxy and CLI processes

LINES = 10  # a job prints 1..5, waits for its release, then prints 6..10
# How long the outage under `submit --wait` lasts at least: past the 3.5 s of tries the client had
# before it rode outages out (a 60 s outage: benchmarks/client_outage.py)
HELD_S = 4.0


@dataclass
class Site:
    server: GpuyardUp
    proxy: FaultProxy

    @property
    def direct(self) -> GpuyardClient:
        """A client that bypasses the proxy: what the test asks while the clients under test wait."""
        return GpuyardClient(Endpoint(self.server.url, self.server.admin_token))

    @property
    def via_proxy(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    server = GpuyardUp(tmp_path_factory.mktemp("outage") / "home").start()
    team = [sys.executable, "-m", "gpuyard.cli", "token", "create", "--team", "a", "--home", str(server.home)]
    subprocess.run(team, check=True, capture_output=True, env=without_gpuyard_settings(), timeout=60)
    port = int(server.url.rsplit(":", 1)[1])
    proxy = FaultProxy("127.0.0.1", port, name="api").start()
    try:
        yield Site(server, proxy)
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture
def healed(site: Site) -> Iterator[Site]:
    site.proxy.heal()
    yield site
    site.proxy.heal()


def job_spec(path: Path, name: str, release: Path) -> Path:
    code = (
        "import os, time\n"
        "for i in range(1, 6): print(f'line {i}', flush=True)\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n"
        f"for i in range(6, {LINES + 1}): print(f'line {{i}}', flush=True)\n"
    )
    spec = {
        "name": name,
        "team": "a",
        "image": "python:3.11-slim",
        "command": ["python", "-c", code],
        "resources": {"gpus": 1, "gpu_types": ["cpu"]},
        "retry": {"max_failures": 0},
    }
    path.write_text(json.dumps(spec))
    return path


def cli(
    site: Site, *args: str, out: Path, err: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`gpuyard ARGS` through the proxy, its output in files the test reads while it runs."""
    command = [sys.executable, "-m", "gpuyard.cli", *args, "--url", site.via_proxy]
    command += ["--token", site.server.admin_token]
    with out.open("w") as stdout, err.open("w") as stderr:  # the child holds its own copies
        return subprocess.Popen(
            command,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=without_gpuyard_settings(**(env or {})),
        )


def said(path: Path, words: str, times: int = 1) -> bool:
    return path.read_text().count(words) >= times


def ended(process: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def submitted(site: Site, spec: Path) -> str:
    """The id of the job `spec` submitted straight to the API (not through the proxy)."""
    with site.direct as client:
        return str(client.submit(json.loads(spec.read_text()))["id"])


def state(site: Site, job_id: str) -> str:
    with site.direct as client:
        return str(client.job(job_id)["state"])


def test_submit_wait_rides_out_outages_at_submit_and_while_waiting(
    healed: Site, tmp_path: Path, open_dir: Path
) -> None:
    site, release = healed, open_dir / "release"  # its workers may not enter tmp_path
    spec = job_spec(tmp_path / "job.json", "rides-out-submit", release)
    out, err = tmp_path / "out", tmp_path / "err"
    site.proxy.set("cut")  # down before the submit
    process = cli(site, "submit", str(spec), "--wait", "--json", "--retry-for", "60", out=out, err=err)
    try:
        wait_until(lambda: said(err, "retrying for up to 60 s"), timeout_s=30, what="the submit to retry")
        site.proxy.heal()
        with site.direct as client:
            job_id = wait_until(
                lambda: next(
                    (j["id"] for j in client.jobs(limit=500) if j["name"] == "rides-out-submit"), None
                ),
                what="the job to be submitted",
            )
        wait_until(lambda: state(site, job_id) == "RUNNING", timeout_s=60, what="the job to run")
        site.proxy.set("cut")  # down while it waits; the job ends meanwhile
        cut_at = time.monotonic()
        wait_until(lambda: said(err, "retrying for up to", times=2), timeout_s=30, what="the wait to retry")
        release.touch()
        wait_until(lambda: state(site, job_id) == "SUCCEEDED", timeout_s=60, what="the job to end")
        wait_until(lambda: time.monotonic() - cut_at >= HELD_S, what="the outage to last")  # its length
        assert process.poll() is None, err.read_text()
        site.proxy.heal()
        assert ended(process) == 0, err.read_text()
    finally:
        process.kill()
        release.touch()
    assert json.loads(out.read_text())["state"] == "SUCCEEDED"
    assert "Traceback" not in err.read_text()
    with site.direct as client:  # the submit was tried again: one job all the same
        assert [j["name"] for j in client.jobs(limit=500)].count("rides-out-submit") == 1


def test_logs_follow_prints_every_line_once_across_an_outage(
    healed: Site, tmp_path: Path, open_dir: Path
) -> None:
    site, release = healed, open_dir / "release"  # its workers may not enter tmp_path
    job_id = submitted(site, job_spec(tmp_path / "job.json", "rides-out-logs", release))
    wait_until(lambda: state(site, job_id) == "RUNNING", timeout_s=60, what="the job to run")
    out, err = tmp_path / "out", tmp_path / "err"
    process = cli(site, "logs", job_id, "--follow", "--retry-for", "60", out=out, err=err)
    try:
        wait_until(lambda: said(out, "line 5"), timeout_s=30, what="the first lines")
        site.proxy.set("cut")  # resets the stream, refuses the reconnection
        wait_until(lambda: said(err, "retrying for up to 60 s"), timeout_s=30, what="the logs to retry")
        release.touch()
        wait_until(lambda: state(site, job_id) == "SUCCEEDED", timeout_s=60, what="the job to end")
        site.proxy.heal()
        assert ended(process) == 0, err.read_text()
    finally:
        process.kill()
        release.touch()
    assert out.read_text().splitlines() == [f"line {i}" for i in range(1, LINES + 1)]
    assert "the log stream broke" in err.read_text() and "Traceback" not in err.read_text()


def test_past_the_deadline_the_cli_says_so_in_one_line(healed: Site, tmp_path: Path) -> None:
    site = healed
    site.proxy.set("cut")
    out, err = tmp_path / "out", tmp_path / "err"
    process = cli(site, "jobs", out=out, err=err, env={"GPUYARD_CLIENT_OUTAGE_S": "1.5"})
    assert ended(process) == 1
    lines = err.read_text().splitlines()
    assert len(lines) == 2 and "Traceback" not in err.read_text(), lines  # "retrying", then the error
    assert lines[0].endswith("retrying for up to 2 s")
    assert lines[1].startswith(f"error: the gpuyard API at {site.via_proxy} was unreachable for ")
    assert "s (GET /v1/jobs: ConnectError: [Errno 111] Connection refused); gave up" in lines[1]
    bad = cli(site, "jobs", out=out, err=tmp_path / "bad", env={"GPUYARD_CLIENT_OUTAGE_S": "soon"})
    assert ended(bad) == 1
    assert (tmp_path / "bad").read_text() == (
        "error: GPUYARD_CLIENT_OUTAGE_S: expected seconds from 0 to 604800, got 'soon'\n"
    )


class Told(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """`wait_until` that lets the event loop run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        await asyncio.sleep(0.05)


async def test_the_triggers_followers_ride_out_an_outage(
    healed: Site, tmp_path: Path, open_dir: Path
) -> None:
    from gpuyard_provider.triggers.followers import Followers

    site, release = healed, open_dir / "release"  # its workers may not enter tmp_path
    job_id = submitted(site, job_spec(tmp_path / "job.json", "rides-out-trigger", release))
    await asyncio.to_thread(
        wait_until, lambda: state(site, job_id) == "RUNNING", timeout_s=60, what="the job to run"
    )
    told = Told()  # Airflow's logging takes over the root logger: listen on the client's own
    logging.getLogger("gpuyard_client").addHandler(told)
    seen: list[dict[str, Any]] = []
    backlog_told = asyncio.Event()

    async def follow() -> None:
        hub = Followers.of(Endpoint(site.via_proxy, site.server.admin_token))
        async for batch in hub.follow(job_id, 0):
            seen.extend(batch)
            backlog_told.set()
            if any(e["type"] == "job.succeeded" for e in batch):
                return

    follower = asyncio.create_task(follow())
    try:
        await asyncio.wait_for(backlog_told.wait(), 30)
        site.proxy.set("cut")  # the shared long poll is reset and refused
        cut_at = time.monotonic()
        await until(lambda: any("retrying for up to" in m for m in told.messages), "the followers to retry")
        release.touch()
        await asyncio.to_thread(
            wait_until, lambda: state(site, job_id) == "SUCCEEDED", timeout_s=60, what="the job to end"
        )
        await until(lambda: time.monotonic() - cut_at >= HELD_S, "the outage to last")  # its length
        assert not follower.done()
        site.proxy.heal()
        await asyncio.wait_for(follower, 60)
    finally:
        release.touch()
        follower.cancel()
        logging.getLogger("gpuyard_client").removeHandler(told)
    with site.direct as client:
        in_order = [e["seq"] for e in client.events(job_id=job_id, after=0)["events"]]
    assert [e["seq"] for e in seen] == in_order  # every event once, in order, across the outage


async def test_past_the_deadline_the_followers_fail_naming_the_api(
    healed: Site, tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuyard_provider.triggers.followers import Followers

    site, release = healed, open_dir / "release"
    release.touch()  # the job runs through: the follower waits on the long poll all the same
    job_id = submitted(site, job_spec(tmp_path / "job.json", "gives-up", release))
    monkeypatch.setenv("GPUYARD_CLIENT_OUTAGE_S", "1")
    hub = Followers.of(Endpoint(site.via_proxy, site.server.admin_token))
    batches = hub.follow(job_id, 0)
    try:
        while await anext(batches):  # its backlog, to the empty batch: it waits on the long poll now
            pass
        site.proxy.set("cut")
        with pytest.raises(
            ApiUnreachable, match=rf"the gpuyard API at {site.via_proxy} was unreachable for 1 s"
        ):
            # the running job's next events may have been answered before the cut (seen on a loaded
            # machine): they arrive, then the follower gives up
            for _ in range(10):
                await asyncio.wait_for(anext(batches), 30)
    finally:
        await batches.aclose()
