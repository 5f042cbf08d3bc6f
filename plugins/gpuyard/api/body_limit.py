"""Refuses request bodies over the limit (413) before anything reads or parses them."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.api.asgi import HttpMiddleware
from gpuyard.api.problems import Problem, problem_response


class BodyLimit(HttpMiddleware):
    def __init__(self, app: ASGIApp, max_bytes: int):
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        received = 0
        refused = False

        async def counting_receive() -> Message:
            # A chunked body has no Content-Length: count it as it streams, answer 413 as soon as it
            # is over, and tell the application the client went away so it stops reading.
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    await self._refuse(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:  # the 413 is already out; drop whatever the application says next
                await send(message)

        await self.app(scope, counting_receive, guarded_send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = Problem(
            413,
            "Payload Too Large",
            f"request body is over the limit of {self.max_bytes} bytes",
            kind="/problems/body-too-large",
        )
        response: Any = problem_response(problem, scope.get("path"))
        await response(scope, receive, send)
