"""The plugin registry: discovery through entry points, lazy loading, isolation.

Listing reads only package metadata and the plugin module's source text (for its docstring);
it imports no plugin. Loading imports one plugin; whatever goes wrong (import error,
exception at load, missing protocol members, incompatible plugin API) turns that plugin into
a ``broken`` entry with the reason, and every other plugin and command keeps working.

``OLMX_PLUGINS=a,b`` restricts loading to the named plugins or distributions
(``OLMX_PLUGINS=none`` loads none: only useful for debugging).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from olmx import PLUGIN_API
from olmx.api import BASES, REQUIRED_HOOKS
from olmx.errors import PluginError, unknown_name
from olmx.kinds import GROUPS

FIRST_PARTY_DIST = "olmx"


@dataclass
class PluginEntry:
    """One entry point in an ``olmx.*`` group, as discovered (nothing imported)."""

    kind: str
    name: str
    #: ``module:attr`` as written in ``entry_points.txt``.
    value: str
    dist: str
    version: str
    #: ``available`` (not loaded yet), ``ok`` (loaded), ``broken``, ``incompatible``,
    #: ``shadowed`` (another plugin has the name) or ``disabled`` (by ``OLMX_PLUGINS``).
    status: str = "available"
    reason: str = ""

    @property
    def first_party(self) -> bool:
        """Shipped with olmx itself."""
        return self.dist == FIRST_PARTY_DIST

    @property
    def module(self) -> str:
        """The module the entry point names."""
        return self.value.split(":", 1)[0].strip()

    @property
    def usable(self) -> bool:
        """Whether loading may be attempted (or succeeded)."""
        return self.status in ("available", "ok")

    def description(self) -> str:
        """First line of the plugin module's docstring, read without importing it."""
        path = _module_source(self.module)
        if path is None:
            return ""
        doc = _leading_docstring(path)
        return doc.strip().splitlines()[0] if doc else ""


def _leading_docstring(path: Path) -> str | None:
    """The module docstring of the source file ``path``: its first statement if that is a
    string literal; only the tokens up to it are read (no parse of the whole module)."""
    import tokenize

    skip = {tokenize.ENCODING, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT}
    try:
        with open(path, "rb") as f:
            for token in tokenize.tokenize(f.readline):
                if token.type in skip:
                    continue
                if token.type != tokenize.STRING:
                    return None
                value = ast.literal_eval(token.string)
                return value if isinstance(value, str) else None
    except (OSError, SyntaxError, ValueError, tokenize.TokenError):
        return None
    return None


def _module_source(module: str) -> Path | None:
    """Locate a module's source file without executing any package ``__init__``."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if len(parts) == 1:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    locations = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], start=1):
        last = i == len(parts) - 1
        found: Path | None = None
        for loc in locations:
            pkg = Path(loc) / part
            if (pkg / "__init__.py").is_file():
                found = pkg / "__init__.py"
                locations = [str(pkg)]
                break
            if last and (Path(loc) / f"{part}.py").is_file():
                found = Path(loc) / f"{part}.py"
                break
        if found is None:
            return None
        if last:
            return found
    return None


def _allowed() -> set[str] | None:
    raw = os.environ.get("OLMX_PLUGINS")
    if raw is None:
        return None
    return {s.strip() for s in raw.split(",") if s.strip() and s.strip() != "none"}


def _api_compatible(spec: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return PLUGIN_API in SpecifierSet(spec)
    except InvalidSpecifier:
        return False


class Registry:
    """All olmx plugins installed in this environment."""

    def __init__(self, entries: list[PluginEntry]) -> None:
        self._entries = entries
        self._loaded: dict[tuple[str, str], Any] = {}

    @classmethod
    def discover(cls) -> Registry:
        """Scan the installed distributions' entry points (imports nothing)."""
        allowed = _allowed()
        entries: list[PluginEntry] = []
        every = metadata.entry_points()  # one scan of the installed distributions
        about: dict[int, tuple[str, str]] = {}  # METADATA is parsed once per distribution

        def name_version(dist: Any) -> tuple[str, str]:
            if dist is None:
                return "?", "?"
            if id(dist) not in about:
                md = dist.metadata
                about[id(dist)] = (md["Name"], md["Version"])
            return about[id(dist)]

        for kind, group in GROUPS.items():
            found: list[PluginEntry] = []
            for ep in every.select(group=group):
                found.append(PluginEntry(kind, ep.name, ep.value, *name_version(ep.dist)))
            # First party wins a name clash, then the first found; the others are shadowed.
            found.sort(key=lambda e: not e.first_party)
            seen: dict[str, PluginEntry] = {}
            for entry in found:
                if entry.name in seen:
                    winner = seen[entry.name]
                    entry.status = "shadowed"
                    entry.reason = f"name clash: '{entry.name}' is provided by {winner.dist}, which wins"
                elif allowed is not None and entry.name not in allowed and entry.dist not in allowed:
                    entry.status = "disabled"
                    entry.reason = "not in OLMX_PLUGINS"
                    seen[entry.name] = entry
                else:
                    seen[entry.name] = entry
                entries.append(entry)
        return cls(entries)

    def entries(self, kind: str | None = None) -> list[PluginEntry]:
        """Every discovered entry (of one kind), in discovery order."""
        return [e for e in self._entries if kind is None or e.kind == kind]

    def entry(self, kind: str, name: str) -> PluginEntry | None:
        """The entry that owns ``name`` in ``kind`` (never a shadowed one)."""
        for e in self.entries(kind):
            if e.name == name and e.status != "shadowed":
                return e
        return None

    def names(self, kind: str) -> list[str]:
        """Names of the plugins of ``kind`` that are not known to be unusable."""
        return sorted(e.name for e in self.entries(kind) if e.usable)

    def get(self, kind: str, name: str) -> Any:
        """Load and return the plugin object; :class:`PluginError` if unknown or unusable."""
        key = (kind, name)
        if key in self._loaded:
            return self._loaded[key]
        entry = self.entry(kind, name)
        if entry is None:
            raise PluginError(
                unknown_name(f"{kind} plugin", name, self.names(kind), label="installed", where="olmx plugins list")
            )
        self._load(entry)
        if entry.status != "ok":
            raise PluginError(f"{kind} plugin '{name}' ({entry.dist}) is {entry.status}: {entry.reason}")
        return self._loaded[key]

    def layers_in_order(self, layers: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """``(name, plugin, cfg)`` of the run's layer plugins in the order they edit the model:
        by the plugin's ``order`` (default :data:`olmx.api.DEFAULT_LAYER_ORDER`), then as
        listed. So ``layers=[engram,moe]`` builds the same model as ``layers=[moe,engram]``."""
        plugins = [(name, self.get("layer", name), cfg) for name, cfg in layers.items()]
        return sorted(plugins, key=lambda item: item[1].order)

    def load_all(self, kind: str | None = None) -> dict[tuple[str, str], Any]:
        """Load every usable plugin (of one kind); failures become broken entries."""
        for entry in self.entries(kind):
            if entry.status == "available":
                self._load(entry)
        return {k: v for k, v in self._loaded.items() if kind is None or k[0] == kind}

    def _load(self, entry: PluginEntry) -> None:
        if entry.status != "available":
            return
        try:
            obj = metadata.EntryPoint(entry.name, entry.value, GROUPS[entry.kind]).load()
        except BaseException as exc:  # a plugin must never take the CLI down
            if isinstance(exc, KeyboardInterrupt):
                raise
            entry.status, entry.reason = "broken", f"{type(exc).__name__}: {exc}".strip()
            return
        problem = _check_protocol(entry, obj)
        if problem:
            entry.status, entry.reason = problem
            return
        entry.status = "ok"
        self._loaded[(entry.kind, entry.name)] = obj


def _check_protocol(entry: PluginEntry, obj: Any) -> tuple[str, str] | None:
    """Why ``obj`` is not a usable plugin of its entry's kind (None: it is)."""
    for attr in ("name", "api", "Config"):
        if not hasattr(obj, attr):
            return "broken", f"missing attribute '{attr}' of the {entry.kind} plugin contract"
    if not isinstance(obj.api, str) or not _api_compatible(obj.api):
        return "incompatible", f"plugin supports olmx plugin API '{obj.api}', this olmx has {PLUGIN_API}"
    base = BASES[entry.kind]
    if not isinstance(obj, base):
        return "broken", f"not an instance of olmx.api.{base.__name__} (the {entry.kind} plugin contract)"
    if obj.name != entry.name:
        return "broken", f"object is named '{obj.name}' but registered as '{entry.name}'"
    if not (isinstance(obj.Config, type) and dataclasses.is_dataclass(obj.Config)):
        return "broken", "Config must be a dataclass"
    missing = [h for h in REQUIRED_HOOKS[entry.kind] if getattr(type(obj), h) is getattr(base, h)]
    if missing:
        return "broken", f"does not implement {', '.join(missing)} of the {entry.kind} plugin contract"
    wrong = _wrong_signatures(obj, base)
    if wrong:
        return "broken", "hook(s) with the wrong parameters: " + "; ".join(wrong)
    return None


def _wrong_signatures(obj: Any, base: type) -> list[str]:
    """Overridden hooks whose positional parameters differ in number from the base class's."""
    import inspect

    def positional(fn: Any) -> int | None:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return None
        return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)

    out, seen = [], set()
    hooks = [(hook, ref) for klass in base.__mro__ if klass is not object for hook, ref in vars(klass).items()]
    for hook, ref in hooks:
        mine = getattr(type(obj), hook, None)
        if hook in seen or hook.startswith("_") or not callable(ref) or mine is None or mine is ref:
            continue
        seen.add(hook)
        want, got = positional(ref), positional(mine)
        if want is not None and got is not None and want != got:
            out.append(f"{hook} takes {got - 1} argument(s), the contract passes {want - 1}")
    return out


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The process-wide registry (discovered once)."""
    return Registry.discover()


def reset() -> None:
    """Forget the discovered registry (tests install fake plugins between calls)."""
    registry.cache_clear()
    importlib.invalidate_caches()
