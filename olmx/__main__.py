"""``python -m olmx`` is the ``olmx`` command.

``python -m olmx run PLAN`` (every launched process) takes the stop signals first, before the
command line's imports: a Ctrl-C or SIGTERM that reaches a process while it starts is kept as a
stop request (the run stops with a checkpoint, or before its first step), not a
KeyboardInterrupt that kills one rank while its peers wait for it in a collective.
"""

import sys

if sys.argv[1:2] == ["run"]:
    from olmx.stop import install_stop_handlers

    install_stop_handlers()

from olmx.cli import main  # noqa: E402

main()
