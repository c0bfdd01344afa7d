"""Inputs that can be read only once (a pipe, `/dev/stdin`, `-`, a process substitution's
`/dev/fd/N`, a FIFO) read exactly once and whole, by every reading command and in every form
that can come through a pipe; a FIFO that no writer opens is a bounded wait, said on stderr."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app
from callgrove.formats.problems import Diagnostics

ROOT = Path(__file__).parents[2]
GROUP = ROOT / "examples/login_group.jsonl"
VERIFIERS = ROOT / "examples/verifiers/traces.jsonl"
runner = CliRunner()
COMMANDS = ["rows", "check", "stats", "show", "samples", "convert"]


def run(*args: object, **options):
    return runner.invoke(app, [str(a) for a in args], **options)


@contextlib.contextmanager
def piped(data: bytes) -> Iterator[str]:
    """A real pipe fed `data` by a thread, named as a process substitution names it."""
    read, write = os.pipe()

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), os.fdopen(write, "wb") as stream:
            stream.write(data)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        yield f"/dev/fd/{read}"
    finally:
        os.close(read)
        feeder.join(10)


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """Episodes over many pipe buffers, reader blocks and the head read to tell the form."""
    path = tmp_path_factory.mktemp("large") / "large.jsonl"
    lines = GROUP.read_bytes().splitlines()
    with path.open("wb") as out:
        for number in range(60):
            for line in lines:
                out.write(line.replace(b'"id":"login-bug-', f'"id":"c{number}-'.encode(), 1))
                out.write(b"\n")
    assert path.stat().st_size > 16 * 65536
    return path


def outputs(command: str, source: object, tmp_path: Path, tag: str) -> tuple[int, bytes]:
    """What `command` gives for `source`: its exit and stdout, or the file it writes."""
    written = tmp_path / f"{tag}-{command}.jsonl"
    extra = {
        "samples": ["-o", written, "--algorithm", "grpo"],
        "convert": [written],
        "rows": ["--json"],
        "show": ["--json"],
        "stats": ["--json"],
        "check": ["--json"],
    }[command]
    result = run(command, source, *extra)
    assert result.exit_code == 0, result.output
    return result.exit_code, written.read_bytes() if written.exists() else result.stdout_bytes


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_reading_command_reads_a_pipe_as_it_reads_the_file(command, size, large, tmp_path):
    path = GROUP if size == "small" else large
    from_file = outputs(command, path, tmp_path, "file")
    with piped(path.read_bytes()) as pipe:
        assert outputs(command, pipe, tmp_path, "pipe") == from_file
    if command in ("check", "stats", "rows"):
        assert len(from_file[1]) > 100  # the comparison compared episodes, not two blanks


def test_dash_reads_standard_input(tmp_path):
    result = run("check", "--json", "-", input=GROUP.read_bytes())
    assert result.exit_code == 0, result.output
    assert result.stdout == run("check", "--json", GROUP).stdout
    assert b'"login-bug-g3"' in result.stdout_bytes


@pytest.mark.parametrize("form", ["x.jsonl.gz", "x.jsonl.zst", "x.parquet", "x.arrow", "verifiers"])
def test_compressed_binary_and_foreign_forms_come_through_a_pipe(form, tmp_path):
    if form == "verifiers":
        path = VERIFIERS
    else:
        path = tmp_path / form
        cg.save(path, cg.load(GROUP))
    expected = run("check", "--json", GROUP).stdout
    with piped(path.read_bytes()) as pipe:
        result = run("check", "--json", pipe)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected


def test_a_gym_capture_comes_through_a_pipe(tmp_path):
    capture = ROOT / "examples/gym/login-bug-g2.tokens.jsonl"
    expected = run("check", "--json", capture)
    assert b'"login-bug-g2"' in expected.stdout_bytes
    with piped(capture.read_bytes()) as pipe:
        result = run("check", "--json", pipe)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.stdout


def test_a_named_fifo_keeps_its_form_by_name(tmp_path):
    packed = tmp_path / "packed.jsonl.gz"
    cg.save(packed, cg.load(GROUP))
    fifo = tmp_path / "feed.jsonl.gz"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(packed.read_bytes()), daemon=True)
    writer.start()
    result = run("stats", "--json", fifo)
    writer.join(10)
    assert result.exit_code == 0, result.output
    assert result.stdout == run("stats", "--json", GROUP).stdout


def test_problems_in_a_pipe_name_the_pipe_and_line(tmp_path):
    lines = GROUP.read_bytes().splitlines()
    data = b"\n".join([lines[0], b'{"format": "callgrove.episode/1", "id": "x", oops', *lines[1:]])
    with piped(data + b"\n") as pipe:
        result = run("check", pipe)
    assert result.exit_code == 1
    assert f"error: {pipe}:2: episode x: not valid JSON" in result.stderr
    assert "callgrove-inputs" not in result.output  # never the temporary copy's name
    with piped(data + b"\n") as pipe:
        stopped = run("stats", pipe)
    assert stopped.exit_code == 1
    assert f"stopped at the first unusable line ({pipe}:2)" in stopped.stderr
    assert "callgrove-inputs" not in stopped.output


def test_the_python_reader_reads_a_pipe_whole():
    with piped(GROUP.read_bytes()) as pipe:
        diagnostics = Diagnostics()
        ids = [episode.id for episode in cg.load(pipe, diagnostics)]
    assert ids == [f"login-bug-g{i}" for i in range(4)] and not diagnostics.problems


def test_a_fifo_whose_writer_comes_late_is_read_whole(tmp_path, monkeypatch):
    from callgrove.formats import streams

    fifo = tmp_path / "late.jsonl"
    os.mkfifo(fifo)
    told = threading.Event()  # the reader said it is waiting for a writer
    open_fifo = streams._open_fifo

    def telling(name, waiting):
        def said(message: str) -> None:
            waiting(message)
            told.set()

        return open_fifo(name, said)

    monkeypatch.setattr(streams, "_open_fifo", telling)

    def write_late() -> None:
        told.wait(streams.FIFO_WAIT_S / 2)  # bounded: a reader that never says so fails below
        fifo.write_bytes(GROUP.read_bytes())

    writer = threading.Thread(target=write_late, daemon=True)
    writer.start()
    result = run("check", "--json", fifo)
    writer.join(10)
    assert result.exit_code == 0, result.output
    assert result.stdout == run("check", "--json", GROUP).stdout
    assert f"{fifo}: a FIFO with no writer yet; waiting up to" in result.stderr


def test_a_fifo_no_writer_opens_is_a_bounded_wait(tmp_path, monkeypatch):
    from callgrove.formats import streams

    monkeypatch.setattr(streams, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "nobody.jsonl"
    os.mkfifo(fifo)
    for command in COMMANDS:
        extra = {"samples": ["-o", tmp_path / "s.jsonl"], "convert": [tmp_path / "c.jsonl"]}
        started = time.monotonic()
        result = run(command, fifo, *extra.get(command, []))
        assert time.monotonic() - started < 8
        assert result.exit_code == 1, (command, result.output)
        assert f"error: {fifo}: no writer opened this FIFO within 0.3 s" in result.stderr
    # The FIFO is left as found: a writer that comes now is read whole.
    writer = threading.Thread(target=lambda: fifo.write_bytes(GROUP.read_bytes()), daemon=True)
    writer.start()
    assert len(list(cg.load(fifo))) == 4
    writer.join(10)


@pytest.mark.processes
def test_cat_into_dev_stdin_and_a_sharded_read(tmp_path, large):
    """As a shell runs it: `cat FILE | callgrove stats --json -j 2 /dev/stdin`, whose shards
    run in other processes, which cannot read this one's standard input."""
    callgrove = str(Path(sys.executable).with_name("callgrove"))
    command = [callgrove, "stats", "--json", "-j", "2", "/dev/stdin"]
    with large.open("rb") as data:
        cat = subprocess.Popen(["cat"], stdin=data, stdout=subprocess.PIPE)
        piped_result = subprocess.run(
            command, stdin=cat.stdout, capture_output=True, timeout=120, check=False
        )
        cat.wait(10)
    from_file = subprocess.run(
        [*command[:-1], str(large)], capture_output=True, timeout=120, check=False
    )
    assert piped_result.returncode == 0, piped_result.stderr
    assert piped_result.stdout == from_file.stdout and b'"episodes":240' in from_file.stdout
