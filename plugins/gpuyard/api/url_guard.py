"""Refuses a URL holding a NUL character (422) before any route reads it: PostgreSQL text cannot hold
one, so a path or query parameter with `%00` would otherwise reach the database and fail there (500)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import Receive, Scope, Send

from gpuyard.api.asgi import HttpMiddleware
from gpuyard.api.problems import Problem, problem_response


class RefuseNulInUrl(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        where = None
        if "\x00" in scope["path"]:
            where = "path"
        elif b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
            where = "query"
        if where is not None:
            problem = Problem(
                422,
                "Invalid request",
                f"{where}: NUL characters (%00) are not allowed",
                kind="/problems/invalid",
                errors=[{"path": where, "rule": "NUL characters (%00) are not allowed"}],
            )
            response: Any = problem_response(problem, None)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
