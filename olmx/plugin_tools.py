"""Tools for plugin authors: scaffold a package and check one before installing it.

* :func:`new_plugin` (``olmx plugins new NAME --kind K``) renders ``templates/plugin/`` into a
  complete package: ``pyproject.toml`` with its entry points (each line written by
  entry-points-txt), the plugin module, a YAML preset, a README and a passing test.
* :func:`check_plugin` (``olmx plugins check TARGET``) reads a source tree's
  ``[project.entry-points]``, a wheel's or an installed distribution's ``entry_points.txt``
  with entry-points-txt, imports the plugin objects in a separate Python process (the
  package's source or the unpacked wheel first on ``sys.path``; nothing is installed) and
  reports every problem in a table.

The YAML presets that installed packages contribute reach Hydra through
:mod:`olmx.config.search_path`.

Nothing here imports torch, OLMo-core or a plugin in the calling process.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmx import PLUGIN_API, __version__
from olmx.api import CONFIG_GROUPS, GROUPS
from olmx.config.search_path import CONF_GROUP
from olmx.errors import ConfigError

if TYPE_CHECKING:
    from olmx.registry import Registry

#: Entry-point group of packages holding Hydra YAML (``conf/<group>/<option>.yaml``).
#: Every ``olmx.*`` entry-point group olmx reads.
KNOWN_GROUPS: tuple[str, ...] = (*GROUPS.values(), CONF_GROUP)
#: The plugin API range a new plugin declares: this API up to the next major version.
API_RANGE = f">={PLUGIN_API},<{int(PLUGIN_API.split('.')[0]) + 1}"
#: Seconds the import probe of :func:`check_plugin` may take.
PROBE_TIMEOUT = 300
#: Modules a plugin object's module must not import at module level (each takes seconds).
HEAVY_MODULES = ("torch", "olmo_core")

_KIND_BY_GROUP = {group: kind for kind, group in GROUPS.items()}


# ----------------------------------------------------------------------------- names


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


# ----------------------------------------------------------------------------- new


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


# ----------------------------------------------------------------------------- check


@dataclass
class Check:
    """One row of ``olmx plugins check``: passed when ``problem`` is empty."""

    #: What was checked (``entry points``, ``import``, ``protocol``, ``name``, ...).
    what: str
    #: The entry point or file it was checked on.
    subject: str
    #: Empty when the check passed, else what is wrong.
    problem: str = ""
    #: What was found when it passed.
    detail: str = ""


@dataclass
class _Package:
    dist: str
    version: str
    entry_points: str
    requires: list[str]
    #: Prepended to ``sys.path`` in the import probe (source dirs or the unpacked wheel).
    paths: list[str]
    where: str


@dataclass
class _Entry:
    group: str
    name: str
    module: str
    attr: str | None
    line: str


def check_plugin(target: str, *, console: Any = None) -> list[str]:
    """Check a plugin package without installing it; print a table to ``console`` (a rich
    Console) and return the problems found (empty when every check passed).

    ``target`` is a source tree (a directory with ``pyproject.toml``), a wheel, or the name of
    an installed distribution.
    """
    from olmx.registry import Registry

    installed = Registry.discover()
    with tempfile.TemporaryDirectory(prefix="olmx-check-") as tmp:
        package, checks = _read_package(target, Path(tmp))
        entries, parsed = _parse_entry_points(package.entry_points)
        checks += parsed
        checks += _check_requirement(package)
        checks += _check_names(package, entries, installed)
        probed, conf_files = _probe(package, entries, Path(tmp))
        checks += probed + _check_conf_options(package, conf_files, installed)
    problems = [f"{c.subject}: {c.problem}" if c.subject else c.problem for c in checks if c.problem]
    if console is not None:
        _print(console, package, checks, problems)
    return problems


def _read_package(target: str, tmp: Path) -> tuple[_Package, list[Check]]:
    path = Path(target).expanduser()
    if (path / "pyproject.toml").is_file():
        return _read_source_tree(path.resolve())
    if path.is_file() and path.suffix == ".whl":
        return _read_wheel(path.resolve(), tmp), []
    from importlib import metadata

    try:
        dist = metadata.distribution(target)
    except (metadata.PackageNotFoundError, ValueError):
        raise ConfigError(
            "TARGET",
            f"'{target}' is not a source tree (a directory with pyproject.toml), "
            "a .whl file or an installed distribution",
        ) from None
    return _Package(
        dist=dist.metadata["Name"],
        version=dist.version,
        entry_points=dist.read_text("entry_points.txt") or "",
        requires=list(dist.requires or []),
        paths=[],
        where="installed distribution",
    ), []


def _read_source_tree(root: Path) -> tuple[_Package, list[Check]]:
    import tomllib

    pyproject = root / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("TARGET", f"{pyproject} is not valid TOML: {exc}") from None
    checks: list[Check] = []
    if "entry-points" in project.get("dynamic", []):
        checks.append(
            Check("entry points", "pyproject.toml", "entry points are dynamic; build a wheel and check it instead")
        )
    # [project.entry-points] tables -> entry_points.txt text, as a build backend writes it.
    lines: list[str] = []
    for group, table in (project.get("entry-points") or {}).items():
        lines.append(f"[{group}]")
        if not isinstance(table, dict):
            checks.append(Check("entry points", group, 'must be a table of name = "module:object"'))
            continue
        for name, value in table.items():
            lines.append(f"{name} = {value}")
        lines.append("")
    paths = [str(p) for p in (root / "src", root) if p.is_dir()]
    return _Package(
        dist=str(project.get("name", root.name)),
        version=str(project.get("version", "?")),
        entry_points="\n".join(lines),
        requires=list(project.get("dependencies", [])),
        paths=paths,
        where=f"source tree {root}",
    ), checks


def _read_wheel(wheel: Path, tmp: Path) -> _Package:
    import zipfile
    from email.parser import Parser

    try:
        with zipfile.ZipFile(wheel) as zf:
            infos = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if not infos:
                raise ConfigError("TARGET", f"{wheel.name} has no *.dist-info/METADATA: not a wheel")
            info = infos[0].rsplit("/", 1)[0]
            meta = Parser().parsestr(zf.read(f"{info}/METADATA").decode("utf-8"))
            names = set(zf.namelist())
            text = zf.read(f"{info}/entry_points.txt").decode("utf-8") if f"{info}/entry_points.txt" in names else ""
            unpacked = tmp / "wheel"
            zf.extractall(unpacked)
    except zipfile.BadZipFile:
        raise ConfigError("TARGET", f"{wheel} is not a valid wheel (zip) file") from None
    return _Package(
        dist=meta["Name"] or wheel.name,
        version=meta["Version"] or "?",
        entry_points=text,
        requires=meta.get_all("Requires-Dist") or [],
        paths=[str(unpacked)],
        where=f"wheel {wheel.name}",
    )


def _parse_entry_points(text: str) -> tuple[list[_Entry], list[Check]]:
    """Parse ``entry_points.txt`` text line by line with entry-points-txt, so that every
    malformed line is reported (not only the first)."""
    import entry_points_txt as ept

    entries: list[_Entry] = []
    checks: list[Check] = []
    group: str | None = None
    seen: set[tuple[str, str]] = set()
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            try:
                ept.loads(line + "\n")
                group = line[1:].partition("]")[0].strip()
            except ept.ParseError as exc:
                checks.append(Check("entry points", f"line {n}", f"malformed group header {line!r}: {exc}"))
                group = None
            else:
                if group.startswith("olmx.") and group not in KNOWN_GROUPS:
                    checks.append(
                        Check("entry points", f"[{group}]", f"unknown olmx group; olmx reads {', '.join(KNOWN_GROUPS)}")
                    )
            continue
        if group is None:
            checks.append(Check("entry points", f"line {n}", f"{line!r} is not under a valid [group] header"))
            continue
        if not group.startswith("olmx."):
            continue
        try:
            parsed = ept.loads(f"[{group}]\n{line}\n")
        except ept.ParseError as exc:
            checks.append(Check("entry points", f"{group}: {line}", f"malformed line: {exc}"))
            continue
        ep = next(iter(parsed[group].values()))
        subject = f"{group}:{ep.name}"
        if (group, ep.name) in seen:
            checks.append(Check("entry points", subject, "declared twice (the last one would silently win)"))
            continue
        seen.add((group, ep.name))
        if group not in KNOWN_GROUPS:
            continue
        if not ep.name.isidentifier() or keyword.iskeyword(ep.name):
            fix = re.sub(r"\W", "_", ep.name)
            checks.append(
                Check(
                    "entry points",
                    subject,
                    f"'{ep.name}' is the Hydra option name and config key: it must be a Python identifier (e.g. {fix})",
                )
            )
            continue
        if group == CONF_GROUP and ep.attr:
            checks.append(
                Check(
                    "entry points",
                    subject,
                    f"'{ep.to_line()}': an olmx.conf value names a package holding YAML (module only, no ':object')",
                )
            )
            continue
        if group != CONF_GROUP and not ep.attr:
            checks.append(
                Check(
                    "entry points",
                    subject,
                    f"'{ep.to_line()}' names a module; it must name the plugin object (module:OBJECT)",
                )
            )
            continue
        entries.append(_Entry(group, ep.name, ep.module, ep.attr, ep.to_line()))
        checks.append(Check("entry points", subject, detail=ep.to_line()))
    if not entries and not any(c.problem for c in checks):
        checks.append(
            Check("entry points", "", f"declares no entry point in an olmx group ({', '.join(KNOWN_GROUPS)})")
        )
    return entries, checks


def _check_requirement(package: _Package) -> list[Check]:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    if canonicalize_name(package.dist) == "olmx":
        return []
    for text in package.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "olmx" or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        if req.specifier and not req.specifier.contains(__version__, prereleases=True):
            return [Check("olmx requirement", str(req), f"excludes this olmx {__version__}")]
        return [Check("olmx requirement", str(req), detail=f"olmx {__version__} satisfies it")]
    return [
        Check(
            "olmx requirement", package.dist, 'does not depend on olmx (add e.g. "olmx>=0.1" to [project] dependencies)'
        )
    ]


def _check_names(package: _Package, entries: list[_Entry], installed: Registry) -> list[Check]:
    """Names already taken by an installed plugin of another distribution."""
    from packaging.utils import canonicalize_name

    own = canonicalize_name(package.dist)
    checks = []
    for e in entries:
        if e.group == CONF_GROUP:
            continue
        kind = _KIND_BY_GROUP[e.group]
        others = [o for o in installed.entries(kind) if o.name == e.name and canonicalize_name(o.dist) != own]
        if others:
            o = others[0]
            who = "first party, it wins" if o.first_party else "installed first, it wins"
            checks.append(
                Check(
                    "name",
                    f"{e.group}:{e.name}",
                    f"clashes with the {kind} plugin '{e.name}' of {o.dist} {o.version} ({who})",
                )
            )
        else:
            checks.append(Check("name", f"{e.group}:{e.name}", detail="no installed plugin has it"))
    return checks


def _probe(package: _Package, entries: list[_Entry], tmp: Path) -> tuple[list[Check], dict[str, list[str]]]:
    """Import every entry in a fresh Python with the package's paths first on ``sys.path``;
    return its checks and the YAML files of each ``olmx.conf`` entry."""
    if not entries:
        return [], {}
    request = tmp / "probe-request.json"
    result = tmp / "probe-result.json"
    request.write_text(
        json.dumps(
            {
                "paths": package.paths,
                "dist": package.dist,
                "version": package.version,
                "entries": [e.__dict__ for e in entries],
            }
        )
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "olmx.plugin_tools", str(request), str(result)],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )  # write nothing into the tree
    except subprocess.TimeoutExpired:
        return [Check("import", package.dist, f"importing the plugins took over {PROBE_TIMEOUT} s")], {}
    found = json.loads(result.read_text()) if result.is_file() else {"rows": [], "conf": {}}
    checks = [Check(**row) for row in found["rows"]]
    if proc.returncode != 0 or not found.get("done"):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        checks.append(Check("import", package.dist, f"the import probe died: {tail[0]}"))
    return checks, found["conf"]


def _check_conf_options(package: _Package, conf: dict[str, list[str]], installed: Registry) -> list[Check]:
    """YAML options that olmx's own tree hides, or that replace another package's plugin option."""
    from packaging.utils import canonicalize_name

    from olmx.config.compose import conf_dir

    kinds = {group: kind for kind, group in CONFIG_GROUPS.items()}
    own = canonicalize_name(package.dist)
    checks = []
    for subject, files in conf.items():
        for f in files:
            parts = Path(f).parts
            if len(parts) != 2:
                continue
            group, option = parts[0], parts[1].removesuffix(".yaml")
            if (conf_dir() / group / f"{option}.yaml").is_file():
                checks.append(
                    Check(
                        "conf",
                        f"{subject} {f}",
                        f"olmx's own conf/{group}/{option}.yaml takes precedence: this file would never be used",
                    )
                )
                continue
            other = installed.entry(kinds[group], option) if group in kinds else None
            if other is not None and canonicalize_name(other.dist) != own:
                checks.append(
                    Check(
                        "conf",
                        f"{subject} {f}",
                        f"would replace the option '{option}' of the {kinds[group]} plugin from {other.dist}",
                    )
                )
    return checks


def _probe_main(request_path: str, result_path: str) -> None:
    """In the probe process: load each entry, check it like the registry does, write rows."""
    import dataclasses
    import importlib.util

    import entry_points_txt as ept

    from olmx.registry import PluginEntry, _check_protocol

    request = json.loads(Path(request_path).read_text())
    sys.path[:0] = request["paths"]
    loaded_heavy = {m for m in HEAVY_MODULES if m in sys.modules}
    rows: list[dict[str, str]] = []
    conf_files: dict[str, list[str]] = {}

    def save(done: bool = False) -> None:
        Path(result_path).write_text(json.dumps({"rows": rows, "conf": conf_files, "done": done}))

    def add(what: str, subject: str, problem: str = "", detail: str = "") -> None:
        rows.append(dataclasses.asdict(Check(what, subject, problem, detail)))
        save()  # kept current in case a plugin kills this process

    for e in request["entries"]:
        subject = f"{e['group']}:{e['name']}"
        if e["group"] == CONF_GROUP:
            try:
                spec = importlib.util.find_spec(e["module"])
            except BaseException as exc:  # a parent package's __init__ may raise anything
                spec, error = None, f"{type(exc).__name__}: {exc}"
            else:
                error = f"no package '{e['module']}'"
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
            if not locations:
                add("conf", subject, f"{error}: the olmx.conf value must be a package holding YAML")
                continue
            files = sorted(str(p.relative_to(loc)) for loc in locations for p in Path(loc).rglob("*.yaml"))
            conf_files[subject] = files
            bad = _bad_yaml(locations)
            if bad:
                add("conf", subject, bad)
            elif not files:
                add("conf", subject, f"package '{e['module']}' holds no YAML (conf/<group>/<option>.yaml)")
            else:
                add("conf", subject, detail=", ".join(f.removesuffix(".yaml") for f in files))
            continue
        try:
            obj = ept.EntryPoint(e["group"], e["name"], e["module"], e["attr"], ()).load()
        except BaseException as exc:  # SystemExit too: a plugin must not end the probe
            add("import", subject, f"{type(exc).__name__}: {exc}".strip())
            continue
        where = getattr(sys.modules.get(e["module"]), "__file__", "") or ""
        heavy = [m for m in HEAVY_MODULES if m in sys.modules and m not in loaded_heavy]
        loaded_heavy.update(heavy)
        if heavy:
            add(
                "import",
                subject,
                f"importing {e['module']} imports {' and '.join(heavy)}; olmx loads every "
                "plugin to compose a run, so import them inside the methods that need them",
            )
        else:
            add("import", subject, detail=f"{e['module']} from {where}")
        kind = _KIND_BY_GROUP[e["group"]]
        entry = PluginEntry(kind, e["name"], e["line"].split(" = ", 1)[1], request["dist"], request["version"])
        found = _check_protocol(entry, obj)
        if found is None:
            add("protocol", subject, detail=f"{kind} plugin, API '{obj.api}' includes {PLUGIN_API}")
        else:
            add("plugin API" if found[0] == "incompatible" else "protocol", subject, found[1])
    save(done=True)


def _bad_yaml(locations: list[str]) -> str:
    import yaml

    for loc in locations:
        for p in sorted(Path(loc).rglob("*.yaml")):
            try:
                yaml.safe_load(p.read_text(encoding="utf-8"))
            except (yaml.YAMLError, UnicodeDecodeError) as exc:
                return f"{p.relative_to(loc)} is not valid YAML: {str(exc).splitlines()[0]}"
    return ""


def _print(console: Any, package: _Package, checks: list[Check], problems: list[str]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"olmx plugins check: {package.dist} {package.version} ({package.where})", title_justify="left")
    for col in ("check", "entry", "result"):
        table.add_column(col)
    order = {c.subject: i for i, c in reversed(list(enumerate(checks)))}  # group rows by entry
    for c in sorted(checks, key=lambda c: order[c.subject]):
        result = (
            Text.assemble(("FAIL", "bold red"), f" {c.problem}")
            if c.problem
            else Text.assemble(("ok", "green"), f" {c.detail}" if c.detail else "")
        )
        table.add_row(c.what, c.subject, result)
    console.print(table)
    if problems:
        console.print(Text(f"{len(problems)} problem(s); nothing was installed.", style="bold red"))
    else:
        console.print(Text("all checks passed", style="bold green"))


if __name__ == "__main__":  # the import probe of check_plugin
    _probe_main(*sys.argv[1:3])
