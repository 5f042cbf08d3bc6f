"""What the API's pure ASGI middlewares share: they act on HTTP requests only, and some watch the start
of the response (its status and headers) on its way out."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HttpMiddleware:
    """A pure ASGI middleware whose `handle` sees the HTTP requests; every other scope (lifespan,
    websocket) goes to the application untouched."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


def on_response_start(send: Send, see: Callable[[Message], None]) -> Send:
    """`send`, that first shows `see` the response's start message (which it may change)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            see(message)
        await send(message)

    return sending
