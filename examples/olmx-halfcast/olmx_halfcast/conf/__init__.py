"""Hydra YAML of olmx-halfcast (``precision/halfcast.yaml``), added to olmx's config tree
through the ``olmx.conf`` entry point."""
