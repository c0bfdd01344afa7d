"""The ledger and the close under faults: a full disk, a failed fsync, a close racing calls, a
crash inside a close, damaged files, a second gateway, and many episodes through one gateway."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import os
import tracemalloc

import numpy as np
import pytest

from callgrove.episode import read_episodes
from callgrove.gateway import episodes as gateway_episodes
from callgrove.gateway import ledger as gateway_ledger
from callgrove.gateway.ledger import CALLS_SUFFIX, EPISODES_FILE, QUARANTINE, LedgerInUse
from callgrove.policy import Completion

from .helpers import gateway_client, scripted, write_script

BODY = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture
def script(tmp_path):
    return write_script(tmp_path / "s.json", [{"when": "hi", "reply": "hello"}])


def lines(path):
    return [json.loads(text) for text in path.read_text().splitlines()]


def stored(ledger):
    path = ledger / EPISODES_FILE
    return list(read_episodes(path)) if path.exists() else []


def test_a_call_whose_line_is_cut_by_a_full_disk_is_not_in_the_episode(
    tmp_path, script, monkeypatch
):
    ledger = tmp_path / "ledger"
    real_write = gateway_ledger._write_all
    full = {"now": False}

    def write_all(fd, data):
        if full["now"]:
            real_write(fd, data[: len(data) // 2])  # half the line reaches the disk
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(fd, data)

    monkeypatch.setattr(gateway_ledger, "_write_all", write_all)

    async def go():
        _, client = gateway_client(scripted(script), ledger)
        async with client:
            first = await client.post("/e/ep/v1/messages", json=BODY)
            full["now"] = True
            second = await client.post("/e/ep/v1/messages", json=BODY)
            full["now"] = False
            return first, second

    with pytest.warns(UserWarning, match="could not be recorded"):
        first, second = run(go())
    assert first.status_code == 200
    assert second.status_code == 500 and "No space left" in second.json()["error"]["message"]
    data = (ledger / f"ep{CALLS_SUFFIX}").read_bytes()
    assert data.endswith(b"\n") and len(lines(ledger / f"ep{CALLS_SUFFIX}")) == 1  # no cut line

    async def restarted():
        gateway, client = gateway_client(scripted(script), ledger)
        assert gateway.episodes.recover() == 1
        async with client:
            return (await client.post("/e/ep/close", json={})).json()

    record = run(restarted())
    assert [c["id"] for a in record["agents"] for c in a["calls"]] == ["c1"]


def test_a_call_whose_fsync_fails_is_answered_as_failed_and_stays_out(
    tmp_path, script, monkeypatch
):
    ledger = tmp_path / "ledger"
    failing = {"now": False}
    real = os.fdatasync

    def fdatasync(fd):
        if failing["now"]:
            failing["now"] = False
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(gateway_ledger.os, "fdatasync", fdatasync)

    async def go():
        _, client = gateway_client(scripted(script), ledger)
        async with client:
            await client.post("/e/ep/v1/messages", json=BODY)
            failing["now"] = True
            failed = await client.post("/e/ep/v1/messages", json=BODY)
            return failed

    failed = run(go())
    assert failed.status_code == 500 and "durable" in failed.json()["error"]["message"]

    async def restarted():
        gateway, client = gateway_client(scripted(script), ledger)
        gateway.episodes.recover()
        async with client:
            return (await client.post("/e/ep/close", json={})).json()

    record = run(restarted())  # its line is on disk, revoked by the line after it
    assert [c["id"] for a in record["agents"] for c in a["calls"]] == ["c1"]


class Gated:
    """A policy whose calls wait until the test opens the gate."""

    def __init__(self, inner):
        self.inner = inner
        self.gate = asyncio.Event()
        self.waiting = 0

    async def sample(self, prompt_ids, params):
        self.waiting += 1
        await self.gate.wait()
        return await self.inner.sample(prompt_ids, params)


@pytest.mark.parametrize("wait", [5.0, 0.05])
def test_close_waits_for_calls_in_flight_or_refuses_them(tmp_path, script, wait):
    ledger = tmp_path / "ledger"

    async def go():
        policy = Gated(scripted(script))
        gateway, client = gateway_client(policy, ledger, close_wait=wait)
        async with client:
            policy.gate.set()
            await client.post("/e/ep/v1/messages", json=BODY)
            policy.gate.clear()
            late = asyncio.create_task(client.post("/e/ep/v1/messages", json=BODY))
            while policy.waiting < 2:
                await asyncio.sleep(0.01)
            state = gateway.episodes.open["ep"]
            closing = asyncio.create_task(client.post("/e/ep/close", json={}))
            while not (state.closing or state.closed):  # the close is waiting
                await asyncio.sleep(0.01)
            if wait < 1:
                await closing  # a short wait: the close ends while the call still samples
            newer = await client.post("/e/ep/v1/messages", json=BODY)
            policy.gate.set()
            return await late, (await closing).json(), newer

    late, record, newer = run(go())
    calls = [c["id"] for a in record["agents"] for c in a["calls"]]
    assert newer.status_code == 400  # no new call once a close has begun
    if wait > 1:
        assert late.status_code == 200 and calls == ["c1", "c2"]
    else:
        assert late.status_code == 400 and "in flight" in late.json()["error"]["message"]
        assert calls == ["c1"]
    assert "closed" in lines(ledger / f"ep{CALLS_SUFFIX}")[-1]  # nothing after the marker
    assert len(stored(ledger)) == 1


class Crash(BaseException):
    """The process dies here."""


@pytest.mark.parametrize("where", ["before the record", "after the record"])
def test_a_close_cut_by_a_crash_is_finished_once(tmp_path, script, monkeypatch, where):
    ledger = tmp_path / "ledger"
    real_append = gateway_episodes.append_episode

    def append_then_crash(folder, episode):
        if where == "after the record":
            real_append(folder, episode)
        raise Crash

    async def crashing():
        gateway, client = gateway_client(scripted(script), ledger)
        async with client:
            await client.post("/e/ep/v1/messages", json=BODY)
            monkeypatch.setattr(gateway_episodes, "append_episode", append_then_crash)
            with pytest.raises(Crash):
                await gateway.episodes.close("ep", {"rewards": {"r": 1.0}})
            monkeypatch.setattr(gateway_episodes, "append_episode", real_append)

    run(crashing())

    async def restarted():
        gateway, client = gateway_client(scripted(script), ledger)
        assert gateway.episodes.recover() == 0  # the cut close was finished: nothing is open
        async with client:
            again = await client.post("/e/ep/close", json={"rewards": {"r": 1.0}})
            other = await client.post("/e/ep/close", json={"rewards": {"r": 0.0}})
            late = await client.post("/e/ep/v1/messages", json=BODY)
            return again, other, late

    again, other, late = run(restarted())
    episodes = stored(ledger)
    assert [e.id for e in episodes] == ["ep"] and episodes[0].rewards == {"r": 1.0}
    assert again.status_code == 200 and again.json()["rewards"] == {"r": 1.0}
    assert other.status_code == 409 and late.status_code == 400


def test_closing_an_unknown_episode_is_refused_and_creates_nothing(tmp_path, script):
    ledger = tmp_path / "ledger"

    async def go():
        _, client = gateway_client(scripted(script), ledger)
        async with client:
            return await client.post("/e/never-called/close", json={"rewards": {"r": 1.0}})

    response = run(go())
    assert response.status_code == 404 and "never-called" in response.json()["error"]["message"]
    assert sorted(p.name for p in ledger.iterdir() if not p.name.startswith(".")) == []


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"ok": "yes"}, "$.ok"),
        ({"run": "r1"}, "$.run"),
        ({"run": {"type": "sideways"}}, "run.type"),
        ({"run": {"step": "3"}}, "$.run.step"),
        ({"run": {"step": 2**70}}, "run.step"),
        ({"group": 5}, "$.group"),
        ({"rewards": {"r": True}}, "$.rewards"),
        ({"rewards": [1.0]}, "$.rewards"),
        ({"reward": {"r": 1.0}}, "reward"),
    ],
)
def test_the_close_body_is_checked_against_the_episode_format(tmp_path, script, body, named):
    ledger = tmp_path / "ledger"

    async def go():
        _, client = gateway_client(scripted(script), ledger)
        async with client:
            await client.post("/e/ep/v1/messages", json=BODY)
            refused = await client.post("/e/ep/close", json=body)
            closed = await client.post("/e/ep/close", json={"run": {"type": "eval", "step": 3}})
            return refused, closed

    refused, closed = run(go())
    assert refused.status_code == 400 and named in refused.json()["error"]["message"]
    assert closed.status_code == 200  # the refused close left the episode open
    (episode,) = stored(ledger)
    assert (episode.run.type, episode.run.step) == ("eval", 3)


@pytest.mark.parametrize("parent", ["nobody", "solver"])
def test_a_parent_that_names_no_agent_or_the_agent_itself_is_refused(tmp_path, script, parent):
    async def go():
        _, client = gateway_client(scripted(script), tmp_path / "ledger")
        async with client:
            await client.post("/e/ep/v1/messages", json=BODY, headers={"x-callgrove-agent": "lead"})
            headers = {"x-callgrove-agent": "solver", "x-callgrove-parent": parent}
            refused = await client.post("/e/ep/v1/messages", json=BODY, headers=headers)
            good = {"x-callgrove-agent": "solver", "x-callgrove-parent": "lead"}
            accepted = await client.post("/e/ep/v1/messages", json=BODY, headers=good)
            return refused, accepted, await client.post("/e/ep/close", json={})

    refused, accepted, closed = run(go())
    assert refused.status_code == 400 and repr(parent) in refused.json()["error"]["message"]
    assert accepted.status_code == 200
    assert [(a["id"], a["parent"]) for a in closed.json()["agents"]] == [
        ("lead", None),
        ("solver", "lead"),
    ]


def test_one_ledger_folder_has_one_gateway(tmp_path, script):
    ledger = tmp_path / "ledger"
    first, _ = gateway_client(scripted(script), ledger)
    with pytest.raises(LedgerInUse, match="another gateway"):
        gateway_client(scripted(script), ledger)
    first.episodes.release()
    second, _ = gateway_client(scripted(script), ledger)  # free again once released
    second.episodes.release()


def test_damaged_ledger_files_are_quarantined_and_the_others_serve(tmp_path, script):
    ledger = tmp_path / "ledger"

    async def calls(*episodes):
        _, client = gateway_client(scripted(script), ledger)
        async with client:
            for episode in episodes:
                await client.post(f"/e/{episode}/v1/messages", json=BODY)
                await client.post(f"/e/{episode}/v1/messages", json=BODY)

    run(calls("good", "midline", "noagent", "noref"))

    def without_agent(line):
        del line["agent"]

    def naming_no_call(line):
        line.update(prompt_from="c7", prompt_from_len=3, prompt_suffix_ids=line.pop("prompt_ids"))

    for episode, change in {"noagent": without_agent, "noref": naming_no_call}.items():
        path = ledger / f"{episode}{CALLS_SUFFIX}"
        first, second = lines(path)
        change(second)
        path.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    midline = ledger / f"midline{CALLS_SUFFIX}"
    midline.write_text(midline.read_text().replace("\n", "\n{oops\n", 1))
    (ledger / f"random{CALLS_SUFFIX}").write_bytes(bytes(range(256)) * 4)
    (ledger / "notes.txt").write_text("a stray file")

    async def restarted():
        gateway, client = gateway_client(scripted(script), ledger)
        with pytest.warns(UserWarning) as warned:
            open_count = gateway.episodes.recover()
        async with client:
            refused = await client.post("/e/noref/v1/messages", json=BODY)
            served = await client.post("/e/good/v1/messages", json=BODY)
            closed = await client.post("/e/good/close", json={})
        return gateway, open_count, warned, refused, served, closed

    gateway, open_count, warned, refused, served, closed = run(restarted())
    assert open_count == 1
    assert sorted(gateway.episodes.quarantined) == ["midline", "noagent", "noref", "random"]
    assert "midline.calls.jsonl:2: not valid JSON" in gateway.episodes.quarantined["midline"]
    assert "missing required field `agent`" in gateway.episodes.quarantined["noagent"]
    assert "prompt_from names 'c7'" in gateway.episodes.quarantined["noref"]
    assert gateway.episodes.strays == ["notes.txt"]
    said = " ".join(str(w.message) for w in warned)
    assert all(f"episode {name!r} quarantined" in said for name in gateway.episodes.quarantined)
    assert "notes.txt: not an episode's ledger file" in said
    for episode in gateway.episodes.quarantined:
        assert (ledger / QUARANTINE / f"{episode}{CALLS_SUFFIX}").exists()
        assert (ledger / QUARANTINE / f"{episode}{CALLS_SUFFIX}.reason").read_text().strip()
    assert refused.status_code == 400 and "quarantined" in refused.json()["error"]["message"]
    assert served.status_code == 200 and closed.status_code == 200
    assert len(closed.json()["agents"][0]["calls"]) == 3


def held_by_the_gateway() -> int:
    """Bytes alive that the gateway's code allocated (the test client's caches left out)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*callgrove/gateway/*", all_frames=True)]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_closed_episodes_release_their_files_and_calls(tmp_path, script):
    ledger = tmp_path / "ledger"

    async def episodes(gateway, client, first, count):
        for number in range(first, first + count):
            await client.post(f"/e/ep{number}/v1/messages", json=BODY)
            await client.post(f"/e/ep{number}/close", json={"rewards": {"r": 1.0}})

    async def go():
        gateway, client = gateway_client(scripted(script), ledger)
        async with client:
            await episodes(gateway, client, 0, 20)  # warm up
            files = open_files()
            tracemalloc.start(25)
            before = held_by_the_gateway()
            await episodes(gateway, client, 20, 200)
            grown = held_by_the_gateway() - before
            tracemalloc.stop()
            return files, open_files(), grown, len(gateway.episodes.open)

    files_before, files_after, grown, still_open = run(go())
    # Other fds of the process may close meanwhile; 200 episodes must open none for good.
    assert still_open == 0 and files_after <= files_before
    assert grown / 200 < 1024, f"{grown / 200:.0f} bytes kept per closed episode"

    gateway, _ = gateway_client(scripted(script), ledger)
    files = open_files()
    # restarting opens none of them
    assert gateway.episodes.recover() == 0 and open_files() <= files
    gateway.episodes.release()


class Answering:
    """A policy that answers what the test says, as a faulty upstream might."""

    def __init__(self, inner, change):
        self.inner = inner
        self.change = change

    async def sample(self, prompt_ids, params):
        sample = await self.inner.sample(prompt_ids, params)
        return self.change(sample)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda s: Completion(s.completion_ids * 0 - 1, s.logprobs, 1, "stop"),
            "outside the vocabulary",
        ),
        (
            lambda s: Completion(s.completion_ids + 10**6, s.logprobs, 1, "stop"),
            "outside the vocabulary",
        ),
        (
            lambda s: Completion(s.completion_ids.astype(float), s.logprobs, 1, "stop"),
            "not integers",
        ),
        (lambda s: Completion(s.completion_ids, -s.logprobs, 1, "stop"), "at most 0"),
        (lambda s: Completion(s.completion_ids, s.logprobs * np.nan, 1, "stop"), "finite"),
        (
            lambda s: Completion(s.completion_ids, s.logprobs[:1], 1, "stop"),
            "log-probabilities for",
        ),
        (
            lambda s: Completion(np.tile(s.completion_ids, 30), np.tile(s.logprobs, 30), 1, "stop"),
            "more than the 20",
        ),
        (lambda s: Completion(s.completion_ids, s.logprobs, 2**70, "stop"), "policy_version"),
        (lambda s: Completion(s.completion_ids, s.logprobs, "3", "stop"), "policy_version"),
    ],
)
def test_an_upstream_answer_that_cannot_be_a_call_is_a_failed_call(tmp_path, script, change, said):
    async def go():
        _, client = gateway_client(Answering(scripted(script), change), tmp_path / "ledger")
        async with client:
            refused = await client.post("/e/ep/v1/messages", json=BODY)
            return refused, (await client.post("/e/ep/close", json={})).json()

    refused, record = run(go())
    assert refused.status_code == 502 and said in refused.json()["error"]["message"]
    assert [c for a in record["agents"] for c in a["calls"]] == []
    assert said in record["meta"]["gateway"]["failed_calls"][0]["error"]


def test_the_ledger_is_private_and_keys_guard_health_and_close(tmp_path, script):
    ledger = tmp_path / "ledger"

    async def go():
        _, client = gateway_client(scripted(script), ledger, tokens=["tok"])
        async with client:
            await client.post("/e/ep/v1/messages", json=BODY, headers={"x-api-key": "tok"})
            anonymous = (await client.get("/health")).json()
            keyed = (await client.get("/health", headers={"x-api-key": "tok"})).json()
            wrong_episode = await client.post("/e/ep/close", headers={"x-api-key": "cg:other:tok"})
            closed = await client.post("/e/ep/close", headers={"x-api-key": "cg:ep:tok"})
            return anonymous, keyed, wrong_episode, closed

    anonymous, keyed, wrong_episode, closed = run(go())
    assert anonymous == {"ok": True} and keyed["episodes"] == 1
    assert wrong_episode.status_code == 403 and closed.status_code == 200
    assert ledger.stat().st_mode & 0o777 == 0o700
    for path in ledger.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path.name
