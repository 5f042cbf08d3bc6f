"""The gpuyard page inside a running Airflow: the plugin mounts the app in Airflow's API server and the
UI's navigation shows it; a person signs in inside Airflow's frame and sees the queue and the fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from stack import AirflowStack, Gpuyard

WAIT_MS = 30_000

pytestmark = pytest.mark.slow


def test_the_page_is_in_airflows_navigation(
    gpuyard: Gpuyard, browser: Any, artifacts: Path, tmp_path: Path
) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    connection = json.dumps({"conn_type": "gpuyard", "host": gpuyard.url})
    airflow = AirflowStack(home, tmp_path / "no-dags", AIRFLOW_CONN_GPUYARD_DEFAULT=connection)
    airflow.COMPONENTS = ("api-server",)  # the UI and the plugin's app: nothing else is needed
    (tmp_path / "no-dags").mkdir()
    try:
        airflow.start()
        plugins = airflow.api.get("/plugins").json()["plugins"]
        gpuyard_plugin = next(p for p in plugins if p["name"] == "gpuyard")
        assert [v["url_route"] for v in gpuyard_plugin["external_views"]] == ["gpuyard"]
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.goto(f"http://127.0.0.1:{airflow.port}/")
        page.get_by_role("link", name="gpuyard").first.click(timeout=WAIT_MS)
        page.wait_for_url("**/plugin/gpuyard", timeout=WAIT_MS)
        frame = page.frame_locator("iframe")
        frame.locator("input[name=token]").fill(gpuyard.token, timeout=WAIT_MS)
        frame.locator("button[type=submit]").click()
        frame.locator("section#queue").wait_for(timeout=WAIT_MS)
        frame.locator("svg.fleet rect.gpu").first.wait_for()
        assert "team a" in frame.locator("header").inner_text()
        page.screenshot(path=str(artifacts / "airflow-gpuyard-page.png"), full_page=True)
    finally:
        airflow.stop()
