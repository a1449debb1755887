"""olmx: declarative pre-training of OLMo-style language models on OLMo-core.

The one way through is ``argv -> DictConfig -> RunConfig -> Plan -> (model, train module) ->
processes``; see ``docs`` in the repository and :mod:`olmx.cli`.
"""

__version__ = "0.1.0"

#: Version of the plugin contract in :mod:`olmx.api`. A plugin declares the range it
#: supports (``api = ">=1.0,<2"``); the registry refuses a plugin whose range excludes this.
PLUGIN_API = "1.0"
