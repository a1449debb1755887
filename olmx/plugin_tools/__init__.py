"""Tools for plugin authors: scaffold a package and check one before installing it.

* :mod:`.scaffold`: :func:`~.scaffold.new_plugin` (``olmx plugins new NAME --kind K``) renders
  ``templates/plugin/`` into a complete package: ``pyproject.toml`` with its entry points (each
  line written by entry-points-txt), the plugin module, a YAML preset, a README and a passing
  test.
* :mod:`.check`: :func:`~.check.check_plugin` (``olmx plugins check TARGET``) reads a source
  tree's ``[project.entry-points]``, a wheel's or an installed distribution's
  ``entry_points.txt`` (:mod:`.package`) with entry-points-txt, imports the plugin objects in a
  separate Python process (:mod:`.probe`: the package's source or the unpacked wheel first on
  ``sys.path``; nothing is installed) and reports every problem in a table.
* :mod:`.names`: the names derived from a plugin name, entry-point lines and groups.

The YAML presets that installed packages contribute reach Hydra through
:mod:`olmx.config.search_path`.

Nothing here imports torch, OLMo-core or a plugin in the calling process.
"""
