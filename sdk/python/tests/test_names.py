"""The package's public names: each exported once, each the object its
module defines (two classes once shared the name StepResult, and the
later import silently replaced the earlier)."""

import typing

import warren
import warren._types
import warren.env


def test_public_names_are_unique_and_resolve() -> None:
    dup = sorted({n for n in warren.__all__ if warren.__all__.count(n) > 1})
    assert not dup, f"exported twice: {dup}"
    for name in warren.__all__:
        assert hasattr(warren, name), name


def test_step_results_are_distinct() -> None:
    assert warren.StepResult is warren.env.StepResult
    assert warren.JobStepResult is warren._types.JobStepResult
    assert typing.get_args(typing.get_type_hints(warren.RunResult)["steps"])[0] is warren.JobStepResult
