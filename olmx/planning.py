"""A run's plan from overrides, as ``olmx train OVERRIDES --dry-run`` makes it: the public entry
for plugin packages (their tests, their own commands). Nothing is written or launched. And the
one writability rule (:func:`check_writable`), for a plugin's ``resolve`` to check a place it
will write outside the run directory (which the core checks).

    from olmx.planning import plan_run

    plan = plan_run(["layers=[my_layer]", "layers.my_layer.width=64"])
    assert "layers.my_layer" in plan.sections
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from olmx.writable import check_writable

if TYPE_CHECKING:
    from olmx.plan import Plan
    from olmx.registry import Registry

__all__ = ["plan_run", "check_writable"]


def plan_run(overrides: list[str], reg: Registry | None = None) -> Plan:
    """The plan of ``olmx train OVERRIDES`` with the installed plugins (or those ``reg``
    loads): composed, typed, checked and resolved; bad input raises
    :class:`olmx.errors.ConfigError` as the CLI reports it."""
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    return plan_from_overrides(list(overrides), reg or registry())
