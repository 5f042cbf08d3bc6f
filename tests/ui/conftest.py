"""Fixtures of the browser tests: a live embedded gpuyard (the Airflow tests' `gpuyard up`), the
gpuyard page's app served on its own under the prefix Airflow mounts it at, and headless Chromium."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from servers import free_port, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))  # the Airflow tests' helpers
from stack import Gpuyard

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
PREFIX = "/gpuyard"  # as the plugin mounts it in Airflow's API server


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """Where the test's screenshots are kept (GPUYARD_TEST_ARTIFACTS, default .gpuyard/test-artifacts)."""
    root = Path(os.environ.get("GPUYARD_TEST_ARTIFACTS") or ROOT / ".gpuyard" / "test-artifacts")
    folder = root / "ui" / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"screenshots in {folder}")
    return folder


@pytest.fixture
def gpuyard(tmp_path: Path) -> Iterator[Gpuyard]:
    home = tmp_path / "gpuyard"
    home.mkdir()
    server = Gpuyard(home, slots=2)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def page_url(gpuyard: Gpuyard) -> Iterator[str]:
    from gpuyard_provider.ui.app import create_app

    root = FastAPI()
    root.mount(PREFIX, create_app(lambda: gpuyard.url, airflow_url="http://airflow.test"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(root, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, what="the page's server")
    try:
        yield f"http://127.0.0.1:{port}{PREFIX}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make install` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()
