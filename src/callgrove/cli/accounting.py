"""What a command's inputs came to, said the same way by every command that reads episodes.

Each command keeps one `CommandOutcome` over its inputs (`callgrove.episode.intake.Intake`):
episodes are admitted as they are read (a copy read twice is refused), episodes that cannot be
used are counted as lost, and at the end `report` prints every problem and the account, and
returns the exit status: 0 only when nothing was lost, no call was lost inside an episode and
nothing was read twice, or when `--accept-loss` accepts it (the account still says what).
`promise` is the only place that says "each trained exactly once".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from callgrove.chat import ChatFormat
from callgrove.cli.app import err, safe
from callgrove.cli.model_options import open_chat
from callgrove.episode import Episode
from callgrove.episode.intake import UNUSABLE, Intake, Seen
from callgrove.errors import EXIT_FAILED, EXIT_OK, UsageError
from callgrove.formats.problems import Diagnostics, Problem

AcceptLossOption = Annotated[
    bool,
    typer.Option(
        "--accept-loss",
        help="Exit 0 although input was lost or read twice; the summary still says what.",
    ),
]
ReadTokenizerOption = Annotated[
    Path | None,
    typer.Option(
        "--tokenizer",
        help="Text-only inputs (ATIF steps without token ids) are tokenized with this: a model "
        "folder, or a tokenizer.json with its chat template; without it, callgrove's bytes "
        "(said in the summary).",
    ),
]


def reading_chat(tokenizer: Path | None) -> ChatFormat | None:
    """The chat format `--tokenizer` names, or None (a `UsageError` when it cannot be used)."""
    if tokenizer is None:
        return None
    try:
        return open_chat(None, tokenizer, None)
    except (OSError, ValueError) as error:
        raise UsageError(f"--tokenizer {tokenizer}: {error}") from None


# Past this many, the problems of one kind are summed up in the account instead of listed.
SHOWN_PER_KIND = 20
# Problems a command prints one by one before the rest are only counted.
SHOWN_PROBLEMS = 20
EXACTLY_ONCE = "each trained exactly once"


@dataclass
class CommandOutcome:
    """What a command went through: episodes admitted, lost, read twice (see the module)."""

    intake: Intake = field(default_factory=Intake)
    accept_loss: bool = False
    chat: ChatFormat | None = None  # renders text-only inputs (`--tokenizer`)

    @property
    def diagnostics(self) -> Diagnostics:
        return self.intake.diagnostics

    @property
    def episodes(self) -> int:
        """Episodes read once and used."""
        return self.intake.episodes

    def admit(self, episode: Episode, file: object, line: int) -> bool:
        """Take an episode read at `file:line`; False for a copy read before (not to be used)."""
        return self.intake.admit_episode(episode, str(file), line)

    def admit_seen(self, record: Seen) -> bool:
        return self.intake.admit(record)

    def failed(self, file: object, line: int | None, episode: str, reason: object) -> None:
        """An admitted episode that could not be used: lost, and said why."""
        self.intake.unusable(
            Problem(str(reason), file=str(file), line=line, episode=episode, kind=UNUSABLE)
        )

    @property
    def whole(self) -> bool:
        return self.intake.whole

    def status(self) -> int:
        return EXIT_OK if self.whole or self.accept_loss else EXIT_FAILED

    def report(self) -> int:
        """Print the problems and the account on stderr; return the exit status."""
        shown: dict[str, int] = {}
        for problem in [*self.diagnostics.problems, *self.intake.lost_calls]:
            shown[problem.kind] = shown.get(problem.kind, 0) + 1
            if shown[problem.kind] <= SHOWN_PER_KIND:
                style = "yellow" if problem.severity == "warning" else "red"
                err.print(f"[{style}]{problem.severity}[/]: {safe(problem)}")
        for line in self.account():
            err.print(safe(line))
        return self.status()

    def account(self) -> list[str]:
        """The account's lines: nothing when everything read was used whole."""
        intake = self.intake
        if len(intake.diagnostics.errors) == 1 and not (
            intake.admitted or intake.lost_calls or intake.partial
        ):
            return []  # one problem alone, nothing read: the problem is its own account
        lines = []
        if not intake.whole or intake.partial:
            lines.append(f"read: {self.reading()}")
        if intake.lost or intake.lost_calls:
            lines.append(f"lost: {self.losses()}")
        if intake.partial:
            kinds = ", ".join(f"{kind} {count:,}" for kind, count in intake.partial.most_common())
            lines.append(f"converted with loss (links or text, no call): {kinds}")
        if not intake.whole and self.accept_loss:
            lines.append("accepted (--accept-loss): the exit status is 0")
        return lines

    def reading(self) -> str:
        intake = self.intake
        parts = [f"{intake.episodes:,} episode(s) used"]
        if intake.read_twice:
            parts.append(f"{intake.read_twice:,} read twice (those copies not used)")
        return ", ".join(parts)

    def losses(self) -> str:
        intake = self.intake
        parts = []
        if intake.lost:
            parts.append(f"{len(intake.lost):,} error(s) in the input (episodes not used)")
        if intake.lost_calls:
            kinds = ", ".join(
                f"{kind} {count:,}" for kind, count in intake.lost_call_kinds().most_common()
            )
            parts.append(
                f"{len(intake.lost_calls):,} sampled call(s) not in the episodes ({kinds})"
            )
        return "; ".join(parts)

    def promise(self, kept_calls: int, episodes: int) -> str:
        """The closing line over every episode: exactly once only when it is true."""
        counted = f"{kept_calls:,} kept calls in {episodes:,} episode{'s' if episodes != 1 else ''}"
        if self.whole:
            return f"{counted}, {EXACTLY_ONCE}"
        broken = [
            (count, text)
            for count, text in (
                (len(self.intake.lost), "input lost"),
                (len(self.intake.lost_calls), "sampled calls lost"),
                (self.intake.read_twice, "episodes read twice"),
            )
            if count
        ]
        return f"{counted}; NOT exactly once: " + ", ".join(
            f"{text} ({count:,})" for count, text in broken
        )
