"""The command-line entry of the after-training tools (``swalab.results.compare``, ``swalab.analysis``).

When it matters: a path that is not a run, or a run that is missing a file, is the user's to fix, so it is
said in one line (exit 2) instead of a traceback; every other error keeps its traceback, since it is a bug
to report. ``run.py`` has its own, richer handling (``swalab.train``).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

USER_ERRORS = (FileNotFoundError, NotADirectoryError)
USAGE_EXIT_CODE = 2


def run_command(main: Callable, argv: Sequence[str] | None = None, prog: str = "swalab") -> None:
    """Call ``main(argv)``; a missing or wrong path ends in one line on stderr and exit 2."""
    try:
        main(argv)
    except USER_ERRORS as exc:
        print(f"[{prog}] {exc}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE) from None
