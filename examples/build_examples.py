"""Builds the bundled example files from words, so their token ids tell a readable story.

    python examples/build_examples.py

`login_bug.jsonl`: the 12-call example of docs/episode-format.md. Leader L starts B in the background,
asks a fresh subagent A to find the bug, forks F to write the fix, compacts, runs the tests.
Each call's prompt extends exactly the history the story says, so the forest found from the
tokens has trees rooted at C1, C2, C5, C11 and leaves C4, C6, C9, C10, C12.

`login_group.jsonl`: four episodes of one group (the same task, different outcomes), for
scoring across a group.

`verifiers/traces.jsonl`: the group as a verifiers results folder holds it (callgrove's
verifiers writer), and `gym/`: the group's calls as NeMo Gym token captures, one
`.tokens.jsonl` per rollout (callgrove's writer of Gym's `TokenEntry` records; a capture has no
agents, so each chain of calls reads as one). Every command reads both as they are:
`callgrove rows examples/verifiers`, `callgrove stats examples/gym`.
"""

from __future__ import annotations

from pathlib import Path

from callgrove.bench.contenders import write_gym_captures
from callgrove.episode import Agent, Call, Episode, save
from callgrove.forest import compact_prompts
from callgrove.formats.wire import WireEnv, WirePolicy, WireRun

HERE = Path(__file__).parent


class Vocabulary:
    """Whitespace words to stable token ids (0 is reserved)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> list[int]:
        return [self.ids.setdefault(word, len(self.ids) + 1) for word in text.split()]


class Story:
    """Appends calls to agents; each call's prompt is a given history plus new words."""

    def __init__(self, vocab: Vocabulary, policy_version: int):
        self.vocab = vocab
        self.seq = 0
        self.policy_version = policy_version

    def call(
        self,
        agent: Agent,
        history: Call | list[int] | None,
        new: str,
        answer: str,
        purpose: str = "turn",
    ) -> Call:
        self.seq += 1
        # every prompt of the story is given whole: a call's tokens are its prompt and completion
        if isinstance(history, Call):
            before = [*history.prompt_suffix.tolist(), *history.completion_ids.tolist()]
        else:
            before = list(history or [])
        prompt = before + self.vocab(new)
        completion = self.vocab(answer)
        content = {"prompt": [_message(new)], "response": _message(answer)}
        logprobs = [round(-0.05 * (1 + (self.seq + i) % 7), 2) for i in range(len(completion))]
        return agent.add(
            Call.make(
                f"C{self.seq}",
                self.seq,
                prompt,
                completion,
                logprobs,
                policy_version=self.policy_version,
                purpose=purpose,
                content=content,
            )
        )


def _message(words: str) -> dict[str, object]:
    """The story's words as a chat message: `<call> tool args </call>` becomes a tool call,
    `<system>`, `<user>` and `<result>` their roles, anything else the assistant's text."""
    for tag, role in (("<system>", "system"), ("<user>", "user"), ("<result>", "tool")):
        if words.startswith(tag):
            if tag == "<system>" and "<user>" in words:  # a first prompt: system, then the task
                return {"role": "user", "content": words}
            return {"role": role, "content": words[len(tag) : -len(tag) - 1].strip()}
    if words.startswith("<call>"):
        name, _, arguments = (
            words.removeprefix("<call>").removesuffix("</call>").strip().partition(" ")
        )
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": name, "arguments": {"args": arguments}}}],
        }
    return {"role": "assistant", "content": words}


def login_bug(
    episode_id: str = "login-bug-0001", fixed: bool = True, group: str | None = "grp-login"
) -> Episode:
    vocab = Vocabulary()
    story = Story(vocab, policy_version=3)
    leader = Agent("L", "leader")
    # `spawned_by`: the leader call that started each subagent (shown as hand-over links).
    background = Agent("B", "signin", parent="L", start="background", meta={"spawned_by": "C1"})
    finder = Agent("A", "explore", parent="L", start="fresh", meta={"spawned_by": "C3"})
    fork = Agent("F", "fixer", parent="L", start="fork", meta={"spawned_by": "C7"})
    system = "<system> you are a coding agent </system>"
    task = "<user> fix the login bug </user>"
    c1 = story.call(leader, None, f"{system} {task}", "<call> Agent B background sign in </call>")
    c2 = story.call(
        background,
        None,
        "<system> you sign in </system> <user> sign in to the app </user>",
        "<call> curl /login </call>",
    )
    c3 = story.call(
        leader, c1, "<result> B started </result>", "<call> Agent A find the bug </call>"
    )
    story.call(background, c2, "<result> 200 OK session=abc </result>", "Signed in.")
    c5 = story.call(
        finder,
        None,
        "<system> you explore code </system> <user> find the login bug </user>",
        "<call> grep login </call>",
    )
    story.call(
        finder, c5, "<result> auth.py:12 compares hash to plain text </result>", "auth.py:12"
    )
    c7 = story.call(
        leader,
        c3,
        "<result> A says auth.py:12 </result>",
        "<call> Agent F fork write the fix </call>",
    )
    c8 = story.call(
        fork, c7, "<user> you are the fork: write the fix </user>", "<call> edit auth.py </call>"
    )
    story.call(
        fork, c8, "<result> edited auth.py </result>", "Fixed." if fixed else "Could not fix."
    )
    story.call(
        leader,
        c7,
        "<result> F says Fixed. </result> <user> summarise the conversation </user>",
        "summary: bug in auth.py:12 fixed by F",
        purpose="compaction",
    )
    c11 = story.call(
        leader,
        None,
        f"{system} <user> summary: bug in auth.py:12 fixed by F ; run the tests </user>",
        "<call> pytest </call>",
    )
    story.call(
        leader,
        c11,
        "<result> 3 passed </result>" if fixed else "<result> 1 failed </result>",
        "Done.",
    )
    episode = Episode(
        id=episode_id,
        agents=[leader, background, finder, fork],
        group=group,
        env=WireEnv(id="login-bug", name="login"),
        task={"prompt": "fix the login bug"},
        run=WireRun(id="run-a", type="train", step=6, policy=WirePolicy(start=2, end=4)),
        rewards={"tests_pass": 1.0 if fixed else 0.0},
    )
    compact_prompts(episode)
    return episode


def login_group() -> list[Episode]:
    outcomes = [True, False, True, False]
    return [
        login_bug(f"login-bug-g{i}", fixed, group="grp-login") for i, fixed in enumerate(outcomes)
    ]


def main(folder: Path = HERE) -> None:
    save(folder / "login_bug.jsonl", [login_bug()])
    save(folder / "login_group.jsonl", login_group())
    (folder / "verifiers").mkdir(exist_ok=True)
    save(folder / "verifiers" / "traces.jsonl", login_group(), format="verifiers")
    write_gym_captures(folder / "gym", login_group())
    print(f"wrote login_bug.jsonl, login_group.jsonl, verifiers/ and gym/ in {folder}")


if __name__ == "__main__":
    main()
