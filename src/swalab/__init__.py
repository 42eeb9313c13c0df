"""swalab: weight averaging (SWA, EMA) and fast ensembling (FGE) for PyTorch, configured with Hydra."""

import os
import signal
import sys


def interrupted_while_starting(signum, frame):
    """Ctrl-C while the imports of ``python -m swalab.<tool>`` load (seconds on a busy machine): one line, not an
    import's traceback. ``swalab.cli.run_command`` hands Ctrl-C back to the tool once it starts (``run.py`` has its
    own)."""
    print("[swalab] interrupted (Ctrl-C) while starting: nothing was written", file=sys.stderr, flush=True)
    os._exit(130)  # pausing.INTERRUPTED_EXIT_CODE, not imported yet; SystemExit, like KeyboardInterrupt, may be
    # caught by an import's bare ``except:``, and the tool would go on after this line


def starting_a_tool() -> bool:
    """Whether this import is ``python -m swalab.<tool>`` loading its package (runpy sets ``sys.argv[0]`` to "-m"
    meanwhile): not a program of one's own run with ``-m`` that imports swalab, whose Ctrl-C stays its own."""
    if sys.argv[:1] != ["-m"]:
        return False
    command = getattr(sys, "orig_argv", [])
    after = command[command.index("-m") + 1:] if "-m" in command else []
    return bool(after) and after[0].split(".")[0] == __name__


# a process started with SIGINT ignored (a shell's background job) keeps ignoring it
if starting_a_tool() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, interrupted_while_starting)

from swalab import faults  # noqa: E402  (test-only: a Ctrl-C planned while starting)

faults.hit("starting")

from swalab.config import register_resolvers  # noqa: E402
from swalab.settings import register_settings  # noqa: E402

register_resolvers()
register_settings()

__version__ = "0.1.0"
