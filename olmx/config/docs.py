"""Field documentation of config dataclasses, read from their ``#:`` comments."""

from __future__ import annotations

import dataclasses
import inspect
import re
from enum import Enum
from typing import Any

_FIELD = re.compile(r"^\s+(\w+)\s*:")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: text of the #: comment lines above it}`` for a dataclass, inherited fields
    included (a subclass's comment wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments of the fields ``cls``'s own source defines."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        m = _FIELD.match(line)
        if m and pending:
            docs[m.group(1)] = " ".join(pending)
        pending = [] if not stripped.startswith("#") else pending
    return docs


def schema_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """``(key, type, default, allowed, doc)`` for every field, nested dataclasses flattened;
    ``allowed`` is the field's declared rule in words (:mod:`olmx.rules`)."""
    from olmx.rules import allowed

    rows: list[tuple[str, str, str, str, str]] = []
    docs = field_docs(cls)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        default: Any = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(default):
            rows += schema_rows(type(default), prefix=f"{key}.")
            continue
        typ = hints.get(f.name, f.type)
        shown = repr(default.value) if isinstance(default, Enum) else repr(default)
        rows.append((key, _type_name(typ), shown, allowed(f), docs.get(f.name, "")))
    return rows


def _hints(cls: type) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(cls)
    except Exception:  # forward references a plugin cannot resolve: fall back to strings
        return {}


def _type_name(t: Any) -> str:
    import typing

    if isinstance(t, type) and issubclass(t, Enum):  # a closed choice is written as a string
        return "str"
    options = [a for a in typing.get_args(t) if a is not type(None)]
    if typing.get_origin(t) is not None and len(options) == 1 and isinstance(options[0], type):
        if issubclass(options[0], Enum):
            return "Optional[str]"

    generic = typing.get_origin(t) is not None  # Optional[int], list[str]: their name drops the args
    text = t if isinstance(t, str) else str(t) if generic else getattr(t, "__name__", None) or str(t)
    return str(text).replace("typing.", "").replace("NoneType", "None")
