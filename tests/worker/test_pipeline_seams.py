"""The pipeline's private seams (:data:`olmx.worker.pipeline_seams.PRIVATE_SEAMS`): each exists in
the installed OLMo-core and torch, the table lists every private name the pipeline modules use
(and no other), and an installation without one is refused naming it. No processes."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

import olmx.worker.pipeline
import olmx.worker.pipeline_schedule
from olmx.worker.pipeline_seams import PRIVATE_SEAMS, Seam, check_seams, missing_seams, seam_exists

MODULES = (olmx.worker.pipeline, olmx.worker.pipeline_schedule)


def test_every_seam_exists_in_the_installed_olmo_core_and_torch():
    from importlib.metadata import version

    assert version("ai2-olmo-core") == "3.0.0"
    assert not missing_seams(), f"torch {version('torch')}: {[str(s) for s in missing_seams()]}"
    check_seams()


def private_names_used(module) -> set[str]:
    """The private names ``module``'s code reaches on other objects: attributes (``x._name``),
    imports (``from m import _name``) and the private methods of OLMo-core's classes it overrides,
    less the names it defines itself (its functions, classes, methods and the attributes its own
    classes, those without bases, set on ``self``)."""
    tree = ast.parse(inspect.getsource(module))
    used, own, overrides = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names if alias.name.startswith("_")}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            own.add(node.name)
        if isinstance(node, ast.ClassDef) and node.bases:
            bases = [getattr(module, base.id) for base in node.bases if isinstance(base, ast.Name)]
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and any(hasattr(base, sub.name) for base in bases):
                    overrides.add(sub.name)
        if isinstance(node, ast.ClassDef) and not node.bases:
            for sub in ast.walk(node):
                targets = sub.targets if isinstance(sub, ast.Assign) else [getattr(sub, "target", None)]
                for target in targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                        own.add(target.attr)
    return used - own | {name for name in overrides if name.startswith("_") and not name.startswith("__")}


def test_the_table_lists_every_private_name_the_pipeline_uses_and_no_other():
    listed = {seam.attribute for seam in PRIVATE_SEAMS}
    used = set().union(*(private_names_used(m) for m in MODULES))
    assert used, "the scan finds nothing: it would pass any table"
    assert used <= listed, f"private names used but not in PRIVATE_SEAMS: {sorted(used - listed)}"
    text = "\n".join(inspect.getsource(m) for m in MODULES)
    stale = [
        str(s) for s in PRIVATE_SEAMS if not s.attribute.startswith("__") and not re.search(rf"\b{s.attribute}\b", text)
    ]
    assert not stale, f"seams the pipeline modules no longer name: {stale}"


@pytest.mark.parametrize(
    "seam",
    [
        Seam("torch.nn.modules.module:Module", "_forward_hooks_gone", "a hook dict that was renamed"),
        Seam("olmo_core.nn.transformer.model:Transformer", "init_weights", "changed", needs=("self.no_such_call(",)),
        Seam("torch.distributed.pipelining.no_such_module", "_x", "a module that moved"),
    ],
    ids=["attribute", "behaviour", "module"],
)
def test_an_installation_without_a_seam_is_refused_naming_it(seam):
    assert not seam_exists(seam)
    with pytest.raises(RuntimeError, match=re.escape(str(seam))) as err:
        check_seams((*PRIVATE_SEAMS, seam))
    assert "ai2-olmo-core==3.0.0" in str(err.value) and seam.use in str(err.value)
