"""A refusing HTTP proxy on loopback: the agents' ``HTTPS_PROXY``/``HTTP_PROXY`` point at it, so
whatever they try to reach besides the server under test (telemetry, update checks, plugin
catalogues) is noted and answered 403, and the check runs the same with or without a network."""

from __future__ import annotations

import asyncio
import threading
import time


class EgressSink:
    """Listens on a free loopback port in a thread of its own; ``attempts`` lists each refused
    request line (``CONNECT host:443 HTTP/1.1``, ``GET http://...``) with the label set then."""

    def __init__(self) -> None:
        self.label = ""
        self.attempts: list[tuple[str, str]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        """The proxy URL for ``HTTPS_PROXY``/``HTTP_PROXY``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EgressSink:
        """Start listening; returns once the port is bound."""
        threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),), daemon=True).start()
        if not self._ready.wait(30):
            raise RuntimeError("the egress sink did not start")
        return self

    def stop(self) -> None:
        """Stop listening."""
        self._loop.call_soon_threadsafe(self._stopping.set)

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._refuse, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopping.wait()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 5)).decode("latin-1").strip()
            if line:
                self.attempts.append((self.label, f"{time.strftime('%H:%M:%S')} {line[:200]}"))
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
