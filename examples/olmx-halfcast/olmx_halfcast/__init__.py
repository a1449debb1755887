"""olmx-halfcast: the olmx precision plugin ``halfcast`` (object :data:`olmx_halfcast.plugin.HALFCAST`).

A third-party plugin package written only against olmx's plugin contract (:mod:`olmx.api`):
it reads the run's mesh capabilities and never names another plugin, and nothing in olmx
names it. Importing it imports no torch.
"""
