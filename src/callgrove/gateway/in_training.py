"""A gateway inside a training process, sampling from the policy being trained.

A harness run by the training loop must call the policy the loop trains, rendered with that
policy's tokenizer and chat template: only then are its calls on-policy and their token ids the
learner's. `LocalGateway` serves a `Gateway` on loopback from a thread of its own (an event
loop of its own: the harness CLI's requests never wait on the loop's work but for sampling),
and hands each call's sampling to the loop's policy client on the loop's event loop
(`LoopPolicy`), where concurrent calls batch with the loop's own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from callgrove.chat import ChatFormat
from callgrove.errors import StateError
from callgrove.gateway.core import Gateway
from callgrove.gateway.routes import Routes
from callgrove.policy import PolicyClient, SamplingParams
from callgrove.policy.threads import LoopPolicy
from callgrove.serving.web import bind, server


class LocalGateway:
    """A `Gateway` over `policy` (a client of `loop`) served on 127.0.0.1 from a thread."""

    def __init__(
        self,
        policy: PolicyClient,
        loop: asyncio.AbstractEventLoop,
        chat: ChatFormat,
        ledger: str | Path,
        *,
        sampling: SamplingParams | None = None,
        startup_timeout: float = 30.0,
    ):
        self.policy = policy
        self.gateway = Gateway(LoopPolicy(policy, loop), chat, ledger, sampling=sampling)
        self.gateway.episodes.recover()
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = server(Routes(self.gateway).app())
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="callgrove-gateway",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise StateError(f"the in-process gateway did not start on {self.url}")
            time.sleep(0.01)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self.gateway.episodes.release()

    def __enter__(self) -> LocalGateway:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
