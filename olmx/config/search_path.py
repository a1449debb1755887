"""Hydra search path of the plugins' YAML presets: the ``olmx.conf`` entry points
(``name = package.conf``) of the installed distributions become ``hydra.searchpath`` entries,
so that a plugin's ``conf/<group>/<option>.yaml`` composes like a first-party preset."""

from __future__ import annotations

#: Entry-point group naming a plugin distribution's package of Hydra YAML presets.
CONF_GROUP = "olmx.conf"


def conf_search_paths() -> list[str]:
    """Hydra search-path entries of every installed ``olmx.conf`` entry point, in discovery
    order, skipping duplicates, values that are not a package name and packages that
    ``OLMX_PLUGINS`` leaves out (by entry-point or distribution name).

    The package is located without importing it (so a broken plugin cannot break
    composition): a ``file://`` path when its directory is found on ``sys.path``, else
    ``pkg://package`` (Hydra then imports it when it composes).
    """
    from importlib import metadata

    from olmx.registry import _allowed, _module_source

    allowed = _allowed()
    paths: list[str] = []
    for ep in metadata.entry_points(group=CONF_GROUP):
        value = ep.value.strip()
        if ":" in value or not all(p.isidentifier() for p in value.split(".")):
            continue
        if allowed is not None and ep.name not in allowed and (ep.dist is None or ep.dist.name not in allowed):
            continue
        init = _module_source(value)
        path = f"file://{init.parent}" if init is not None and init.name == "__init__.py" else f"pkg://{value}"
        if path not in paths:
            paths.append(path)
    return paths


def with_conf_search_paths(overrides: list[str]) -> list[str]:
    """``overrides`` with the plugin YAML packages added to ``hydra.searchpath`` (merged into a
    ``hydra.searchpath=[...]`` override the user gave, which Hydra would otherwise let win)."""
    paths = conf_search_paths()
    if not paths:
        return list(overrides)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rest: list[str] = []
    for o in overrides:
        if o.split("=", 1)[0].strip() == "hydra.searchpath":
            value = OverridesParser.create().parse_override(o).value()
            if isinstance(value, list):
                paths = [str(v) for v in value] + [p for p in paths if p not in value]
                continue
        rest.append(o)
    quoted = ",".join("'" + p.replace("\\", "\\\\").replace("'", "\\'") + "'" for p in paths)
    return [f"hydra.searchpath=[{quoted}]", *rest]
