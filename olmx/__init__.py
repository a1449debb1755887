"""olmx: declarative pre-training of OLMo-style language models on OLMo-core.

The one way through is ``argv -> DictConfig -> RunConfig -> Plan -> (model, train module) ->
processes``; see ``docs`` in the repository and :mod:`olmx.cli`.
"""

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = ["__version__", "PLUGIN_API"]

__version__ = "0.1.0"

#: Version of the plugin contract in :mod:`olmx.api`. A plugin declares the range it
#: supports (``api = ">=2.0,<3"``); the registry refuses a plugin whose range excludes this.
#: 2.0: base classes with hooks as code, hooks get ``(cfg, plan)`` or ``(cfg, ctx)``, the mesh
#: and dtypes as capabilities (docs/plugins.md). 2.1: typed ``Decisions``, the mesh's ``tp``
#: and ``LayerPlugin.tensor_parallel``, the public surface (``olmx.api.PUBLIC_MODULES``), and
#: a precision plugin's section flat like infra's (its YAML preset ``name: NAME`` plus fields).
PLUGIN_API = "2.1"
