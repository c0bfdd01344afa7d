"""`callgrove train` with `objective = "sft"`: the bundled real Claude Code sessions and Codex
rollouts imported with a model's own tokenizer and chat template, trained by cross-entropy, and
resumed exactly; what cannot be used is counted, never dropped silently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.orchestrator.config import ConfigError, load_config
from callgrove.orchestrator.errors import RunError
from callgrove.orchestrator.loop import train
from callgrove.orchestrator.supervised import cut, step_samples
from callgrove.transcripts import import_codex

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real"
CODEX_FORK = ROOT / "tests" / "data" / "codex" / "spawn_fork" / "sessions"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A randomly initialised small Llama with a byte-level BPE tokenizer trained here and a
    ChatML template, saved as a Hugging Face checkpoint folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [p.read_text(errors="replace") for p in sorted(REAL.rglob("*.jsonl"))[:4]]
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def sft_config(model: Path, out: Path, steps: int, **more):
    overrides = {
        "model.name": f"hf:{model}",
        "train.objective": "sft",
        "train.learning_rate": 3e-3,
        "data.paths": [str(REAL)],
        "data.rows_per_step": 3,
        "data.max_row_tokens": 96,
        "data.allow_dropped_content": True,
        "run.steps": steps,
        "run.out": str(out),
        "monitor.live": False,
        "monitor.plot": False,
        **more,
    }
    return load_config(None, overrides)


def test_sft_trains_on_the_real_sessions_and_resumes_exactly(tiny_model, tmp_path):
    straight = train(sft_config(tiny_model, tmp_path / "straight", 6))
    data = straight.data
    assert data.files["Claude Code session"] >= 8 and data.files["Codex rollout"] >= 2
    assert data.episodes >= 10 and len(data.samples) > 6
    assert data.cut_tokens > 0  # real sessions are longer than 96 tokens
    assert all(s.advantages is None and s.num_tokens <= 96 for s in data.samples)
    losses = [m["train/loss"] for m in straight.metrics]
    assert len(losses) == 6 and np.mean(losses[-2:]) < losses[0], losses
    assert all(m["throughput/row_tokens_per_s"] > 0 for m in straight.metrics)

    # Stopped after 3 steps and run again: the same samples and the same losses.
    first = train(sft_config(tiny_model, tmp_path / "resumed", 3))
    resumed = train(sft_config(tiny_model, tmp_path / "resumed", 6))
    assert (first.last_step, resumed.first_step, resumed.last_step) == (3, 3, 6)
    assert [m["train/loss"] for m in resumed.metrics] == losses
    assert [m["step"] for m in resumed.metrics] == list(range(1, 7))


def test_packed_sft_steps_like_the_tree_packed_one(tiny_model, tmp_path):
    tree = train(sft_config(tiny_model, tmp_path / "tree", 1))
    packed = train(sft_config(tiny_model, tmp_path / "packed", 1, **{"train.batching": "packed"}))
    (t,), (p,) = tree.metrics, packed.metrics
    assert t["train/row_tokens"] == p["train/row_tokens"]
    assert t["train/forwarded_tokens"] <= p["train/forwarded_tokens"]
    assert t["train/loss"] == pytest.approx(p["train/loss"], rel=1e-4)


def test_the_command_reports_the_data_and_the_loss(tiny_model, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "cli"),
            "--quiet",
            *("--set", f"model.name=hf:{tiny_model}"),
            *("--set", "train.objective=sft"),
            *("--set", f'data.paths=["{REAL}"]'),
            *("--set", "data.max_row_tokens=64"),
            *("--set", "data.allow_dropped_content=true"),
            *("--set", "monitor.plot=false"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "loss" in result.stdout and "trained steps 1..2" in result.stdout
    assert (tmp_path / "cli" / "metrics.jsonl").is_file()


def test_what_cannot_be_trained_is_an_error_or_counted(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="tokenizer and chat template"):
        train(sft_config(tiny_model, tmp_path / "a", 1, **{"model.name": "tiny"}))
    with pytest.raises(ConfigError, match="needs folders or files"):
        train(sft_config(tiny_model, tmp_path / "b", 1, **{"data.paths": []}))
    with pytest.raises(ConfigError, match="no such file"):
        train(sft_config(tiny_model, tmp_path / "c", 1, **{"data.paths": ["/no/such/dir"]}))
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"hello": 1}\n')
    with pytest.raises(ConfigError, match=r"nothing to train on.*not training data"):
        train(sft_config(tiny_model, tmp_path / "d", 1, **{"data.paths": [str(notes)]}))
    # By default a chat template that leaves tool calls out is an error, named per episode.
    with pytest.raises(ConfigError, match=r"nothing to train on.*chat template drops"):
        train(
            sft_config(
                tiny_model,
                tmp_path / "e",
                1,
                **{"data.allow_dropped_content": False, "data.paths": [str(CODEX_FORK.parent)]},
            )
        )


@pytest.mark.parametrize("batching", [{"train.batching": "packed"}, {"train.tree_scope": "step"}])
def test_rows_longer_than_seq_len_are_refused_before_any_step(tiny_model, tmp_path, batching):
    """The data are read at the start, so a row longer than a micro-batch's bound is known then:
    one line naming it, and no step taken."""
    config = sft_config(tiny_model, tmp_path / "run", 2, **{"train.seq_len": 32, **batching})
    with pytest.raises(RunError, match=r"data.paths: episode .* row \d+ is 96 tokens, longer than"):
        train(config)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_codex_files_given_as_a_list_import_like_their_folder():
    files = sorted(CODEX_FORK.glob("*.jsonl"))
    by_folder, by_list = import_codex(CODEX_FORK), import_codex(files)
    assert [t.id for t in by_list] == [t.id for t in by_folder]
    assert [len(t.agents) for t in by_list] == [len(t.agents) for t in by_folder]


def test_step_samples_visit_every_sample_once_per_epoch():
    samples = list(range(7))
    seen = [step_samples(samples, step, 3, seed=5) for step in range(1, 8)]
    flat = [s for chosen, _ in seen for s in chosen]
    assert sorted(flat[:7]) == samples and sorted(flat[7:14]) == samples
    assert [epoch for _, epoch in seen][:3] == [0, 0, 0]
    assert step_samples(samples, 4, 3, seed=5) == seen[3]
    assert step_samples(samples, 4, 3, seed=6) != seen[3]


def test_cut_slices_every_per_token_array():
    from callgrove.batch import build_samples
    from callgrove.episode import load
    from callgrove.rows import build_rows

    episode = next(iter(load(ROOT / "examples" / "login_group.jsonl")))
    episode.objective = "supervised"
    sample = build_samples(build_rows(episode))[0]
    short = cut(sample, 5)
    assert short.num_tokens == 5 and short.advantages is None
    for name in ("token_ids", "loss_mask", "position_ids", "policy_versions"):
        assert np.array_equal(getattr(short, name), getattr(sample, name)[:5])
    assert (short.episode, short.leaf) == (sample.episode, sample.leaf)
