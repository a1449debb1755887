"""Constraints on config values, declared once next to each field and checked by one checker.

A field declares what it allows with :func:`setting` in place of a bare default::

    #: Optimizer steps to train for.
    max_steps: int = setting(200, ge=1)
    #: Learning-rate schedule after warm-up.
    schedule: LRSchedule = setting(LRSchedule.cosine)   # class LRSchedule(StrEnum): cosine = "cosine"; ...

:func:`check` walks a config dataclass (its nested sections and dicts of sections) and raises
:class:`~olmx.errors.ConfigError` naming the first field whose value its rule refuses, what the
rule allows and what was given. :func:`olmx.config.compose.to_object` runs it over the run
config and every plugin's ``Config`` before anything is derived from the values, so no later
code meets a value its field forbids. :func:`allowed` is the same rule as text: ``olmx plugins
show`` and the schema docs print it. A ``None`` value is always allowed here (an ``Optional``
field's "off"). A divisibility between two fields of one section is declared too
(``n_heads: int = setting(4, ge=1, divides="d_model")``), checked once both fields passed their
own rules; rules that join fields of several sections, or the world, stay with the code that
owns them. Plugins declare their fields' rules the same way.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from olmx.errors import ConfigError

__all__ = ["Rule", "setting", "rule_of", "allowed", "check", "check_plain", "plain"]

#: The ``dataclasses.field`` metadata key a :class:`Rule` is stored under.
RULE_KEY = "olmx.rule"


@dataclass(frozen=True)
class Rule:
    """What one field allows. Numeric bounds also require a finite number; on a list field
    (``items=True``) they apply to each item."""

    #: Smallest allowed value (inclusive).
    ge: float | None = None
    #: Allowed values are above this one.
    gt: float | None = None
    #: Largest allowed value (inclusive).
    le: float | None = None
    #: Allowed values are below this one.
    lt: float | None = None
    #: The allowed values of a string field.
    choices: tuple[str, ...] | None = None
    #: The exact number of items of a list field.
    length: int | None = None
    #: The numeric bounds apply to each item of a list field.
    items: bool = False
    #: An integer field (the text says "integer").
    integer: bool = False
    #: The name of a field of the same section this value must divide (both not None).
    divides: str | None = None
    #: One value allowed besides the bounds: a sentinel such as ``-1`` (full attention).
    also: float | None = None

    def describe(self) -> str:
        """The allowed values in words: ``a positive integer``, ``a number in (0, 1]``, ..."""
        if self.choices is not None:
            return f"one of {', '.join(self.choices)}"
        bounds = self._bounds() + (f" dividing {self.divides}" if self.divides else "")
        if self.also is not None and bounds:
            bounds = f"{bounds} or {_num(self.also)}"
        if self.length is not None:
            return f"{self.length} numbers" + (f", each {bounds}" if bounds else "")
        return f"each {bounds}" if self.items and bounds else bounds

    def _bounds(self) -> str:
        low, high = _first(self.ge, self.gt), _first(self.le, self.lt)
        noun = "an integer" if self.integer else "a number"
        if low is not None and high is not None:
            left, right = "[" if self.ge is not None else "(", "]" if self.le is not None else ")"
            return f"{noun} in {left}{_num(low)}, {_num(high)}{right}"
        if high is None and (self.ge == 1 if self.integer else self.gt == 0):
            return "a positive integer" if self.integer else "a positive finite number"
        noun = noun if self.integer else "a finite number"
        if low is not None:
            return f"{noun} {'>=' if self.ge is not None else '>'} {_num(low)}"
        if high is not None:
            return f"{noun} {'<=' if self.le is not None else '<'} {_num(high)}"
        return ""

    def refuses(self, value: Any) -> bool:
        """Whether ``value`` (not None) breaks this rule."""
        if self.choices is not None:
            return value not in self.choices
        if self.length is not None and (not isinstance(value, (list, tuple)) or len(value) != self.length):
            return True
        values = list(value) if self.items or self.length is not None else [value]
        return any(self._out_of_bounds(v) for v in values)

    def _out_of_bounds(self, v: Any) -> bool:
        if not any(b is not None for b in (self.ge, self.gt, self.le, self.lt)):
            return False
        if self.also is not None and not isinstance(v, bool) and v == self.also:
            return False
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return True
        return (
            (self.ge is not None and v < self.ge)
            or (self.gt is not None and v <= self.gt)
            or (self.le is not None and v > self.le)
            or (self.lt is not None and v >= self.lt)
        )


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: type[Enum] | tuple[str, ...] | None = None,
    length: int | None = None,
    items: bool = False,
    integer: bool | None = None,
    divides: str | None = None,
    also: float | None = None,
) -> Any:
    """A dataclass field with ``default`` (or ``factory``) and the rule its values obey.
    ``integer`` defaults to whether ``default`` is an int (the text says "integer");
    ``divides`` names a field of the same section the value must divide; ``also`` is one value
    allowed besides the bounds (``-1``: a sentinel). A closed choice is a
    ``StrEnum`` field (its members' values are what users write): its values are the rule's
    ``choices``, taken from the default's enum, or from ``choices`` (the enum) where the default
    is None; a ``str`` field may list its values in ``choices`` instead."""
    if integer is None:
        integer = isinstance(default, int) and not isinstance(default, bool)
    if choices is None and isinstance(default, Enum):
        choices = type(default)
    values = tuple(m.value for m in choices) if isinstance(choices, type) else choices
    rule = Rule(
        ge=ge,
        gt=gt,
        le=le,
        lt=lt,
        choices=values,
        length=length,
        items=items,
        integer=integer,
        divides=divides,
        also=also,
    )
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={RULE_KEY: rule})
    return dataclasses.field(default=default, metadata={RULE_KEY: rule})


def rule_of(f: dataclasses.Field) -> Rule | None:
    """The rule a dataclass field declares (None: only its type)."""
    rule = f.metadata.get(RULE_KEY)
    return rule if isinstance(rule, Rule) else None


def allowed(f: dataclasses.Field) -> str:
    """What ``f`` allows, in words (empty: anything its type admits)."""
    rule = rule_of(f)
    return rule.describe() if rule else ""


def plain(value: Any) -> Any:
    """``value`` with every enum member replaced by its value (dicts and lists walked)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


#: What a switch (a ``bool`` field) allows, worded as a closed choice.
SWITCH = Rule(choices=("true", "false"))
#: The types of a mapping of single values (``infra.env: dict[str, str]``).
SCALARS = (str, int, float, bool)


def check_plain(cls: type, values: Any, where: str) -> None:
    """Raise :class:`ConfigError` at the first value in the plain ``values`` of the dataclass
    ``cls`` that OmegaConf would take the wrong way, as :func:`check` words it: a closed choice
    that is none of its values (OmegaConf would turn the string into the enum member and word a
    refusal its own way); a switch (a ``bool`` field) given anything but true or false (OmegaConf
    reads ``2`` and ``yes`` as true); a list or mapping as a value of a mapping of single values
    (``infra.env.X=[0,1]``: OmegaConf keeps it, and it would reach the environment as Python
    text). Nested sections and dicts of sections are walked."""
    if not isinstance(values, dict):
        return
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value, key, hint = values[f.name], f"{where}.{f.name}" if where else f.name, hints.get(f.name)
        rule = rule_of(f)
        if rule is not None and rule.choices is not None and value is not None and value not in rule.choices:
            raise ConfigError(key, _message(rule, value, optional=_optional(f)))
        if _single(hint) is bool and value is not None and not isinstance(value, bool):
            raise ConfigError(key, _message(SWITCH, value, optional=_optional(f)))
        inner, items = _dataclass_in(hint), _dict_values(hint)
        section = _dataclass_in(items)
        if inner is not None and isinstance(value, dict):
            check_plain(inner, value, key)
        elif items is not None and isinstance(value, dict):
            for name, item in value.items():
                if section is not None:
                    check_plain(section, item, f"{key}.{name}")
                elif items in SCALARS and isinstance(item, (dict, list)):
                    raise ConfigError(f"{key}.{name}", f"must be a single value (a string, number or bool), got {item}")


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 -- a plugin's unresolvable annotation: nothing nested to walk
        return {}


def _single(tp: Any) -> Any:
    """The one type ``tp`` is, or that ``Optional[tp]`` holds (None: a union of several)."""
    options = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    return options[0] if len(options) == 1 else None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass ``tp`` is, or that ``Optional[tp]`` holds."""
    one = _single(tp)
    return one if isinstance(one, type) and dataclasses.is_dataclass(one) else None


def _dict_values(tp: Any) -> Any:
    """The type of the values of ``dict[str, tp]`` (or of an optional one); None: no such dict."""
    one = _single(tp)
    if typing.get_origin(one) is dict and len(typing.get_args(one)) == 2:
        return typing.get_args(one)[1]
    return None


def check(config: Any, where: str) -> None:
    """Raise :class:`ConfigError` at the first field of the dataclass instance ``config`` (at
    dotted path ``where``) whose value its rule refuses; nested sections and dicts of sections
    (``data.sources.NAME``) are walked too."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        key = f"{where}.{f.name}" if where else f.name
        rule = rule_of(f)
        if rule is not None and value is not None and rule.refuses(value):
            raise ConfigError(key, _message(rule, value, optional=_optional(f)))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check(value, key)
        elif isinstance(value, dict):
            for name, item in value.items():
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    check(item, f"{key}.{name}")
    for f in dataclasses.fields(config):  # every field passed its own rule: the divisibilities
        rule = rule_of(f)
        value = getattr(config, f.name)
        if rule is None or rule.divides is None or value is None:
            continue
        other = getattr(config, rule.divides)
        if other is not None and other % value:
            key = f"{where}.{f.name}" if where else f.name
            whole = f"{where}.{rule.divides}" if where else rule.divides
            raise ConfigError(key, f"{value} must divide {whole}={other}")


def _optional(f: dataclasses.Field) -> bool:
    """Whether ``f`` admits null (``Optional[...]``), read from its annotation."""
    text = f.type if isinstance(f.type, str) else repr(f.type)
    return text.startswith("Optional[") or "None" in text


def _message(rule: Rule, value: Any, *, optional: bool) -> str:
    """Today's form: ``'x' is not one of a, b`` for a choice, ``must be ..., got v`` otherwise."""
    if rule.choices is not None:
        return f"'{value}' is not one of {', '.join(rule.choices)}{', null' if optional else ''}"
    shown = list(value) if isinstance(value, (list, tuple)) else value
    text = rule.describe()
    null = (", or null" if " or " in text else " or null") if optional else ""
    return f"must be {text}{null}, got {shown}"
