"""Every request has an id: the caller's `X-Request-Id` when it is a plain token, else a new one. It is
returned in the response's `X-Request-Id` and written on every log line the request causes (`request_id`),
so a client's report, a proxy's log and the API's lines can be matched."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.observability import logs

HEADER = b"x-request-id"
_USABLE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


class RequestId:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == HEADER), b"")
        request_id = given.decode() if _USABLE.fullmatch(given) else uuid.uuid4().hex

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (HEADER, request_id.encode())]
            await send(message)

        with logs.context(request_id=request_id):
            await self.app(scope, receive, answer)
