"""Package list for setuptools: `plugins/` installs as `olmx_plugins`, `conf/` and `templates/`
as package data under `olmx` (the mapping itself is in pyproject.toml). Every folder of package
data is listed as a package (`olmx.conf.model`, `olmx.templates.slurm`, ...): setuptools warns,
once per folder, about data folders that are importable but not in `packages`."""

import os

from setuptools import find_packages, setup


def data_packages(package: str, folder: str) -> list[str]:
    """``package`` and one dotted name per sub-folder of ``folder`` (data, not Python code)."""
    names = [package]
    for root, dirs, _ in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(root, folder)
        if rel != ".":
            names.append(f"{package}.{rel.replace(os.sep, '.')}")
    return names


setup(
    packages=[
        "olmx",
        *(f"olmx.{p}" for p in find_packages("olmx")),
        "olmx_plugins",
        *(f"olmx_plugins.{p}" for p in find_packages("plugins")),
        *data_packages("olmx.conf", "conf"),
        *data_packages("olmx.templates", "templates"),
    ]
)
