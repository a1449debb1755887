"""The import probe of ``olmx plugins check``: load a package's plugins in a separate Python process.

:func:`run_probe` (in the calling process) writes a request file and starts
``python -m olmx.plugin_tools.probe REQUEST RESULT``; :func:`main` (in the probe process) puts
the package's paths first on ``sys.path``, loads each entry point, checks it as the registry
does and writes :class:`~.package.Check` rows to the result file, kept current in case a
plugin kills the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from olmx import PLUGIN_API
from olmx.config.search_path import CONF_GROUP

from .names import KIND_BY_GROUP
from .package import Check, Entry, Package

#: Seconds the import probe of :func:`.check.check_plugin` may take.
PROBE_TIMEOUT = 300
#: Modules a plugin object's module must not import at module level (each takes seconds).
HEAVY_MODULES = ("torch", "olmo_core")


def run_probe(package: Package, entries: list[Entry], tmp: Path) -> tuple[list[Check], dict[str, list[str]]]:
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
            [sys.executable, "-m", "olmx.plugin_tools.probe", str(request), str(result)],
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


def main(request_path: str, result_path: str) -> None:
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
        kind = KIND_BY_GROUP[e["group"]]
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


if __name__ == "__main__":  # the import probe of check_plugin
    main(*sys.argv[1:3])
