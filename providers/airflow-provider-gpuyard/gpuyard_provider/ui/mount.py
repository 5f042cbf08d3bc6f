"""What the plugin hands Airflow's API server: an ASGI app that builds the gpuyard page's FastAPI app
on its first request. Airflow imports its plugins in every process (the scheduler, each task), and
only the API server serves the page: the others never pay for importing it."""

from __future__ import annotations

from typing import Any


class PageApp:
    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from gpuyard_provider.ui.app import plugin_app

            self._app = plugin_app()
        await self._app(scope, receive, send)

    def __repr__(self) -> str:
        return "gpuyard_provider.ui.app:plugin_app (built on its first request)"
