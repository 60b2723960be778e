"""Every hostile or unlucky input of tests/fuzz_cases.py (issue 25) is a clear error naming the input, or is accepted
with a finite result; the inputs that once hung or killed the process run in a child process with a time limit.
`python bench/fuzz_tally.py` prints the same cases as a tally per category."""

import pytest

from .fuzz_cases import CASES, CATEGORIES, classify


def test_the_table_covers_every_category():
    counts = {category: sum(case.category == category for case in CASES.values()) for category in CATEGORIES}
    assert all(counts.values()), counts
    assert len(CASES) >= 140


def _params():
    # The cases run in a child process (forked from a server that imports vlhub once, about 10 s, then up to a few
    # seconds each): the slow set, which the README's test command runs; the in-process cases stay in the quick suite.
    return [pytest.param(name, marks=[pytest.mark.slow] if case.in_child else []) for name, case in CASES.items()]


@pytest.mark.parametrize("case_id", _params())
def test_hostile_input(case_id):
    outcome, detail = classify(CASES[case_id])
    assert outcome in ("clear error", "correctly accepted"), f"{outcome}: {detail}"
