"""``canonical_json`` checks a value without a path per element and walks it again only to
say where it failed: what it refuses, and the path it names, are the same either way."""

from __future__ import annotations

import enum
import math
from typing import Any

import pytest

from celery_agboss.core.canonical import canonical_json


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def _cycle() -> dict[str, Any]:
    value: dict[str, Any] = {"a": []}
    value["a"].append(value)
    return value


@pytest.mark.parametrize(
    ("value", "path", "said"),
    [
        ({"a": [1, {"b": math.nan}]}, "$.a[1].b", "NaN"),
        ({"a": {1: "x"}}, "$.a", "int key"),
        ({"a": ["ok", "\ud800"]}, "$.a[1]", "lone surrogate"),
        ({"k\udc00": 1}, "$", "lone surrogate"),
        (_cycle(), "$.a[0]", "circular"),
        ({"when": object()}, "$.when", "not JSON"),
    ],
    ids=["nan", "int-key", "surrogate", "surrogate-key", "cycle", "object"],
)
def test_a_value_json_cannot_hold_is_refused_naming_its_path(
    value: Any, path: str, said: str
) -> None:
    with pytest.raises(TypeError) as refused:
        canonical_json(value)
    assert path in str(refused.value) and said in str(refused.value)


def test_subclasses_of_json_types_are_written_as_before() -> None:
    value = {"b": Colour.RED, "a": (Name("x"), 1.5, True, None)}
    assert canonical_json(value) == '{"a":["x",1.5,true,null],"b":1}'


def test_a_value_seen_twice_but_not_inside_itself_is_no_cycle() -> None:
    shared = {"x": 1}
    assert canonical_json({"a": shared, "b": [shared, shared]}) == (
        '{"a":{"x":1},"b":[{"x":1},{"x":1}]}'
    )
