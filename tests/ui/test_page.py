"""The gpuyard page in a real browser (headless Chromium): a submitted job waits in the queue with the
scheduler's reason, shows on the fleet grid once placed, and its timeline shows an injected preemption;
a member of another team sees none of it. Screenshots are kept (the folder is printed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from gpuyard_client import Endpoint, GpuyardClient
from servers import wait_until
from stack import Gpuyard

pytestmark = pytest.mark.slow  # a `gpuyard up` and Chromium

WORKER = "tests/control/workers/checkpointing_worker.py"
WAIT_MS = 30_000


def _quota(gpuyard: Gpuyard, team: str, gpus: int) -> None:
    with gpuyard.client(gpuyard.admin_token) as admin:
        quota = admin.get(f"/v1/teams/{team}").json()["quota"] | {"gpu_quota": gpus}
        assert admin.put(f"/v1/teams/{team}/quota", json=quota).status_code == 200


def _sign_in(browser: Any, page_url: str, token: str) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{page_url}/")
    assert page.url.endswith("/sign-in")  # nobody is signed in yet
    page.fill("input[name=token]", "gy_not-a-token")
    page.click("button[type=submit]")
    assert "the gpuyard API refused it (401)" in page.inner_text("main")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_selector("section#queue")
    return page


def test_a_job_waits_is_placed_and_is_preempted_on_the_page(
    gpuyard: Gpuyard, page_url: str, browser: Any, artifacts: Path, open_dir: Path
) -> None:
    _quota(gpuyard, "a", 0)
    member = GpuyardClient(Endpoint(gpuyard.url, gpuyard.token))
    admin = GpuyardClient(Endpoint(gpuyard.url, gpuyard.admin_token))
    job = member.submit(
        {
            "name": "ui-preempted",
            "team": "a",
            "image": "python:3.11-slim",
            "command": [sys.executable, WORKER, "600", "0.1"],
            "resources": {"gpus": 1, "gpu_types": ["cpu"], "nodes": 1},
            "preemptible": True,
            # its workers may run as team a's user, who cannot enter pytest's tmp_path
            "checkpoint": {"url": (open_dir / "checkpoints").as_uri(), "interval": "auto"},
        }
    )["id"]
    page = _sign_in(browser, page_url, gpuyard.token)

    row = page.wait_for_selector(f'tr.job[data-job="{job}"]', timeout=WAIT_MS)
    assert "over quota" in row.inner_text()  # the scheduler's reason, from its own cycle
    assert page.locator('.chip[data-reason="quota"]').count() == 1
    page.screenshot(path=str(artifacts / "1-queue.png"), full_page=True)

    _quota(gpuyard, "a", 2)  # the page refreshes itself: the job leaves the queue for the fleet
    page.wait_for_selector(f'svg.fleet rect.gpu[data-job="{job}"]', timeout=WAIT_MS)
    page.wait_for_selector(f'tr.job[data-job="{job}"]', state="detached", timeout=WAIT_MS)  # out of the queue
    page.screenshot(path=str(artifacts / "2-fleet.png"), full_page=True)

    running = wait_until(
        lambda: next((a for a in member.job(job)["attempts"] if a["state"] == "RUNNING" and a["step"]), None),
        WAIT_MS / 1000,
        what="the first attempt running and reporting steps",
    )
    admin.preempt_attempt(running["id"])
    wait_until(  # the worker checkpoints on the notice, then stops: slow on a loaded machine
        lambda: any(a["state"] == "PREEMPTED" for a in member.job(job)["attempts"]),
        4 * WAIT_MS / 1000,
        what="the attempt preempted",
    )
    page.goto(f"{page_url}/")
    page.click(f'tr.recent[data-job="{job}"] a')  # the recent jobs lead to it, in the queue or not
    page.wait_for_selector(
        f'svg.timeline rect.attempt[data-attempt="{running["id"]}"][data-state="PREEMPTED"]'
    )
    assert page.locator("svg.timeline .stop-notice[data-kind=preempt]").count() == 1
    assert page.locator('svg.timeline text.end-label[data-state="PREEMPTED"]').count() == 1
    assert "PREEMPTED" in page.inner_text("ol.story")
    page.wait_for_selector("svg.timeline rect.attempt >> nth=1", timeout=WAIT_MS)  # the resume, placed
    page.screenshot(path=str(artifacts / "3-job-timeline.png"), full_page=True)
    page.click("#logs .other-logs a >> text=attempt 1")  # the preempted attempt's own output
    assert "preempted at step" in page.inner_text('pre.logs[data-attempt="1"]')

    page.goto(f"{page_url}/figures?hours=1")
    assert page.locator("svg.chart").count() == 8
    assert page.locator("svg.chart polyline[data-line=total]").count() >= 1  # utilization, at least
    page.screenshot(path=str(artifacts / "4-figures.png"), full_page=True)

    other = gpuyard.mint("b")
    outsider = _sign_in(browser, page_url, other)
    assert outsider.locator(f'[data-job="{job}"]').count() == 0  # not in the queue, the grid, recent jobs
    assert [t.get_attribute("data-team") for t in outsider.locator("table.teams tr[data-team]").all()] == [
        "b"
    ]
    outsider.goto(f"{page_url}/jobs/{job}")
    assert "Not Found" in outsider.inner_text("main")
    outsider.screenshot(path=str(artifacts / "5-another-team.png"), full_page=True)
    member.close()
    admin.close()
