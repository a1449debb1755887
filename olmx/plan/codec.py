"""The one codec between typed objects and plain data (what ``plan.yaml`` holds).

:func:`to_data` turns dataclasses (the plan, the typed run config, the plugins' configs) into
plain YAML-safe data; :func:`from_data` builds the typed objects back from their type hints;
:func:`run_from_data` re-types a run config's plugin sections with the plugins' ``Config``
classes. No OmegaConf: a saved plan is read back exactly as it was written.

:func:`write_plan_file` and :func:`read_plan_file` are the one way to and from the file: plain
data as YAML, and back with a message that says what is wrong with a file that is no plan;
:func:`saved_config` reads only the run config of a saved plan, as plain data, for what needs
a field or two without the plugins (``olmx runs``, the resume check).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, Union

from olmx import rules
from olmx.errors import ConfigError, OlmxError
from olmx.kinds import CONFIG_GROUPS, SINGLE_KINDS

T = TypeVar("T")


def to_data(obj: Any) -> Any:
    """Plain data (dicts, lists, str, int, float, bool, None) of a dataclass tree."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, Enum):  # a closed choice: the value users write
        return obj.value
    return obj


class PlanDataError(ValueError):
    """Plain data that does not fit the typed objects; the message says where
    (``world.nnodes: expected int, got 'two'``)."""


def from_data(cls: type[T], data: Any, *, where: str = "") -> T:
    """The dataclass ``cls`` from plain data, converted field by field by its type hints
    (unknown keys and a missing field without a default are an error, missing ones with a
    default take it). Raises :class:`PlanDataError` for data that does not fit."""
    name = where or cls.__name__
    if not isinstance(data, dict):
        raise PlanDataError(f"{name}: expected a mapping of {cls.__name__}'s fields, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = set(data) - {f.name for f in fields}
    if unknown:
        raise PlanDataError(f"{name}: {cls.__name__} has no field(s) {', '.join(sorted(map(str, unknown)))}")
    missing = [
        f.name
        for f in fields
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise PlanDataError(f"{name}: missing field(s) {', '.join(missing)}")
    return cls(**{k: _convert(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()})


def _show(value: Any) -> str:
    """A value as an error message shows it (short)."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _convert(tp: Any, value: Any, where: str) -> Any:
    if value is None or tp is Any or (isinstance(tp, type) and isinstance(value, tp)):
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _convert(options[0], value, where) if len(options) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_data(tp, value, where=where)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise PlanDataError(
                f"{where}: expected one of {', '.join(str(m.value) for m in tp)}, got {_show(value)}"
            ) from None
    if origin in (list, tuple, dict) or tp in (int, float, str, bool):
        expected = (origin or tp).__name__
        if origin is dict and not isinstance(value, dict):
            raise PlanDataError(f"{where}: expected a mapping, got {_show(value)}")
        if origin in (list, tuple) and not isinstance(value, (list, tuple)):
            raise PlanDataError(f"{where}: expected a list, got {_show(value)}")
        # Scalars: never a container; numbers and flags never a string. (A ``str`` field keeps
        # a number as it is: plan rows may hold numbers.)
        if tp in (int, float, str, bool) and (
            isinstance(value, (dict, list, tuple)) or (tp is not str and isinstance(value, str))
        ):
            raise PlanDataError(f"{where}: expected {expected}, got {_show(value)}")
    if origin is list:
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise PlanDataError(f"{where}: expected {len(args)} items, got {len(value)}")
        return (
            tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
            if args
            else tuple(value)
        )
    if origin is dict:
        return {k: _convert(args[1], v, f"{where}.{k}") for k, v in value.items()} if args else dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def run_to_data(run: Any) -> dict[str, Any]:
    """Plain data of a typed RunConfig; the single-choice sections flat (``{"name": "local",
    ...}``), as in the YAML config."""
    data = to_data(run)
    for kind in SINGLE_KINDS:
        group = CONFIG_GROUPS[kind]
        ((name, values),) = data[group].items()
        data[group] = {"name": name, **values}
    return data


def run_from_data(data: dict[str, Any], reg: Any) -> Any:
    """The typed RunConfig of :func:`run_to_data`'s output; plugin sections typed by the
    ``Config`` of the plugins the registry ``reg`` loads."""
    from olmx.config.schema import RunConfig

    if not isinstance(data, dict):
        raise PlanDataError(f"config: expected a mapping, got {_show(data)}")
    data = dict(data)
    sections: dict[str, Any] = {}  # group -> {plugin name: typed settings}
    for kind, group in CONFIG_GROUPS.items():
        raw = data.pop(group, None) or {}
        if not isinstance(raw, dict):
            raise PlanDataError(f"config.{group}: expected a mapping, got {_show(raw)}")
        raw = dict(raw)
        if kind in SINGLE_KINDS:
            if "name" not in raw:
                earlier = len(raw) == 1 and isinstance(next(iter(raw.values())), dict)
                why = f" (a {group}.NAME section: written by an olmx before {group} was flat)" if earlier else ""
                raise PlanDataError(f"config.{group}: missing field(s) name{why}")
            if not isinstance(raw["name"], str):
                raise PlanDataError(f"config.{group}.name: expected a string, got {_show(raw['name'])}")
            raw = {raw.pop("name"): raw}
        sections[group] = {}
        for name, values in raw.items():
            where = f"config.{group}.{name}"
            if not isinstance(name, str):
                raise PlanDataError(f"config.{group}: a plugin name must be a string, got {_show(name)}")
            try:
                config_cls = reg.get(kind, name).Config
            except OlmxError as exc:  # not installed, or broken, here
                raise PlanDataError(f"{where}: {exc}") from None
            if values is not None and not isinstance(values, dict):
                raise PlanDataError(f"{where}: expected a mapping, got {_show(values)}")
            sections[group][name] = from_data(config_cls, values or {}, where=where)
    run = dataclasses.replace(from_data(RunConfig, data, where="config"), **sections)
    try:  # a hand-edited value its field forbids is refused here, as olmx train refuses it
        rules.check(run, "config")
    except ConfigError as exc:
        raise PlanDataError(str(exc)) from None
    return run


def decisions_from_data(data: Any, run: Any, reg: Any) -> dict[str, Any]:
    """The plan's ``decisions`` re-typed: each section of a plugin of ``run`` with a
    ``Decisions`` dataclass becomes an instance of it (as plugin configs are re-typed); the
    others stay plain data."""
    if not isinstance(data, dict):
        raise PlanDataError(f"decisions: expected a mapping, got {_show(data)}")
    typed = {}
    for kind, group in CONFIG_GROUPS.items():
        for name in getattr(run, group):
            plugin = reg.get(kind, name)
            typed[plugin.section] = plugin.Decisions
    out: dict[str, Any] = {}
    for section, values in data.items():
        cls = typed.get(section)
        out[section] = from_data(cls, values, where=f"decisions.{section}") if cls is not None else values
    return out


#: What a plan file's reader tells a user to do about a file it cannot read.
_AGAIN = "write it again with olmx train"


def write_plan_file(path: Path, data: dict[str, Any]) -> None:
    """Write a plan's plain data (:meth:`olmx.plan.Plan.to_dict`) to ``path`` as YAML,
    atomically, keys in their order (``olmx_version`` last: a file without it was cut short)."""
    import yaml

    from olmx.writable import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """The plain data of a plan file. A missing, unreadable, empty, binary, truncated or otherwise
    invalid file raises ``ConfigError("PLAN", ...)`` saying which (the CLI prints one line and
    exits 2)."""
    import yaml

    from olmx.rundir import PLAN_FILE

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("PLAN", f"'{p}' does not exist (olmx train writes RUN_DIR/{PLAN_FILE})") from None
    except IsADirectoryError:
        raise ConfigError("PLAN", f"'{p}' is a directory, not a {PLAN_FILE}") from None
    except UnicodeDecodeError:
        raise ConfigError("PLAN", f"'{p}' is not a text file (a {PLAN_FILE} is YAML written by olmx train)") from None
    except OSError as exc:
        raise ConfigError("PLAN", f"'{p}' cannot be read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError("PLAN", f"'{p}' is not valid YAML ({problem}{at}); {_AGAIN}") from None
    if data is None or data == {}:
        raise ConfigError("PLAN", f"'{p}' is empty; {_AGAIN}")
    if not isinstance(data, dict):
        raise ConfigError("PLAN", f"'{p}' holds a {type(data).__name__}, not a plan; {_AGAIN}")
    if "olmx_version" not in data:
        raise ConfigError("PLAN", f"'{p}' is truncated (it ends before olmx_version, its last key); {_AGAIN}")
    return data


def saved_config(path: str | Path) -> dict[str, Any] | None:
    """The run config (``config``) of the plan file ``path`` as plain data, without the plugins;
    None where there is no readable plan (missing, cut short, hand-broken)."""
    try:
        config = read_plan_file(path).get("config")
    except ConfigError:
        return None
    return config if isinstance(config, dict) else None
