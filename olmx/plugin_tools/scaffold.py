"""``olmx plugins new``: write the complete skeleton of a plugin package from ``templates/plugin/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from olmx import PLUGIN_API, __version__
from olmx.config.search_path import CONF_GROUP
from olmx.errors import ConfigError
from olmx.kinds import CONFIG_GROUPS, GROUPS

from .names import entry_point_toml, plugin_names

#: The plugin API range a new plugin declares: this API up to the next major version.
API_RANGE = f">={PLUGIN_API},<{int(PLUGIN_API.split('.')[0]) + 1}"


def _templates() -> Path:
    from importlib.resources import files

    return Path(str(files("olmx.templates"))) / "plugin"


def new_plugin(name: str, *, kind: str, directory: Path | None = None) -> Path:
    """Write a complete plugin package of ``kind`` named ``name``; return its directory.

    The package (``olmx-NAME``) holds ``pyproject.toml`` (entry points in the kind's group
    and in ``olmx.conf``, a dependency on olmx), ``olmx_NAME/plugin.py`` implementing the
    kind's protocol, ``olmx_NAME/conf/<group>/NAME.yaml`` (its defaults as a Hydra preset), a
    README and a test that passes once the package is installed.
    """
    import jinja2

    from olmx.registry import registry

    if kind not in GROUPS:
        raise ConfigError("--kind", f"'{kind}' is not one of {', '.join(GROUPS)}")
    names = plugin_names(name)
    taken = registry().entry(kind, names.name)
    if taken is not None:
        raise ConfigError(
            "NAME", f"'{names.name}' is already a {kind} plugin ({taken.dist} {taken.version}); choose another name"
        )
    target = Path(directory) if directory is not None else Path.cwd() / names.dist
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError("--dir", f"'{target}' already exists and is not empty")

    group = GROUPS[kind]
    context: dict[str, Any] = {
        **names.__dict__,
        "kind": kind,
        "group": group,
        "config_group": CONFIG_GROUPS[kind],
        "api": API_RANGE,
        "plugin_api": PLUGIN_API,
        "olmx_requirement": "olmx>=" + ".".join(__version__.split(".")[:2]),
        "entry_point": entry_point_toml(group, names.name, f"{names.module}.plugin:{names.const}"),
        "conf_entry_point": entry_point_toml(CONF_GROUP, names.name, f"{names.module}.conf"),
    }
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True
    )
    tokens = {"_module_": names.module, "_name_": names.name}
    for root in (_templates() / "common", _templates() / kind):
        for src in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            rel = str(src.relative_to(root))
            for token, value in tokens.items():
                rel = rel.replace(token, value)
            dest = target / rel.removesuffix(".j2")
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text(encoding="utf-8")
            dest.write_text(env.from_string(text).render(context) if src.suffix == ".j2" else text, encoding="utf-8")
    return target
