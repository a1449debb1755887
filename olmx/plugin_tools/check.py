"""``olmx plugins check``: check a plugin package's entry points, requirement, names and objects.

:func:`check_plugin` reads the target (:mod:`.package`), parses its ``entry_points.txt`` line
by line with entry-points-txt, checks its olmx requirement and that its names are free,
imports its plugins in a separate process (:mod:`.probe`), checks the YAML options it ships
and prints every row in a table.
"""

from __future__ import annotations

import keyword
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmx import __version__
from olmx.config.search_path import CONF_GROUP
from olmx.kinds import CONFIG_GROUPS

from .names import KIND_BY_GROUP, KNOWN_GROUPS
from .package import Check, Entry, Package, read_package
from .probe import run_probe

if TYPE_CHECKING:
    from olmx.registry import Registry


def check_plugin(target: str, *, console: Any = None) -> list[str]:
    """Check a plugin package without installing it; print a table to ``console`` (a rich
    Console) and return the problems found (empty when every check passed).

    ``target`` is a source tree (a directory with ``pyproject.toml``), a wheel, or the name of
    an installed distribution.
    """
    from olmx.registry import Registry

    installed = Registry.discover()
    with tempfile.TemporaryDirectory(prefix="olmx-check-") as tmp:
        package, checks = read_package(target, Path(tmp))
        entries, parsed = _parse_entry_points(package.entry_points)
        checks += parsed
        checks += _check_requirement(package)
        checks += _check_names(package, entries, installed)
        probed, conf_files = run_probe(package, entries, Path(tmp))
        checks += probed + _check_conf_options(package, conf_files, installed)
    problems = [f"{c.subject}: {c.problem}" if c.subject else c.problem for c in checks if c.problem]
    if console is not None:
        _print(console, package, checks, problems)
    return problems


def _parse_entry_points(text: str) -> tuple[list[Entry], list[Check]]:
    """Parse ``entry_points.txt`` text line by line with entry-points-txt, so that every
    malformed line is reported (not only the first)."""
    import entry_points_txt as ept

    entries: list[Entry] = []
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
        entries.append(Entry(group, ep.name, ep.module, ep.attr, ep.to_line()))
        checks.append(Check("entry points", subject, detail=ep.to_line()))
    if not entries and not any(c.problem for c in checks):
        checks.append(
            Check("entry points", "", f"declares no entry point in an olmx group ({', '.join(KNOWN_GROUPS)})")
        )
    return entries, checks


def _check_requirement(package: Package) -> list[Check]:
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


def _check_names(package: Package, entries: list[Entry], installed: Registry) -> list[Check]:
    """Names already taken by an installed plugin of another distribution."""
    from packaging.utils import canonicalize_name

    own = canonicalize_name(package.dist)
    checks = []
    for e in entries:
        if e.group == CONF_GROUP:
            continue
        kind = KIND_BY_GROUP[e.group]
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


def _check_conf_options(package: Package, conf: dict[str, list[str]], installed: Registry) -> list[Check]:
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


def _print(console: Any, package: Package, checks: list[Check], problems: list[str]) -> None:
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
