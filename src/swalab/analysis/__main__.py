"""``python -m swalab.analysis <plane|rays|segment|curves> ...``: the analysis commands by name."""

from __future__ import annotations

import importlib
import sys

COMMANDS = ("plane", "rays", "segment", "curves")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m swalab.analysis {{{'|'.join(COMMANDS)}}} [options]  (--help after a command)")
        raise SystemExit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    importlib.import_module(f"swalab.analysis.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    main()
