"""The one codec between typed objects and plain data (what ``plan.yaml`` holds).

:func:`to_data` turns dataclasses (the plan, the typed run config, the plugins' configs) into
plain YAML-safe data; :func:`from_data` builds the typed objects back from their type hints;
:func:`run_from_data` re-types a run config's plugin sections with the plugins' ``Config``
classes. No OmegaConf: a saved plan is read back exactly as it was written.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

from olmx.api import CONFIG_GROUPS

T = TypeVar("T")


def to_data(obj: Any) -> Any:
    """Plain data (dicts, lists, str, int, float, bool, None) of a dataclass tree."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    return obj


def from_data(cls: type[T], data: dict[str, Any]) -> T:
    """The dataclass ``cls`` from plain data, converted field by field by its type hints
    (unknown keys are an error, missing ones take their defaults)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
    return cls(**{k: _convert(hints[k], v) for k, v in data.items()})


def _convert(tp: Any, value: Any) -> Any:
    if value is None or tp is Any or (isinstance(tp, type) and isinstance(value, tp)):
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_data(tp, value)
    if origin is list:
        return [_convert(args[0], v) for v in value] if args else list(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=True)) if args else tuple(value)
    if origin is dict:
        return {k: _convert(args[1], v) for k, v in value.items()} if args else dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def run_to_data(run: Any) -> dict[str, Any]:
    """Plain data of a typed RunConfig; the infra section flat (``{"name": "local", ...}``),
    as in the YAML config."""
    data = to_data(run)
    name = run.infra_name
    data["infra"] = {"name": name, **data["infra"][name]}
    return data


def run_from_data(data: dict[str, Any], reg: Any) -> Any:
    """The typed RunConfig of :func:`run_to_data`'s output; plugin sections typed by the
    ``Config`` of the plugins the registry ``reg`` loads."""
    from olmx.config.schema import RunConfig

    data = dict(data)
    sections: dict[str, dict[str, Any]] = {}
    for kind, group in CONFIG_GROUPS.items():
        raw = dict(data.pop(group, None) or {})
        if kind == "infra":
            raw = {raw.pop("name"): raw}
        sections[group] = {name: from_data(reg.get(kind, name).Config, values or {}) for name, values in raw.items()}
    run = from_data(RunConfig, data)
    for group, typed in sections.items():
        setattr(run, group, typed)
    return run
