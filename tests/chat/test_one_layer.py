"""One conversation, one token sequence: the RL loop, the transcript importer (SFT data), the
gateway and `serve-policy` all render through the same chat format."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import orjson
import pytest

from callgrove.chat import BuiltinFormat, ChatFormat, JinjaFormat, Message
from callgrove.episode import Episode, episode_from_wire
from callgrove.formats.jsonl import decode_episode_line
from callgrove.gateway.core import Gateway
from callgrove.gateway.routes import Routes
from callgrove.orchestrator.env import run_episode
from callgrove.policy import Completion, SamplingParams
from callgrove.serving.policy_server import PolicyServer
from callgrove.transcripts import Transcript, TranscriptAgent, TranscriptCall, TranscriptRenderer
from callgrove.transcripts.turns import CallRecord, Source, extend

SYSTEM, FIRST, REPLY, SECOND = "You answer tersely.", "What is 2 + 3?", "5", "And 4 + 4?"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Answers:
    """A policy that answers every prompt with one assistant message, as the format writes it."""

    def __init__(self, chat: ChatFormat, text: str):
        self.ids = chat.completion(Message("assistant", text), Message("user", FIRST))
        self.prompts: list[np.ndarray] = []

    async def sample(self, prompt_ids, params) -> Completion:
        self.prompts.append(np.asarray(prompt_ids))
        return Completion(self.ids, np.full(len(self.ids), -0.5), 0, "stop")


def chatml_tokenizer():
    """A Hugging Face tokenizer held in memory: a small byte-level BPE and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator([SYSTEM, FIRST, REPLY, SECOND, "system user assistant"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    tokenizer.chat_template = CHATML
    return tokenizer


def smollm2_tokenizer():
    from callgrove.models import HfModel
    from callgrove.models.hf import hf_tokenizer

    return hf_tokenizer(HfModel(name="smollm2-135m"))


@pytest.fixture(
    params=[
        "builtin",
        "chatml",
        pytest.param("smollm2", marks=pytest.mark.hf),
    ]
)
def chat(request) -> ChatFormat:
    if request.param == "builtin":
        return BuiltinFormat()
    tokenizer = chatml_tokenizer() if request.param == "chatml" else smollm2_tokenizer()
    return JinjaFormat.from_tokenizer(tokenizer)


def through_the_loop(chat: ChatFormat) -> np.ndarray:
    class TwoTurns:
        name = "two-turns"

        async def run(self, episode, task):
            episode.leader.say(SYSTEM, role="system")
            await episode.leader.ask(FIRST)
            await episode.leader.ask(SECOND)
            return 0.0

    episode = Episode(id="e", group="g")
    params = SamplingParams(max_tokens=8, stop_token_ids=chat.stop_token_ids)
    asyncio.run(run_episode(TwoTurns(), None, Answers(chat, REPLY), chat, params, episode))
    second = episode.agents[0].calls[1]
    return episode.prompt_ids(second)


def through_the_importer(chat: ChatFormat) -> np.ndarray:
    agent = TranscriptAgent("leader", "leader")
    record = CallRecord(source=Source("session.jsonl", [1]))
    start = extend(None, [Message("system", SYSTEM), Message("user", FIRST)])
    first = TranscriptCall("c1", agent, start, Message("assistant", REPLY), (1,), record)
    second = TranscriptCall(
        "c2",
        agent,
        extend(first.answer, [Message("user", SECOND)]),
        Message("assistant", "8"),
        (2,),
        record,
    )
    agent.calls += [first, second]
    episode = TranscriptRenderer(chat).episode(Transcript("t", [agent]))
    return episode.prompt_ids(episode.agents[0].calls[1])


def history(with_reply: bool) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    if with_reply:
        messages += [{"role": "assistant", "content": REPLY}, {"role": "user", "content": SECOND}]
    return messages


async def chat_completion(app, url: str, messages) -> dict:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
        answer = await client.post(url, json={"model": "policy", "messages": messages})
        return answer.json()


def through_the_gateway(chat: ChatFormat, tmp_path) -> np.ndarray:
    gateway = Gateway(Answers(chat, REPLY), chat, tmp_path / "ledger")

    async def go() -> dict:
        app = Routes(gateway).app()
        for with_reply in (False, True):
            await chat_completion(app, "/e/ep/v1/chat/completions", history(with_reply))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return (await client.post("/e/ep/close", json={})).json()

    try:
        record = asyncio.run(go())
    finally:
        gateway.episodes.release()
    episode = episode_from_wire(decode_episode_line(orjson.dumps(record)))
    return episode.prompt_ids(episode.agents[0].calls[1])


def through_serve_policy(chat: ChatFormat) -> np.ndarray:
    server = PolicyServer(Answers(chat, REPLY), chat)
    payload = asyncio.run(chat_completion(server.app(), "/v1/chat/completions", history(True)))
    return np.asarray(payload["prompt_token_ids"])


def test_one_conversation_is_one_token_sequence_wherever_it_is_rendered(chat, tmp_path):
    loop = through_the_loop(chat)
    assert chat.decode(loop).count(SECOND) == 1  # the second call's prompt: the whole talk
    assert through_the_importer(chat).tolist() == loop.tolist()
    assert through_the_gateway(chat, tmp_path).tolist() == loop.tolist()
    assert through_serve_policy(chat).tolist() == loop.tolist()


def test_a_tokenizer_in_memory_renders_as_its_files_do(tmp_path):
    tokenizer = chatml_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    from_files = JinjaFormat.from_folder(tmp_path)
    in_memory = JinjaFormat.from_tokenizer(tokenizer)
    messages = [Message("system", SYSTEM), Message("user", FIRST)]
    assert in_memory.render(messages).tolist() == from_files.render(messages).tolist()
    assert in_memory.stop_token_ids == from_files.stop_token_ids
    assert in_memory.vocab_size == from_files.vocab_size == len(tokenizer)


def test_a_chat_format_pickled_renders_and_stops_alike(chat):
    """What a Ray actor gets (`callgrove train --executor ray` sends the format to its workers):
    a compiled Jinja template does not pickle, so a template format is rebuilt from its source."""
    import pickle

    again = pickle.loads(pickle.dumps(chat))
    messages = [Message("system", SYSTEM), Message("user", FIRST)]
    assert np.array_equal(again.render(messages), chat.render(messages))
    assert again.stop_token_ids == chat.stop_token_ids
