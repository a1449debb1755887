"""Hydra's search path beyond olmx's own ``conf/``: the user's config directories and the
plugins' YAML presets.

* Your own recipes: a directory laid out as ``conf/`` (``experiment/my_run.yaml``,
  ``model/my_model.yaml``, ...) named by ``olmx train --config-dir DIR`` or by
  :data:`CONFIG_PATH_ENV` (``OLMX_CONFIG_PATH=DIR1:DIR2``) adds its options to the groups, so
  ``olmx train --config-dir ~/recipes experiment=my_run`` composes ``~/recipes/experiment/my_run.yaml``
  (a recipe starts with ``# @package _global_``, as the shipped ones do). olmx's own options
  come first: a file of yours named like one of them is not used; give yours another name.
* Plugins: the ``olmx.conf`` entry points (``name = package.conf``) of the installed
  distributions, so that a plugin's ``conf/<group>/<option>.yaml`` composes like a first-party
  preset.

Both become ``hydra.searchpath`` entries (the ``--config-dir`` ones first, then
``OLMX_CONFIG_PATH``'s, then the plugins')."""

from __future__ import annotations

import os
from pathlib import Path

from olmx.errors import ConfigError

#: Entry-point group naming a plugin distribution's package of Hydra YAML presets.
CONF_GROUP = "olmx.conf"
#: Environment variable of config directories for every composition (``olmx train``,
#: ``olmx.planning.plan_run``), separated by ``os.pathsep``; after ``--config-dir``'s.
CONFIG_PATH_ENV = "OLMX_CONFIG_PATH"


def config_dir_entries(dirs: list[str], *, field: str) -> list[str]:
    """``hydra.searchpath`` entries (``file:///abs/dir``) of the user's config directories;
    :class:`ConfigError` naming ``field`` for one that is not a directory."""
    out = []
    for d in dirs:
        path = Path(d).expanduser()
        if not path.is_dir():
            why = "does not exist" if not path.exists() else "is not a directory"
            raise ConfigError(
                field,
                f"'{d}' {why}; a config directory holds config groups as olmx's conf/ does "
                f"(experiment/NAME.yaml, model/NAME.yaml, ...)",
            )
        entry = f"file://{path.resolve()}"
        if entry not in out:
            out.append(entry)
    return out


def config_dir_overrides(dirs: list[str], overrides: list[str]) -> list[str]:
    """``olmx train --config-dir DIR ...``: ``overrides`` after a ``hydra.searchpath`` override
    of the directories (none: unchanged)."""
    entries = config_dir_entries(dirs, field="--config-dir")
    if not entries:
        return list(overrides)
    return [f"hydra.searchpath=[{','.join(_quoted(e) for e in entries)}]", *overrides]


def _quoted(path: str) -> str:
    """A search-path entry as a quoted string of Hydra's override grammar."""
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def env_config_dirs() -> list[str]:
    """The ``hydra.searchpath`` entries of :data:`CONFIG_PATH_ENV` (empty parts skipped)."""
    value = os.environ.get(CONFIG_PATH_ENV, "")
    return config_dir_entries([d for d in value.split(os.pathsep) if d], field=CONFIG_PATH_ENV)


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
    """``overrides`` with ``OLMX_CONFIG_PATH``'s directories and the plugin YAML packages added
    to ``hydra.searchpath`` (merged into a ``hydra.searchpath=[...]`` override given before,
    ``--config-dir``'s, which Hydra would otherwise let win)."""
    own = env_config_dirs()
    paths = own + [p for p in conf_search_paths() if p not in own]
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
    return [f"hydra.searchpath=[{','.join(_quoted(p) for p in paths)}]", *rest]
