"""The dependency rules of the code base, checked on its source (import-linter's job, done with
``ast`` so that it needs nothing installed):

* no import cycles among olmx's and the first-party plugins' files (imports inside functions
  count too; those under ``if TYPE_CHECKING:`` do not), counting the package ``__init__`` an
  import runs, and none among their packages (``olmx.plan`` importing ``olmx.launch``, which
  imports ``olmx.plan``, is a cycle even where no file imports itself back);
* plugins import from olmx only the public surface (``olmx.api.PUBLIC_MODULES``, ``__all__``);
* no plugin imports another plugin: a plugin is the module an entry point names, or its
  package when that module lives in one (``olmx_plugins.layers.moe``); modules beside them
  that no entry point names are shared helpers, which import no plugin;
* the core (``olmx``) imports no first-party plugin and names none: no string constant in its
  code (docstrings aside) is a first-party plugin's name.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.conftest import REPO

PACKAGES = {"olmx": REPO / "olmx", "olmx_plugins": REPO / "plugins"}


def modules() -> dict[str, Path]:
    """Module name -> source file, for every module of olmx and olmx_plugins."""
    out = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The internal modules ``name`` imports, wherever in the file (not for type checking)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if _type_checking(node) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out |= {t for t in targets if t in known and t != name}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def first_party_entry_points() -> dict[str, str]:
    """First-party plugin name -> the module its entry point names."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        name: value.split(":")[0]
        for group, entries in project["entry-points"].items()
        if group.startswith("olmx.")
        for name, value in entries.items()
    }


def unit_of(module: str, plugin_modules: set[str]) -> str | None:
    """The plugin a module belongs to (None: a shared helper or the core)."""
    for target in plugin_modules:
        package = target.rpartition(".")[0]
        is_package_plugin = (
            REPO / "plugins" / Path(*package.split(".")[1:]) / "__init__.py"
        ).is_file() and package.count(".") >= 2
        unit = package if is_package_plugin else target
        if module == unit or module.startswith(unit + "."):
            return unit
    return None


def with_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` plus what importing a module runs first: the ``__init__`` of each package
    above it (importing ``a.b.c`` runs ``a`` and ``a.b``), except the importer's own packages,
    which are already running."""
    out: dict[str, set[str]] = {}
    for module, targets in edges.items():
        out[module] = set(targets)
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                package = ".".join(parts[:i])
                if package in edges and package != module and not module.startswith(package + "."):
                    out[module].add(package)
    return out


def package_of(module: str) -> str:
    """The unit a package-level cycle is counted between: olmx's top-level modules and packages
    (``olmx.api``, ``olmx.plan``), a first-party plugin's kind package member
    (``olmx_plugins.layers.moe``)."""
    return ".".join(module.split(".")[: 3 if module.startswith("olmx_plugins.") else 2])


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` between :func:`package_of` units (a unit's imports of itself dropped)."""
    out: dict[str, set[str]] = {}
    for module, targets in edges.items():
        unit = package_of(module)
        out.setdefault(unit, set()).update(package_of(t) for t in targets if package_of(t) != unit)
    return out


def test_there_are_no_import_cycles():
    """Among modules, and counting the packages an import runs (a cycle through a package's
    ``__init__`` is a cycle: ``olmx.api`` importing ``olmx.plan.linears`` ran ``olmx.plan``, which
    imports the registry, which imports ``olmx.api``)."""
    assert cycles(graph()) == []
    assert cycles(with_packages(graph())) == []


def test_there_are_no_package_cycles():
    """Among olmx's packages and top-level modules: the plugin contract (``olmx.api``) and the
    leaves it re-exports (``olmx.kinds``, ``olmx.types``, ``olmx.rules``) import no stage; the
    plan reads the GPU tables from ``olmx.hardware``, not from the launchers."""
    assert cycles(packages(graph())) == []


def test_the_cycle_finder_finds_a_cycle_and_one_through_a_package():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = {"p": {"q.x"}, "p.y": set(), "q": set(), "q.x": {"p.y"}}  # no cycle among modules
    assert cycles(edges) == []
    assert cycles(with_packages(edges)) == [["p", "q.x"]]  # q.x imports p.y, which runs p; p imports q.x
    # olmx.api -> olmx.config.rules, olmx.config.compose -> olmx.api: no file cycle, a package one
    edges = {"olmx.api": {"olmx.config.rules"}, "olmx.config.rules": set(), "olmx.config.compose": {"olmx.api"}}
    assert cycles(with_packages(edges)) == []
    assert cycles(packages(edges)) == [["olmx.api", "olmx.config"]]


def test_plugins_import_only_the_public_surface():
    """A plugin (first-party, or an example third-party package) imports from olmx only the
    modules :data:`olmx.api.PUBLIC_MODULES` declares, and from each only the names in its
    ``__all__``; each public module has an ``__all__`` whose names it defines."""
    import importlib

    from olmx.api import PUBLIC_MODULES

    surface = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
        assert [n for n in module.__all__ if not hasattr(module, n)] == [], name
        surface[name] = set(module.__all__)
    files = [*(REPO / "plugins").rglob("*.py"), *(REPO / "examples").glob("*/olmx_*/**/*.py")]
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "olmx":
                module = node.module or ""
                if module not in surface:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} imports {module}")
                else:
                    bad += [
                        f"{path.relative_to(REPO)}:{node.lineno} imports {module}.{a.name} (not in its __all__)"
                        for a in node.names
                        if a.name not in surface[module]
                    ]
            elif isinstance(node, ast.Import):
                bad += [
                    f"{path.relative_to(REPO)}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "olmx" and a.name not in surface
                ]
    assert bad == []


def test_no_plugin_imports_another_plugin():
    plugin_modules = set(first_party_entry_points().values())
    bad = []
    for module, targets in graph().items():
        if not module.startswith("olmx_plugins."):
            continue
        mine = unit_of(module, plugin_modules)
        for target in targets:
            theirs = unit_of(target, plugin_modules)
            if theirs is not None and theirs != mine:
                bad.append(f"{module} imports {target} (plugin {theirs})")
    assert bad == []


#: First-party plugin names that are also ordinary values in the core's vocabulary: ``auto``
#: (the precision plugin) is the word for "olmx chooses" in ``model.attn_backend=auto``,
#: ``trainer.compile=auto`` and the MoE backend; ``tp`` and ``pp`` (tensor and pipeline parallel) are also
#: the names of the mesh dimensions they claim, as ``cp`` is; such a string names no plugin.
COMMON_WORDS = {"auto", "tp", "pp"}


def test_the_core_imports_and_names_no_first_party_plugin():
    names = set(first_party_entry_points()) - COMMON_WORDS
    bad = []
    for module, path in modules().items():
        if not module.startswith("olmx.") and module != "olmx":
            continue
        bad += [f"{module} imports {t}" for t in imports(module, path, set(modules())) if t.startswith("olmx_plugins")]
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        }
        bad += [
            f"{module}:{n.lineno} names the plugin '{n.value}'"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in docstrings
        ]
    assert bad == []


def test_the_plan_never_imports_the_worker_and_data_imports_neither():
    """Data is one torch-free package that the plan and the worker both import (``olmx.data``);
    the plan (torch-free, run where the run is described) never imports the worker, and data
    imports neither stage nor torch nor OLMo-core."""
    edges = graph()
    bad = [
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in targets
        if (module.startswith("olmx.plan") and target.startswith("olmx.worker"))
        or (module.startswith("olmx.data") and target.startswith(("olmx.plan", "olmx.worker")))
    ]
    for module, path in modules().items():
        if module.startswith("olmx.data"):
            tree = ast.parse(path.read_text())
            bad += [
                f"{module} imports {alias.name}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
                if alias.name.split(".")[0] in ("torch", "olmo_core")
            ]
    assert bad == []
