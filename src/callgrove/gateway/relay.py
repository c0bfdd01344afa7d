"""Byte relays that carry a harness's HTTP out of a loopback-only network namespace.

A harness CLI runs in a namespace of its own with only a loopback interface: it can reach
nothing, not even the host's loopback. Its loopback port is relayed to a Unix socket (file
system paths cross network namespaces), and outside, the Unix socket to the gateway's TCP
address. Nothing else leaves the namespace.

`python -m callgrove.gateway.relay PORT SOCKET` runs the inside half.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Awaitable, Callable

from callgrove.errors import StateError


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.close()


def _joiner(
    connect: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await connect()
        except OSError:
            writer.close()
            return
        # A relay that stops cancels its connections: each pipe closes its writer and the
        # connection ends there (a cancelled handler would be reported by asyncio's server).
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))

    return handle


async def tcp_to_unix(port: int, path: str) -> None:
    """Serve 127.0.0.1:PORT, each connection piped to the Unix socket PATH (inside half)."""
    server = await asyncio.start_server(
        _joiner(lambda: asyncio.open_unix_connection(path)), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()


class UnixToTcp:
    """The outside half, in a thread of its own: Unix socket PATH piped to HOST:PORT."""

    def __init__(self, path: str, host: str, port: int):
        self.path, self.host, self.port = path, host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_unix_server(
                _joiner(lambda: asyncio.open_connection(self.host, self.port)), self.path
            )
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def __enter__(self) -> UnixToTcp:
        self._thread.start()
        if not self._ready.wait(10):
            raise StateError(f"relay on {self.path} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        stopped = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
        with contextlib.suppress(TimeoutError):
            stopped.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _stop(self) -> None:
        """Stop serving and end the connections still open (a CLI that exits may leave its
        keep-alive connections behind), so no piping task outlives the relay."""
        self._server.close()
        open_ = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in open_:
            task.cancel()
        await asyncio.gather(*open_, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(tcp_to_unix(int(sys.argv[1]), sys.argv[2]))
