"""olmx-layerscale: the olmx layer plugin ``layerscale`` (object :data:`olmx_layerscale.plugin.LAYERSCALE`).

A third-party plugin package, written only against olmx's plugin contract
(:mod:`olmx.api`); nothing in olmx names it. Importing this package is cheap: the torch
module (:mod:`olmx_layerscale.modules`) is imported only when a model is edited.
"""
