"""Plugin names and entry points: every name derived from a plugin's name, and the olmx groups.

One plugin name (``my-thing``) gives the entry-point name, the Hydra option, the distribution,
the import package, the class prefix and the plugin object's name (:func:`plugin_names`);
:func:`entry_point_toml` writes one entry-point line with entry-points-txt.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from olmx.config.search_path import CONF_GROUP
from olmx.errors import ConfigError
from olmx.kinds import GROUPS

#: Every ``olmx.*`` entry-point group olmx reads.
KNOWN_GROUPS: tuple[str, ...] = (*GROUPS.values(), CONF_GROUP)
#: Plugin kind of each plugin entry-point group.
KIND_BY_GROUP = {group: kind for kind, group in GROUPS.items()}


@dataclass(frozen=True)
class PluginNames:
    """The names derived from one plugin name (``my-thing``)."""

    #: Entry-point name = Hydra option name = config key (``my_thing``).
    name: str
    #: Distribution name (``olmx-my-thing``).
    dist: str
    #: Import package (``olmx_my_thing``).
    module: str
    #: Class-name prefix (``MyThing``).
    title: str
    #: Name of the module-level plugin object (``MY_THING``).
    const: str


def plugin_names(raw: str) -> PluginNames:
    """Derive every name from ``raw`` (``my-thing``, ``my_thing`` or ``olmx-my-thing``)."""
    base = re.sub(r"^olmx[-_]", "", raw.strip().lower())
    if not re.fullmatch(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*", base):
        raise ConfigError(
            "NAME",
            f"'{raw}' must be letters, digits and single '-' or '_' between them, "
            "starting with a letter (e.g. my-thing)",
        )
    name = base.replace("-", "_")
    if keyword.iskeyword(name):
        raise ConfigError("NAME", f"'{name}' is a Python keyword")
    return PluginNames(
        name=name,
        dist=f"olmx-{base.replace('_', '-')}",
        module=f"olmx_{name}",
        title="".join(p.capitalize() for p in name.split("_")),
        const=name.upper(),
    )


def entry_point_toml(group: str, name: str, value: str) -> str:
    """One ``[project.entry-points."<group>"]`` line, validated and written by entry-points-txt."""
    import entry_points_txt as ept

    module, _, attr = value.partition(":")
    line = ept.EntryPoint(group=group, name=name, module=module, attr=attr or None, extras=()).to_line()
    ept.loads(f"[{group}]\n{line}\n")  # raises ParseError on an invalid name, module or attribute
    key, _, target = line.partition(" = ")
    return f'{key} = "{target}"'
