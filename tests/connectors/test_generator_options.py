"""The generator's options: checked when it is created (one line naming the option), frozen, and all its
enumerator and readers get."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sluice.connectors.generator import GeneratorOptions, GeneratorSource
from sluice.errors import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_splits": 0}, r"GeneratorSource: num_splits must be an integer >= 1 \(got 0\)"),
        ({"batch_size": "10"}, r"GeneratorSource: batch_size must be an integer >= 1 \(got '10'\)"),
        ({"records_per_split": -1}, r"GeneratorSource: records_per_split must be an integer >= 0 or None \(got -1\)"),
        ({"rows_per_second": 0}, r"GeneratorSource: rows_per_second must be > 0 or None \(got 0\)"),
        ({"rows_per_second": "fast"}, r"GeneratorSource: rows_per_second must be > 0 or None \(got 'fast'\)"),
    ],
)
def test_a_wrong_option_is_named_when_the_generator_is_created(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        GeneratorSource(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_options_are_frozen_and_are_what_enumerator_and_readers_get() -> None:
    src = GeneratorSource(num_splits=3, records_per_split=7, batch_size=5)
    assert isinstance(src.options, GeneratorOptions) and src.options.bounded
    with pytest.raises(ValidationError, match="frozen"):
        src.options.num_splits = 4  # type: ignore[misc]
    assert src.expected().num_rows == 21 and src.num_splits == 3 and src.name == "generator"
    src.num_splits = 0  # an option assigned later is checked when the job is built
    with pytest.raises(ConfigError, match="num_splits must be an integer >= 1"):
        src.validate()
    assert GeneratorSource(records_per_split=None).options.bounded is False
