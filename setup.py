"""Package list for setuptools: `plugins/` installs as `olmx_plugins`, `conf/` and `templates/`
as package data under `olmx` (the mapping itself is in pyproject.toml)."""
from setuptools import find_packages, setup

setup(
    packages=[
        "olmx",
        *(f"olmx.{p}" for p in find_packages("olmx")),
        "olmx_plugins",
        *(f"olmx_plugins.{p}" for p in find_packages("plugins")),
        "olmx.conf",
        "olmx.templates",
    ]
)
