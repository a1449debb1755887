"""argv overrides -> DictConfig (Hydra compose) -> typed :class:`RunConfig`.

Hydra is used through its compose API (Typer owns argv). The config tree is ``conf/``
(package data ``olmx.conf``). Every loadable plugin contributes one option to its kind's
group, built from its ``Config`` dataclass and stored in Hydra's ConfigStore, so
``parallel=[fsdp]`` works for a third-party plugin exactly as for a first-party one.
"""

from __future__ import annotations

import dataclasses
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from olmx import rules
from olmx.config.schema import AUTO, AutoParallelConfig, RunConfig, SourceConfig
from olmx.errors import ConfigError, unknown_name
from olmx.kinds import CONFIG_GROUPS, SINGLE_KINDS, config_section
from olmx.registry import Registry

#: Kinds whose group is selected as a list of named sections (``layers.moe.top_k``); the
#: others (:data:`olmx.api.SINGLE_KINDS`) are one flat section with a ``name`` (``infra.nodes``).
NESTED_KINDS = tuple(kind for kind in CONFIG_GROUPS if kind not in SINGLE_KINDS)


def conf_dir() -> Path:
    """The directory of the shipped Hydra config tree."""
    return Path(str(resources.files("olmx.conf")))


def preset(group: str, option: str) -> dict[str, Any]:
    """What the shipped option ``conf/<group>/<option>.yaml`` sets, as plain data (empty where
    there is none): the plan's "set by you" compares with it (``data.tokenizer``)."""
    from omegaconf import OmegaConf

    path = conf_dir() / group / f"{option}.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}
    return {str(k): v for k, v in values.items()} if isinstance(values, dict) else {}


def _defaults_of(config_cls: type) -> dict[str, Any]:
    """The defaults of a config dataclass as plain data (every field has one)."""
    return rules.plain(dataclasses.asdict(config_cls()))


#: Sections whose keys are names the user chooses (``data.sources.web.paths=[...]``): open to
#: new keys without Hydra's ``+``; their values are still typed by to_object.
OPEN_SECTIONS = ("data.sources",)


def _open_maps(defaults: dict[str, Any], keys: list[str]) -> Any:
    """``defaults`` as a DictConfig whose mappings at ``keys`` take new keys without Hydra's
    ``+`` (Hydra's struct mode, set on the root, leaves a node whose flag is set explicitly):
    :data:`OPEN_SECTIONS` of the schema, and a plugin's ``dict`` settings, so that
    ``infra.env={A: b}`` and ``infra.env.A=b`` set them as any other field is set."""
    from omegaconf import OmegaConf

    node = OmegaConf.create(defaults)
    for key in keys:
        OmegaConf.set_struct(OmegaConf.select(node, key), False)
    return node


def register_plugin_options(reg: Registry) -> None:
    """Store one config option per loadable plugin in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    # Untyped defaults: Hydra knows every key (unknown ones are refused at compose time) and
    # `~key` resets a key to its default; types are checked by to_object.
    cs.store(name="olmx_schema", node=_open_maps(_defaults_of(RunConfig), list(OPEN_SECTIONS)))
    for (kind, name), plugin in reg.load_all().items():
        group = CONFIG_GROUPS[kind]
        defaults = _defaults_of(plugin.Config)
        node = {"name": name, **defaults} if kind in SINGLE_KINDS else {name: defaults}
        maps = [f.name for f in dataclasses.fields(plugin.Config) if isinstance(defaults.get(f.name), dict)]
        prefix = "" if kind in SINGLE_KINDS else f"{name}."
        cs.store(
            group=group, name=name, node=_open_maps(node, [prefix + m for m in maps]), provider=f"olmx plugin {name}"
        )
    # ``parallel=auto``: the plan chooses the strategies (olmx.plan.auto); a plugin cannot take the name.
    cs.store(group=CONFIG_GROUPS["parallel"], name=AUTO, node={AUTO: {}}, provider="olmx")


def compose(overrides: list[str], reg: Registry) -> Any:
    """Compose ``conf/train.yaml`` with Hydra overrides; errors become ConfigError. A recipe's
    ``recipe.layout`` (:func:`recipe_layout`) is composed in before the user's overrides."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _reject_hydra_flags(overrides)
    overrides = [_tokenizer_shorthand(o) for o in overrides]
    register_plugin_options(reg)
    try:
        _reject_duplicate_selections(overrides)
        cfg = _hydra_compose(overrides)
        layout = recipe_layout(list(cfg.recipe.layout), overrides)
        return _hydra_compose([*layout, *overrides]) if layout else cfg
    except (HydraException, OmegaConfBaseException) as exc:
        raise _config_error(exc, reg) from None


def _hydra_compose(overrides: list[str]) -> Any:
    """Hydra's composition of ``conf/train.yaml`` (and the search path's groups) with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from olmx.config.search_path import with_conf_search_paths

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(conf_dir()), version_base="1.3", job_name="olmx"), warnings.catch_warnings():
        # A plugin's YAML preset named like the plugin extends its ConfigStore option;
        # Hydra 1.3 warns about that merge, which is exactly what olmx intends.
        warnings.filterwarnings("ignore", message=r"(?s).*validated against ConfigStore schema", category=UserWarning)
        return hydra_compose("train", overrides=with_conf_search_paths(list(overrides)))


def recipe_layout(layout: list[str], overrides: list[str]) -> list[str]:
    """The recipe's ``recipe.layout`` overrides that apply: those the user's overrides do not set
    themselves, and none of the parallel plugins' where the user chose the parallel strategies
    (``parallel=auto``, ``parallel=[fsdp]``): their settings would be for plugins not selected;
    under ``parallel=auto`` not the recipe's activation checkpointing either, which auto chooses
    with the layout (the recipe's micro-batch stays: auto lowers from it)."""
    keys = {_key(o) for o in overrides}
    own_parallel = "parallel" in keys
    auto = any(_key(o) == "parallel" and o.partition("=")[2].strip() == "auto" for o in overrides)

    def applies(o: str) -> bool:
        key = _key(o)
        if key in keys or (own_parallel and key.startswith("parallel.")):
            return False
        return not (auto and key == "trainer.activation_checkpointing")

    return [o for o in layout if applies(o)]


def _key(override: str) -> str:
    """The key an override sets (``parallel`` of ``parallel=[fsdp]``, ``a.b`` of ``+a.b=1``)."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def _reject_hydra_flags(overrides: list[str]) -> None:
    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(
                o,
                "not an olmx option; overrides use Hydra's grammar (key=value, group=option, "
                "+key=value, ~key) and olmx's own flags go before them (see olmx train --help)",
            )
        key, _, value = o.partition("=")
        if "," in value and not value.lstrip().startswith(("[", "{", "'", '"')):
            raise ConfigError(
                key,
                f"'{value}' looks like a sweep; olmx runs one configuration at a time "
                "(for a list value write key=[a,b])",
            )


def _tokenizer_shorthand(override: str) -> str:
    """``data.tokenizer=NAME`` (a tokenizer by name, as ``precision=NAME`` names a plugin) is
    ``data.tokenizer.name=NAME``; a mapping (``data.tokenizer={...}``) is left to Hydra."""
    key, eq, value = override.partition("=")
    if eq and key.strip() == "data.tokenizer" and value.strip() and not value.lstrip().startswith("{"):
        return f"data.tokenizer.name={value}"
    return override


def _reject_duplicate_selections(overrides: list[str]) -> None:
    """A plugin listed twice in a list-selected group (``parallel=[a,a]``, ``layers=[b,b]``):
    Hydra's defaults list would silently keep one, so it is refused here, naming it; so is a
    list for a single-choice group (``precision=[a,b]``), which Hydra would merge into one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = set(CONFIG_GROUPS.values())
    single = {CONFIG_GROUPS[kind] for kind in SINGLE_KINDS}
    selecting = [o for o in overrides if o.lstrip("+~").partition("=")[0].partition("@")[0].strip() in groups]
    if not selecting:
        return
    for override in OverridesParser.create().parse_overrides(selecting):
        value = override.value() if not override.is_delete() else None
        if override.key_or_group not in groups or not isinstance(value, list):
            continue
        if override.key_or_group in single:
            group = override.key_or_group
            raise ConfigError(group, f"a run has one {group}: {group}=NAME, not a list ({override.input_line})")
        names = [str(v) for v in value]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            group = override.key_or_group
            raise ConfigError(
                group,
                f"'{twice}' is listed twice in {override.input_line}; list each plugin once "
                f"({group}=[{','.join(dict.fromkeys(names))}])",
            )


def _config_error(exc: Exception, reg: Registry) -> ConfigError:
    """Turn Hydra/OmegaConf's exception into one line naming the field and what is allowed."""
    import re

    text = str(exc).strip()
    cause = exc.__cause__
    if cause is not None and text.startswith("Error merging override"):
        return _config_error(cause, reg)  # type: ignore[arg-type]
    missing = re.search(r"Could not (?:find|load) '([\w-]+)/([\w.-]+)'", text)
    if missing:
        group, option = missing.groups()
        kinds = {v: k for k, v in CONFIG_GROUPS.items()}
        if group in kinds:
            entry = reg.entry(kinds[group], option)
            if entry is not None and not entry.usable:
                return ConfigError(group, f"plugin '{option}' from {entry.dist} is {entry.status}: {entry.reason}")
        allowed = _group_options(group, reg)
        return ConfigError(group, unknown_name("option", option, allowed))
    override = re.search(r"Could not override '([^']+)'", text)
    if override:
        key = override.group(1)
        absent = str(getattr(exc.__cause__, "full_key", "") or "")  # the first level Hydra did not find
        return (
            _plugin_key_error(key, reg, missing=absent)
            or _schema_key_error(key)
            or ConfigError(
                key, f"no such key; to add a new key write +{key}=VALUE (see olmx train --dry-run for the keys)"
            )
        )
    if text.startswith("LexerNoViableAltException"):
        return _unquoted_error(exc)
    appended = re.search(r"Could not append to config. An item is already at '([^']+)'", text)
    if appended:
        key = appended.group(1)
        return ConfigError(key, f"already exists; set it with {key}=VALUE (no '+')")
    full_key = getattr(exc, "full_key", None)
    first = text.splitlines()[0] if text else type(exc).__name__
    env = re.search(r"Environment variable '([^']+)' not found", first)
    if env:
        name = env.group(1)
        first = (
            f"environment variable {name} is not set (${{oc.env:{name}}}); export it, or give a default: "
            f"${{oc.env:{name},DEFAULT}}"
        )
    else:  # OmegaConf's "KeyError raised while resolving interpolation: ..." says which error, not which value
        first = re.sub(r"^\w+ raised while resolving interpolation: ", "interpolation: ", first)
    if full_key:
        return ConfigError(str(full_key), first)
    key = re.search(r"full_key: ([\w.\[\]]+)", text)
    return ConfigError(key.group(1) if key else "overrides", first)


def _unquoted_error(exc: Exception) -> ConfigError:
    """Hydra's lexer stopped at a character its override grammar reads only inside quotes
    (a non-ASCII letter, ``#``, ``;``, ``&``, ...): the override, quoted as it must be written."""
    text = str(exc)
    override = str(getattr(exc, "override", "") or text.splitlines()[0].partition(": ")[2])
    key, eq, value = override.partition("=")
    lines = text.splitlines()
    at = lines[1].find("^") - len("LexerNoViableAltException: ") if len(lines) > 1 else -1
    if not eq or 0 <= at <= len(key):
        return ConfigError(
            key, f"'{override}' is not a key Hydra's override grammar reads (letters a-z, digits, _ . -)"
        )
    bare = value.strip()
    if bare.startswith("[") and bare.endswith("]") and not any(c in bare[1:-1] for c in "[]{}'\""):
        items = ",".join(f'"{item.strip()}"' for item in bare[1:-1].split(","))
        how = f"quote each item: '{key}=[{items}]'"
    elif bare.startswith(("[", "{")):
        how = f'quote each item or value inside it ({key}=["a","b"], {key}={{k: "v"}})'
    elif '"' in value:
        how = f"quote the value: \"{key}='{value}'\""
    else:
        how = f"quote the value: '{key}=\"{value}\"'"
    return ConfigError(key, f"{value!r} has characters Hydra's override grammar reads only inside quotes; {how}")


def _plugin_key_error(key: str, reg: Registry, *, missing: str = "") -> ConfigError | None:
    """Why ``key`` under a plugin group cannot be set (None: not a plugin group): a key the
    plugin does not have (listing those it has, and saying when the plugin is not selected
    either: ``missing``, the first level of ``key`` the composed config lacks, is the plugin's
    section), a plugin that is not selected, or the nested spelling of a single-choice group
    (``precision.mxfp8.emulate``: ``precision.emulate``)."""
    group, _, rest = key.partition(".")
    kind = next((k for k, g in CONFIG_GROUPS.items() if g == group), None)
    if kind is None or not rest:
        return None
    name, _, field = rest.partition(".")
    names = reg.names(kind)
    if kind in SINGLE_KINDS:
        if name in names and field:
            return ConfigError(key, f"{group} is one flat section: write {group}={name} {group}.{field}=VALUE")
        having = [n for n in names if name in _field_names(reg, kind, n)]
        if not having:
            return None  # the selected plugin's allowed keys are in Hydra's message
        return ConfigError(key, f"set by {group}={' or '.join(having)}; select one to set it")
    if name not in names:
        return ConfigError(key, unknown_name(f"{kind} plugin", name, names, label="installed"))
    allowed = _field_names(reg, kind, name)
    if field.partition(".")[0] not in allowed:
        message = unknown_name("key", field.partition(".")[0], allowed, of=f"{group}.{name}")
        if missing == f"{group}.{name}":
            message += f"{' ' if message.endswith('?') else '; '}{name} is not selected either: {group}=[...,{name}]"
        return ConfigError(key, message)
    return ConfigError(key, f"{name} is not selected; add it: {group}=[...,{name}]")


def _schema_key_error(key: str) -> ConfigError | None:
    """A key the run's typed sections do not have (``trainer.lrr``): the keys the section has.
    None where the key is under no typed section (``+extra.note=...`` adds such keys)."""
    section: Any = RunConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(section)}
        if part not in fields:
            if depth == 0:
                return None
            where = ".".join(parts[:depth])
            return ConfigError(key, unknown_name("key", part, fields, of=where))
        f = fields[part]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if not dataclasses.is_dataclass(default):
            return None
        section = type(default)
    return None


def _field_names(reg: Registry, kind: str, name: str) -> list[str]:
    try:
        return [f.name for f in dataclasses.fields(reg.get(kind, name).Config)]
    except Exception:  # noqa: BLE001 -- a broken plugin has no keys to offer
        return []


def _group_options(group: str, reg: Registry) -> list[str]:
    from hydra.core.config_store import ConfigStore

    names = {p.stem for p in (conf_dir() / group).glob("*.yaml")}
    repo = ConfigStore.instance().repo.get(group, {})
    names |= {k.removesuffix(".yaml") for k in repo}
    return sorted(names)


def to_object(cfg: Any, reg: Registry) -> RunConfig:
    """Typed RunConfig from the composed DictConfig; plugin sections typed by their Config."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:  # an interpolation (${oc.env:NAME}, ${key}) that does not resolve
        raise _config_error(exc, reg) from None
    assert isinstance(container, dict)
    sections: dict[str, Any] = {}
    for kind, group in CONFIG_GROUPS.items():
        raw = container.pop(group, {}) or {}
        if not isinstance(raw, dict):
            raise ConfigError(group, f"expected a section ({group}=NAME or {group}.NAME.KEY=VALUE), got {raw!r}")
        if kind in SINGLE_KINDS:
            raw = dict(raw)
            name = raw.pop("name", None)
            if not name:
                raise ConfigError(group, f"choose one: {group}=NAME, NAME one of {', '.join(reg.names(kind))}")
            raw = {name: raw}
        typed: dict[str, Any] = {}
        for name, values in raw.items():
            if kind == "parallel" and name == AUTO:
                typed[name] = _typed(AutoParallelConfig, values or {}, f"{group}.{name}")
                continue
            plugin = _plugin(reg, kind, group, name)
            typed[name] = _typed(plugin.Config, values or {}, config_section(kind, name))
        sections[group] = typed
    # data.sources' entries are typed one by one, as the plugin sections are: OmegaConf would
    # create each new key's node from the frozen SourceConfig read-only, then fail to fill it
    data = container.get("data")
    raw_sources = (data.pop("sources", None) if isinstance(data, dict) else None) or {}
    if not isinstance(raw_sources, dict):
        message = f"expected named sources (data.sources.NAME.paths=[...]), got {raw_sources!r}"
        raise ConfigError("data.sources", message)
    sources = {name: _typed(SourceConfig, values or {}, f"data.sources.{name}") for name, values in raw_sources.items()}
    rules.check_plain(RunConfig, container, "")
    try:
        base = OmegaConf.merge(_schema(RunConfig), container)
        run = OmegaConf.to_object(base)
    except OmegaConfBaseException as exc:
        raise _config_error(exc, reg) from None
    assert isinstance(run, RunConfig)
    rules.check(run, "")  # the core sections (the plugin sections are not set yet: checked by _typed)
    return dataclasses.replace(run, data=dataclasses.replace(run.data, sources=sources), **sections)


def _plugin(reg: Registry, kind: str, group: str, name: str) -> Any:
    from olmx.errors import PluginError

    try:
        return reg.get(kind, name)
    except PluginError as exc:
        raise ConfigError(config_section(kind, name), str(exc)) from None


def _schema(config_cls: type) -> Any:
    """OmegaConf's structured config of ``config_cls`` to merge values into: writable, though
    the dataclass is frozen (OmegaConf makes a frozen dataclass's node read-only; the merged
    values become a new frozen instance)."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(config_cls)
    _clear_readonly(schema)
    return schema


def _clear_readonly(node: Any) -> None:
    """Clear the read-only flag of ``node`` and of every config node under it (each frozen
    dataclass's node sets its own)."""
    from omegaconf import DictConfig, OmegaConf

    OmegaConf.set_readonly(node, False)
    if isinstance(node, DictConfig) and not node._is_none():
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                _clear_readonly(child)


def _typed(config_cls: type, values: dict[str, Any], where: str) -> Any:
    """Validate ``values`` against a plugin's Config dataclass (unknown keys, types)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(values, dict):
        raise ConfigError(where, f"expected a section of keys ({where}.KEY=VALUE), got {values!r}")
    rules.check_plain(config_cls, values, where)
    try:
        merged = OmegaConf.merge(_schema(config_cls), values)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        fields = [f.name for f in dataclasses.fields(config_cls)]
        msg = str(exc).splitlines()[0]
        if "not in struct" in msg or "Key '" in msg and "not in" in msg:
            msg = unknown_name("key", str(key).rpartition(".")[2], fields, of=where)
        raise ConfigError(f"{where}.{key}" if key else where, msg) from None
    rules.check(obj, where)
    return obj
