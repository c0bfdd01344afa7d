"""What every trainer-settings check shares: each key it is given must be one the trainer knows,
and every setting it refuses is named in one error.

A misspelt key is the quiet failure: the trainer (or the config the check is shown) keeps the
key's default, often the very setting the check exists to refuse, and the check would judge
the default without a word about the key. Naming every refused setting at once saves a
round trip per setting.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Sequence

from callgrove.errors import UsageError


class SettingsRefused(UsageError, ValueError):
    """A trainer's settings under which its loss on the samples is not the clipped ratio
    against their sampling logprobs (or settings it does not know): each one named."""


def unknown_keys(keys: Iterable[object], known: Collection[str], prefix: str = "") -> list[str]:
    """A problem for each of `keys` not in `known`, naming the known key it most resembles;
    `prefix` is the section they sit in (`loss_fn.`), shown before each."""
    candidates = sorted(known)
    problems = []
    for key in map(str, keys):
        if key in known:
            continue
        close = difflib.get_close_matches(key, candidates, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        problems.append(f"unknown setting {prefix}{key}{hint}")
    return problems


def refuse_settings(what: str, problems: Sequence[str]) -> None:
    """Raise one `SettingsRefused` naming every problem, `what` first; nothing if none."""
    if problems:
        raise SettingsRefused(f"{what}: " + "; ".join(problems))
