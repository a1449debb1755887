"""Hydra YAML of olmx-layerscale (``layers/*.yaml``), added to olmx's config tree through the
``olmx.conf`` entry point."""
