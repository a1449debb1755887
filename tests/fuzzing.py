"""What the fuzz tests share: one value of nested data (a saved plan, a ``tokenizer.json``)
replaced or removed, and the one outcome every reader of user files must have: facts, or one
:class:`~olmx.errors.ConfigError` of one line naming its field, never another exception."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from olmx.errors import ConfigError

#: Removes the value instead of replacing it.
DELETE = "DELETE"
#: What a hand edit or a cut file puts in place of a value.
REPLACEMENTS = [None, 0, -1, 1.5, float("nan"), "x", "", [], {}, [1, 2], {"a": 1}, True, 10**12, DELETE]


def value_paths(data: Any, path: tuple = (), *, max_items: int | None = None) -> Iterator[tuple]:
    """The path (keys and indices) of every value in nested dicts and lists; ``max_items``:
    only the first items of each list."""
    if isinstance(data, dict):
        items: Any = data.items()
    elif isinstance(data, list):
        items = enumerate(data[:max_items])
    else:
        return
    for key, value in items:
        yield (*path, key)
        yield from value_paths(value, (*path, key), max_items=max_items)


def replaced(data: Any, spot: tuple, new: Any) -> Any:
    """A deep copy of ``data`` with the value at ``spot`` replaced by ``new`` (:data:`DELETE`:
    removed)."""
    out = copy.deepcopy(data)
    parent = out
    for key in spot[:-1]:
        parent = parent[key]
    if isinstance(new, str) and new == DELETE:
        del parent[spot[-1]]
    else:
        parent[spot[-1]] = new
    return out


def read_or_refuse(read: Callable[[], Any], field: str, seen: dict[str, int], context: tuple) -> None:
    """Call ``read``: it gives facts (counted in ``seen["facts"]``) or raises one one-line
    ``ConfigError`` naming ``field`` (``seen["refused"]``); anything else fails the test,
    naming ``context`` (the seed and the mutation, to replay it)."""
    try:
        read()
        seen["facts"] += 1
    except ConfigError as exc:
        assert exc.field == field and "\n" not in str(exc), (*context, str(exc))
        seen["refused"] += 1
    except Exception as exc:
        raise AssertionError(f"fuzz {context}: {type(exc).__name__}: {exc}") from exc
