"""``python -m olmx`` is the ``olmx`` command."""

from olmx.cli import main

main()
