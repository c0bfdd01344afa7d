"""The bounds of a sampling distribution: `Distribution` (a run's `[sampling]`, every call's
`SamplingParams`) refuses temperature < 0, top_p outside (0, 1] and a top_k that is not an int
>= 1 (or None), naming the field; a call's recorded `sampling` is held to the same bounds, with
the same message under `sampling.`."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgrove.episode import sampling_record
from callgrove.episode.checks import sampling_problem
from callgrove.sampling import Distribution

WHOLE = {"temperature": 1.0, "top_p": 1.0, "top_k": None}


def refusal(**given) -> str | None:
    """What `Distribution` says of these settings (None: taken), after checking that a call's
    `sampling` with the same values is refused with the same message under `sampling.`."""
    try:
        Distribution(**given)
        said = None
    except ValueError as error:
        said = str(error)
    recorded = sampling_problem({**WHOLE, **given})
    assert recorded == (None if said is None else f"sampling.{said}")
    return said


@given(
    temperature=st.floats(min_value=0, max_value=1e6),
    top_p=st.floats(min_value=0, max_value=1, exclude_min=True),
    top_k=st.none() | st.integers(min_value=1, max_value=1 << 40),
)
def test_settings_within_the_bounds_are_taken_and_recorded_as_given(temperature, top_p, top_k):
    assert refusal(temperature=temperature, top_p=top_p, top_k=top_k) is None
    distribution = Distribution(temperature=temperature, top_p=top_p, top_k=top_k)
    assert distribution.record() == sampling_record(temperature, top_p, top_k)
    assert sampling_problem(distribution.record()) is None


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("temperature", -0.5, "temperature must be a finite number >= 0, not -0.5"),
        ("temperature", -1, "temperature must be >= 0, not -1"),
        ("temperature", math.inf, "temperature must be a finite number >= 0, not inf"),
        ("temperature", "0.7", "temperature must be a number, not '0.7'"),
        ("top_p", 0.0, "top_p must be a finite number > 0 and <= 1, not 0.0"),
        ("top_p", 1.5, "top_p must be a finite number > 0 and <= 1, not 1.5"),
        ("top_p", -0.1, "top_p must be a finite number > 0 and <= 1, not -0.1"),
        ("top_k", 0, "top_k must be >= 1, not 0"),
        ("top_k", -3, "top_k must be >= 1, not -3"),
        ("top_k", 4.0, "top_k must be an int or null (no cut), not 4.0"),
        ("top_k", True, "top_k must be an int or null (no cut), not True"),
        ("top_k", "4", "top_k must be an int or null (no cut), not '4'"),
    ],
)
def test_each_bound_is_refused_naming_its_field(field, value, said):
    with pytest.raises(ValueError, match=f"^{field} "):
        Distribution(**{field: value})
    assert refusal(**{field: value}) == said


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_temperature_is_taken_exactly_when_finite_and_not_negative(temperature):
    said = refusal(temperature=temperature)
    assert (said is None) == (math.isfinite(temperature) and temperature >= 0)
    assert said is None or said.startswith("temperature ")


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_top_p_is_taken_exactly_within_zero_to_one_with_one_included(top_p):
    said = refusal(top_p=top_p)
    assert (said is None) == (math.isfinite(top_p) and 0 < top_p <= 1)
    assert said is None or said.startswith("top_p ")


@given(st.none() | st.integers() | st.floats() | st.booleans())
def test_a_top_k_is_taken_exactly_when_none_or_an_int_of_at_least_one(top_k):
    said = refusal(top_k=top_k)
    taken = top_k is None or (type(top_k) is int and top_k >= 1)
    assert (said is None) == taken
    assert said is None or said.startswith("top_k ")


def test_a_recorded_sampling_also_needs_its_object_and_both_required_keys():
    assert sampling_problem("greedy") == "sampling must be an object or null, not 'greedy'"
    for missing in ("temperature", "top_p"):
        partial = {key: value for key, value in WHOLE.items() if key != missing}
        problem = sampling_problem(partial)
        assert problem is not None and problem.startswith("sampling ") and missing in problem
    assert sampling_problem({"temperature": 0.7, "top_p": 0.9}) is None  # top_k may be left out
    assert sampling_problem({**WHOLE, "min_p": 0.05}) is None  # other keys are free
