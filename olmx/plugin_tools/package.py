"""What ``olmx plugins check`` is given, read without installing it, and the rows it reports.

:func:`read_package` reads a source tree (``pyproject.toml``), a wheel or an installed
distribution into a :class:`Package` (name, version, ``entry_points.txt`` text, requirements,
the paths its modules import from); every step of the check reports :class:`Check` rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from olmx.errors import ConfigError


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
class Package:
    """The plugin package under check: its metadata and entry points, as read from the target."""

    dist: str
    version: str
    entry_points: str
    requires: list[str]
    #: Prepended to ``sys.path`` in the import probe (source dirs or the unpacked wheel).
    paths: list[str]
    where: str


@dataclass
class Entry:
    """One well-formed entry point in an olmx group, as ``olmx plugins check`` parsed it."""

    group: str
    name: str
    module: str
    attr: str | None
    line: str


def read_package(target: str, tmp: Path) -> tuple[Package, list[Check]]:
    """``target`` (a source tree, a wheel unpacked under ``tmp``, or an installed distribution
    name) as a :class:`Package`, with the problems found while reading it."""
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
    return Package(
        dist=dist.metadata["Name"],
        version=dist.version,
        entry_points=dist.read_text("entry_points.txt") or "",
        requires=list(dist.requires or []),
        paths=[],
        where="installed distribution",
    ), []


def _read_source_tree(root: Path) -> tuple[Package, list[Check]]:
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
    return Package(
        dist=str(project.get("name", root.name)),
        version=str(project.get("version", "?")),
        entry_points="\n".join(lines),
        requires=list(project.get("dependencies", [])),
        paths=paths,
        where=f"source tree {root}",
    ), checks


def _read_wheel(wheel: Path, tmp: Path) -> Package:
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
    return Package(
        dist=meta["Name"] or wheel.name,
        version=meta["Version"] or "?",
        entry_points=text,
        requires=meta.get_all("Requires-Dist") or [],
        paths=[str(unpacked)],
        where=f"wheel {wheel.name}",
    )
