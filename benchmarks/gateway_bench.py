"""Gateway overhead per call against calling the upstream directly, and gateway throughput.

    python benchmarks/gateway_bench.py [--sampled-calls 15] [--calls 300]
        [--throughput-calls 3000] [--concurrency 64]

Every comparison sends the same chat request alternately to the upstream directly and through a
gateway process in front of it (which renders, relays the token prompt to `/v1/completions`,
parses, records and fdatasyncs), in the same run, and compares the median latencies:

1. 256 tokens really sampled (the primary figure for "under 10% of end-to-end latency"): the
   upstream is `serve-policy --model tiny` (the reference decoder) decoding greedily, every
   completion exactly 256 tokens (checked); the overhead is the difference of the two medians,
   and its share of the gateway's end-to-end median.
2. A scripted upstream (`serve-policy --script`, a fixed 256-token answer, no model): the end-to-
   end latency is almost all HTTP, which isolates the gateway's own cost per call (the "under
   2 ms median" figure). Its share of end-to-end is printed too, as a worst case.
3. Throughput: a gateway process whose policy is a no-op in-process client (a fixed 16-token
   sample), driven by `--concurrency` concurrent clients over 50 episodes of 4 agents; the figure
   is calls recorded (fdatasynced in the ledger) per second (target: at least 1,000).

Each target is printed with `met` or `MISSED`. The gateway process's CPU time per call and the
disk's fdatasync time are printed beside them: on a shared machine (the load average is printed
first) wall-clock figures mostly measure the wait for a core and for the disk, while CPU time
per call is what the gateway itself costs. The benchmark's own client is a bare keep-alive
HTTP/1.1 connection, so that it takes little of the cores the servers are measured on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

SRC = str(Path(__file__).resolve().parents[1] / "src")


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
        start_new_session=True,
    )
    while True:
        line = process.stdout.readline().decode()
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return process, match.group(1)
        if not line and process.poll() is not None:
            raise RuntimeError(process.stderr.read().decode()[-2000:])


def cpu_seconds(process: subprocess.Popen) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(10)


def cli(*args: str) -> list[str]:
    return ["-c", "from callgrove.cli import main; main()", *args, "--port", "0"]


class Connection:
    """A keep-alive HTTP/1.1 client connection that costs next to nothing per request, so the
    benchmark's own client does not take the cores the servers are measured on."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, f"{host}:{port}")

    async def post(self, path: str, body: dict, headers: dict[str, str] | None = None) -> dict:
        data = orjson.dumps(body)
        head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n{head}\r\n".encode()
            + data
        )
        status_line, *lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length:")
        )
        payload = await self.reader.readexactly(length)
        if status_line.split()[1] != b"200":
            raise RuntimeError(f"{path}: {status_line.decode()} {payload[:300]!r}")
        return orjson.loads(payload)

    def close(self) -> None:
        self.writer.close()


CHAT_256 = {
    "messages": [{"role": "user", "content": "write 255 bytes"}],
    "max_tokens": 256,
    "temperature": 0.0,
}


async def overhead(direct: str, gateway: str, calls: int, warmup: int) -> dict[str, float]:
    """Median latency of the same 256-token chat request direct and through the gateway,
    alternating (so both see the same machine), after `warmup` calls each way."""
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    connections = {
        "direct": await Connection.open(direct),
        "gateway": await Connection.open(gateway),
    }
    for index in range(calls + warmup):
        for name, prefix in (("direct", ""), ("gateway", f"/e/bench-{index % 20}")):
            started = time.perf_counter()
            answer = await connections[name].post(f"{prefix}/v1/chat/completions", CHAT_256)
            elapsed = time.perf_counter() - started
            assert answer["usage"]["completion_tokens"] == 256, answer["usage"]
            if index >= warmup:
                times[name].append(elapsed)
    for connection in connections.values():
        connection.close()
    direct_ms = statistics.median(times["direct"]) * 1000
    gateway_ms = statistics.median(times["gateway"]) * 1000
    return {"direct_ms": direct_ms, "gateway_ms": gateway_ms, "overhead_ms": gateway_ms - direct_ms}


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def compare(upstream_args: list[str], folder: str, calls: int, warmup: int) -> dict[str, float]:
    """Start the upstream and a gateway in front of it, time both ways, stop both."""
    upstream, upstream_url = start(cli(*upstream_args))
    gateway, gateway_url = start(
        cli("gateway", "--upstream", upstream_url, "--ledger", tempfile.mkdtemp(dir=folder))
    )
    try:
        before = cpu_seconds(gateway)
        figures = asyncio.run(overhead(upstream_url, gateway_url, calls, warmup))
        figures["cpu_ms"] = (cpu_seconds(gateway) - before) / (calls + warmup) * 1000
    finally:
        stop(gateway)
        stop(upstream)
    figures["share"] = figures["overhead_ms"] / figures["gateway_ms"]
    return figures


def report(figures: dict[str, float]) -> None:
    print(f"  direct to serve-policy : {figures['direct_ms']:,.2f} ms")
    print(f"  through the gateway    : {figures['gateway_ms']:,.2f} ms")
    print(f"  gateway CPU per call   : {figures['cpu_ms']:.2f} ms (user + system)")


async def throughput(gateway: str, calls: int, concurrency: int) -> float:
    counter = iter(range(calls))

    async def worker(connection: Connection) -> None:
        for index in counter:
            headers = {"x-callgrove-agent": f"a{index % 4}"}
            body = {"messages": [{"role": "user", "content": f"call {index}"}]}
            await connection.post(f"/e/tp-{index % 50}/v1/chat/completions", body, headers)

    connections = [await Connection.open(gateway) for _ in range(concurrency)]
    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return calls / elapsed


def fsync_ms(folder: str, samples: int = 50) -> float:
    """Median time to append a ledger-sized line and make it durable: the disk's share of a call."""
    path = Path(folder, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    times = []
    try:
        for _ in range(samples):
            started = time.perf_counter()
            os.write(fd, b"x" * 4000 + b"\n")
            os.fdatasync(fd)  # as the ledger does
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1000


def serve_noop(ledger: str) -> None:
    """A gateway whose policy answers every prompt with the same 16 tokens, instantly."""
    sys.path.insert(0, SRC)
    from callgrove.chat import BuiltinFormat
    from callgrove.gateway.core import Gateway
    from callgrove.gateway.routes import Routes
    from callgrove.policy import Completion
    from callgrove.serving.web import serve

    chat = BuiltinFormat()
    completion = np.concatenate(
        [chat.encode("fifteen bytes.."), np.asarray(chat.stop_token_ids, dtype=np.int32)]
    )

    class NoOp:
        version = 0

        async def sample(self, prompt_ids, params):
            return Completion(completion, np.full(len(completion), -0.1), 0, "stop")

    def ready(port: int) -> None:
        print(f"gateway listening on http://127.0.0.1:{port}", flush=True)

    serve(Routes(Gateway(NoOp(), chat, ledger)).app(), "127.0.0.1", 0, ready)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sampled-calls", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--throughput-calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--serve-noop", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_noop:
        serve_noop(args.serve_noop)
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as folder:
        print(
            f"disk: append + fdatasync of one ledger line, median {fsync_ms(folder):.2f} ms "
            "(inside every call's overhead: the reply waits for it)"
        )
        sampled = compare(["serve-policy", "--model", "tiny"], folder, args.sampled_calls, 2)
        print(
            f"256 tokens sampled greedily by the reference decoder (serve-policy --model tiny), "
            f"{args.sampled_calls} calls each way, alternating (median latency)"
        )
        report(sampled)
        print(
            f"  gateway overhead       : {sampled['overhead_ms']:,.2f} ms = "
            f"{sampled['share']:.2%} of end-to-end (target < 10%: "
            f"{verdict(sampled['share'] < 0.10)})"
        )
        script = Path(folder) / "script.json"
        script.write_text(orjson.dumps({"rules": [], "default": "x" * 255}).decode())
        scripted = compare(["serve-policy", "--script", str(script)], folder, args.calls, 10)
        print(
            f"256-token answers of a scripted upstream (serve-policy --script, no model), "
            f"{args.calls} calls each way, alternating (median latency)"
        )
        report(scripted)
        print(
            f"  gateway overhead       : {scripted['overhead_ms']:.2f} ms (target < 2 ms: "
            f"{verdict(scripted['overhead_ms'] < 2.0)}); {scripted['share']:.0%} of this "
            "end-to-end, almost all HTTP (a worst case, not the 10% figure)"
        )
        noop, noop_url = start([__file__, "--serve-noop", f"{folder}/noop-ledger"])
        try:
            before = cpu_seconds(noop)
            rate = asyncio.run(throughput(noop_url, args.throughput_calls, args.concurrency))
            noop_cpu = cpu_seconds(noop) - before
        finally:
            stop(noop)
        lines = sum(
            1 for p in Path(folder, "noop-ledger").glob("*.calls.jsonl") for _ in p.open("rb")
        )
        assert lines == args.throughput_calls, (
            f"{lines} ledger lines for {args.throughput_calls} calls"
        )
        print(
            f"no-op upstream, {args.throughput_calls} calls, {args.concurrency} concurrent clients"
        )
        print(
            f"  calls recorded per second: {rate:,.0f} (target >= 1,000: {verdict(rate >= 1000)})"
        )
        print(
            f"  calls per CPU-second of the gateway: {args.throughput_calls / noop_cpu:,.0f} "
            "(what one uncontended core would record)"
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
