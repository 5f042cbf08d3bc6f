"""Every request has an id: the caller's `X-Request-Id` when it is a plain token, else a new one. It is
returned in the response's `X-Request-Id` and written on every log line the request causes (`request_id`),
so a client's report, a proxy's log and the API's lines can be matched."""

from __future__ import annotations

import re
import uuid

from starlette.types import Message, Receive, Scope, Send

from gpuyard.api.asgi import HttpMiddleware, on_response_start
from gpuyard.observability import logs

HEADER = b"x-request-id"
_USABLE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


class RequestId(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = next((value for name, value in scope["headers"] if name == HEADER), b"")
        request_id = given.decode() if _USABLE.fullmatch(given) else uuid.uuid4().hex

        def tag(start: Message) -> None:
            start["headers"] = [*start.get("headers", ()), (HEADER, request_id.encode())]

        with logs.context(request_id=request_id):
            await self.app(scope, receive, on_response_start(send, tag))
