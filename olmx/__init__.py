"""olmx: declarative pre-training of OLMo-style language models on OLMo-core.

The one way through is ``argv -> DictConfig -> RunConfig -> Plan -> (model, train module) ->
processes``; see ``docs`` in the repository and :mod:`olmx.cli`.
"""

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = ["__version__", "PLUGIN_API"]

__version__ = "0.1.0"

#: Version of the plugin contract in :mod:`olmx.api`. A plugin declares the range it
#: supports (``api = ">=3.0,<4"``); the registry refuses a plugin whose range excludes this.
#: 2.0: base classes with hooks as code, hooks get ``(cfg, plan)`` or ``(cfg, ctx)``, the mesh
#: and dtypes as capabilities (docs/plugins.md). 2.1: typed ``Decisions``, the mesh's ``tp``
#: and ``LayerPlugin.tensor_parallel``, the public surface (``olmx.api.PUBLIC_MODULES``), and
#: a precision plugin's section flat like infra's (its YAML preset ``name: NAME`` plus fields).
#: 3.0: ``apply_train_module(cfg, train_module, plan, param_names)`` gets and returns OLMo-core's
#: ``TransformerTrainModuleConfig`` (it edited a dict of its keyword arguments) and sees the
#: model's parameter names; the mesh's ``pp``, ``LayerPlugin.pipeline_parallel``, and
#: ``Contribution.microbatches_in_flight`` / ``idle_fraction``.
PLUGIN_API = "3.0"
