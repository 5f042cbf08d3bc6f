"""A TCP proxy between the components and a server, whose link a test degrades on demand.

Modes (`FaultProxy.set`):
- `pass`: bytes flow both ways as they come;
- `delay`: every chunk is forwarded `delay_s` after it arrived (latency; order kept);
- `blackhole`: connections stay open and new ones are accepted, but nothing is forwarded either
  way and nothing is closed: a silent partition, or a server that hangs;
- `cut`: every open connection is reset and new ones are refused, as when the server is down.

Back to `pass`, a black-holed connection delivers what it held (a partition shorter than TCP's
patience); a cut one stays gone. One asyncio loop in a daemon thread serves every proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, Literal

from servers import free_port

Mode = Literal["pass", "delay", "blackhole", "cut"]

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _shared_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="fault-proxy", daemon=True).start()
        return _loop


class FaultProxy:
    """`listen`: the address the link listens on (the fault suite's bridge, where components run in
    network namespaces of their own: tests/faults/network.py)."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        port: int | None = None,
        name: str = "",
        listen: str = "127.0.0.1",
    ):
        self.target = (target_host, target_port)
        self.listen = listen
        self.port = port or free_port(listen)
        self.name = name or f"proxy:{target_port}"
        self.mode: Mode = "pass"
        self.delay_s = 0.0
        self._loop = _shared_loop()
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None  # set unless black-holed
        self._links: set[_Link] = set()

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen, self.port)

    def start(self) -> FaultProxy:
        self._call(self._start())
        return self

    def set(self, mode: Mode, *, delay_s: float = 0.0) -> None:
        """Change the link's behaviour now, for open connections and new ones."""
        if mode == "delay" and delay_s <= 0:
            raise ValueError(f"{self.name}: delay needs delay_s > 0, got {delay_s}")
        self._call(self._set(mode, delay_s))

    def heal(self) -> None:
        self.set("pass")

    def stop(self) -> None:
        self._call(self._set("cut", 0.0))

    def connections(self) -> int:
        return len(self._links)

    # -- inside the loop ----------------------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _start(self) -> None:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, self.listen, self.port, reuse_address=True
            )

    async def _set(self, mode: Mode, delay_s: float) -> None:
        assert self._flowing is not None, f"{self.name}: start() it first"
        self.mode, self.delay_s = mode, delay_s if mode == "delay" else 0.0
        if mode == "blackhole":
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode == "cut":
            if self._server is not None:
                self._server.close()
                self._server = None
            for link in list(self._links):
                link.reset()
        else:
            await self._start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, writer)
        self._links.add(link)
        try:
            await link.run(reader)
        finally:
            self._links.discard(link)


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter):
        self.proxy, self.client = proxy, client
        self.upstream: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[Any] | None = None

    async def run(self, client_reader: asyncio.StreamReader) -> None:
        assert self.proxy._flowing is not None
        self.task = asyncio.current_task()
        try:
            await self.proxy._flowing.wait()  # a black hole accepts, then never connects upstream
            try:
                upstream_reader, self.upstream = await asyncio.open_connection(*self.proxy.target)
            except OSError:
                self.reset()
                return
            await asyncio.gather(
                self._pump(client_reader, self.upstream), self._pump(upstream_reader, self.client)
            )
        except asyncio.CancelledError:
            return  # reset() aborted both sides
        self.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward() -> None:
            assert self.proxy._flowing is not None
            while True:
                due, data = await chunks.get()
                if not data:
                    with contextlib.suppress(OSError):
                        sink.write_eof()
                    return
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self.proxy._flowing.wait()
                sink.write(data)
                await sink.drain()

        forwarding = asyncio.create_task(forward())
        try:
            while True:
                data = await source.read(65536)
                await chunks.put((loop.time() + self.proxy.delay_s, data))
                if not data:
                    break
            await forwarding
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            forwarding.cancel()

    def reset(self) -> None:
        """Abort both sides (an RST, not a FIN): what a client sees when the link is cut."""
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        for writer in (self.client, self.upstream):
            if writer is not None:
                with contextlib.suppress(OSError):
                    sock = writer.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.close()
