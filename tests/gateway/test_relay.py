"""The outside half of the harness relay: Unix socket to TCP, and nothing left running."""

from __future__ import annotations

import gc
import logging
import socket
import tempfile
import threading
from pathlib import Path

from callgrove.gateway.relay import UnixToTcp


def echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(connection,), daemon=True).start()

    def echo(connection: socket.socket) -> None:
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_the_relay_pipes_and_ends_the_connections_left_open(caplog):
    """A harness CLI that exits can leave a keep-alive connection open; stopping the relay
    ends it, instead of leaving a pending piping task that asyncio reports when collected."""
    server, port = echo_server()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "relay.sock")
        relay = UnixToTcp(path, "127.0.0.1", port)
        with caplog.at_level(logging.ERROR, logger="asyncio"), relay:
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)
            client.sendall(b"ping")
            assert client.recv(16) == b"ping"  # piped both ways; left open
        relay_thread = relay._thread
        del relay
        gc.collect()
        assert not relay_thread.is_alive()
        assert client.recv(16) == b""  # the relay closed its end
        client.close()
    server.close()
    assert [r.getMessage() for r in caplog.records] == []
