"""``python -m swalab.analysis <command> ...``: the loss-surface analyses by name (``--help`` lists them)."""

from __future__ import annotations

import importlib
import sys

from swalab.cli import run_command

COMMANDS = {
    "plane": "train loss and test error on the plane through three weight vectors (paper Figs. 1 and 3)",
    "rays": "train loss and test error along random directions from SWA and from SGD: width (paper Fig. 4)",
    "segment": "train loss and test error on the line through SWA and SGD, beyond both ends (paper Fig. 5)",
    "curves": "test error against epoch of several runs, the SWA average beside the iterates (paper Figs. 6 and 7)",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return ("usage: python -m swalab.analysis <command> [options]   (python -m swalab.analysis <command> --help)\n\n"
            "commands:\n" + "\n".join(lines) + "\n\ndocs/analysis.md shows each on a real run.")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        asked = argv[:1] in (["-h"], ["--help"])
        print(usage(), file=sys.stdout if asked else sys.stderr)
        if argv and not asked:
            print(f"\nunknown command {argv[0]!r}", file=sys.stderr)
        raise SystemExit(0 if asked else 2)
    kept = "nothing was written (the figure is written last)" if argv[0] == "curves" else \
        "the points evaluated so far are kept in --out; the same command again evaluates only the others"
    run_command(importlib.import_module(f"swalab.analysis.{argv[0]}").main, argv[1:], prog="swalab.analysis",
                interrupted=kept)


if __name__ == "__main__":
    main()
