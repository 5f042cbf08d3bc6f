"""The gpuyard page inside a running Airflow: the plugin mounts the app in Airflow's API server and the
UI's navigation shows it; the Airflow user, mapped to team a, sees a waiting job in the queue and the
fleet without signing in again and opens the job; then signs in with a token inside Airflow's frame."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from stack import AirflowStack, Gpuyard

WAIT_MS = 60_000  # Airflow's UI under the whole suite's load (4 workers on 2 cores) loads slowly
JOB = {
    "name": "waits-in-airflow",
    "team": "a",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('never placed')"],
    "resources": {"gpus": 1, "gpu_types": ["cpu"], "nodes": 1},
}

pytestmark = pytest.mark.slow


def follow(page: Any, link: Any, tries: int = 3) -> None:
    """Click the navigation's link until Airflow's app shows the plugin's page: under load, a click
    that lands while the app still renders its first view is dropped by the re-render (seen once in
    the whole suite's run, never alone)."""
    for _ in range(tries - 1):
        link.click(timeout=WAIT_MS)
        try:
            page.wait_for_url("**/plugin/gpuyard", timeout=WAIT_MS / tries)
            return
        except PlaywrightTimeout:
            continue
    link.click(timeout=WAIT_MS)
    page.wait_for_url("**/plugin/gpuyard", timeout=WAIT_MS)


def test_the_page_is_in_airflows_navigation(
    gpuyard: Gpuyard, browser: Any, artifacts: Path, tmp_path: Path
) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    connection = json.dumps({"conn_type": "gpuyard", "host": gpuyard.url})
    # Every Airflow user of this one is an admin (role ADMIN): mapped to team a's members, the page
    # mints them tokens with the platform's admin token
    mapping = {"roles": {"Admin": {"team": "a", "role": "member"}}}
    delegation = json.dumps({"conn_type": "gpuyard", "password": gpuyard.admin_token, "extra": mapping})
    airflow = AirflowStack(
        home,
        tmp_path / "no-dags",
        AIRFLOW_CONN_GPUYARD_DEFAULT=connection,
        AIRFLOW_CONN_GPUYARD_SIGN_IN=delegation,
    )
    airflow.COMPONENTS = ("api-server",)  # the UI and the plugin's app: nothing else is needed
    (tmp_path / "no-dags").mkdir()
    with gpuyard.client(gpuyard.admin_token) as admin:  # team a may hold no GPU: its job waits
        quota = admin.get("/v1/teams/a").json()["quota"] | {"gpu_quota": 0}
        assert admin.put("/v1/teams/a/quota", json=quota).status_code == 200
    with gpuyard.client() as member:
        job = member.post("/v1/jobs", json=JOB).json()["id"]
    try:
        airflow.start()
        plugins = airflow.api.get("/plugins").json()["plugins"]
        gpuyard_plugin = next(p for p in plugins if p["name"] == "gpuyard")
        assert [v["url_route"] for v in gpuyard_plugin["external_views"]] == ["gpuyard"]
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.goto(f"http://127.0.0.1:{airflow.port}/")
        link = page.get_by_role("link", name="gpuyard").first
        assert (link.get_attribute("href", timeout=WAIT_MS) or "").endswith("/plugin/gpuyard")
        follow(page, link)
        frame = page.frame_locator("iframe")
        frame.locator("section#queue").wait_for(timeout=WAIT_MS)  # no sign-in: Airflow's user, mapped
        frame.locator("svg.fleet rect.gpu").first.wait_for()
        assert "team a · member · Airflow user Anonymous" in frame.locator("header").inner_text()
        assert "over quota" in frame.locator(f'tr.job[data-job="{job}"]').inner_text()
        page.screenshot(path=str(artifacts / "airflow-gpuyard-page.png"), full_page=True)
        frame.locator(f'tr.job[data-job="{job}"] a').click()
        frame.locator("section#timeline").wait_for(timeout=WAIT_MS)
        shown = frame.locator("main").inner_text()
        assert job in shown and "waits: quota over quota" in shown  # the reason on the job's own page
        assert frame.locator("svg.timeline rect.wait").count() == 1  # queued since its submission
        page.screenshot(path=str(artifacts / "airflow-gpuyard-job.png"), full_page=True)
        frame.locator("a >> text=use a token").click()  # a token of one's own, inside Airflow's frame
        form = frame.locator("input[name=token]")
        form.wait_for(timeout=WAIT_MS)  # the sign-in page loaded (main read earlier was the job's page)
        assert "Signed in through Airflow as Anonymous" in frame.locator("main").inner_text()
        form.fill(gpuyard.token)
        frame.locator("button[type=submit]").click()
        frame.locator("a >> text=sign out").wait_for(timeout=WAIT_MS)
        assert "Airflow user" not in frame.locator("header").inner_text()
    finally:
        airflow.stop()
