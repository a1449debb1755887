"""The documentation holds for the code as it is: docs/architecture.md's layout names every module
of olmx and every first-party plugin, and nothing that is gone."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import REPO

#: Where the layout's descriptions start: a token before this column is a path.
DESCRIPTION_COLUMN = 30


def layout_paths() -> set[str]:
    """The paths the layout tree of docs/architecture.md names (``olmx/plan/codec.py``,
    ``plugins/infra/runpod/``), built from its indentation (two spaces a level)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## Layout\n", 1)[1].split("```\n", 2)[1]
    stack: list[str] = []
    out = set()
    for line in block.splitlines():
        m = re.match(r"( *)(\S+)", line)
        if not m or len(m.group(1)) >= DESCRIPTION_COLUMN or not m.group(2).endswith(("/", ".py")):
            continue
        depth = len(m.group(1)) // 2
        del stack[depth:]
        path = "".join(stack) + m.group(2)
        out.add(path)
        if path.endswith("/"):
            stack.append(m.group(2))
    return out


def olmx_modules() -> set[str]:
    """Every module of olmx, by path: a package by its folder, a module by its file."""
    out = set()
    for path in (REPO / "olmx").rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        out.add(rel.rpartition("/")[0] + "/" if path.name == "__init__.py" else rel)
    return out


def first_party_plugins() -> set[str]:
    """Every first-party plugin (the module its entry point names, or that module's package
    below the kind's folder) and every shared helper module beside them, by path."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out = set()
    for group, entries in project["entry-points"].items():
        if group == "olmx.conf":
            continue
        for target in entries.values():
            module = target.split(":")[0].removeprefix("olmx_plugins.").split(".")
            # plugins/<kind>/<name>.py, or the package plugins/<kind>/<name>/
            out.add("plugins/" + ("/".join(module) + ".py" if len(module) == 2 else "/".join(module[:2]) + "/"))
    for kind in (REPO / "plugins").iterdir():
        if kind.is_dir() and (kind / "__init__.py").is_file():
            out |= {p.relative_to(REPO).as_posix() for p in kind.glob("*.py") if p.name != "__init__.py"}
    return out


def test_the_layout_names_every_module_and_plugin() -> None:
    named = layout_paths()
    assert "olmx/plan/codec.py" in named and "plugins/infra/runpod/" in named  # the parser reads the tree
    missing = sorted((olmx_modules() | first_party_plugins()) - named)
    assert not missing, f"docs/architecture.md's layout does not name {missing}"


def test_the_layout_names_nothing_that_is_gone() -> None:
    gone = sorted(p for p in layout_paths() if not (REPO / p).exists())
    assert not gone, f"docs/architecture.md's layout names {gone}, which do not exist"


def test_the_readme_lists_every_experiment() -> None:
    readme = (REPO / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| `experiment` |")]
    missing = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml") if f"`{p.stem}`" not in row)
    assert not missing, f"README.md's experiment row does not list {missing}"
