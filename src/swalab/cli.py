"""The command-line entry of the after-training tools (``swalab.results.report``, ``compare``, ``row``,
``wandb_report``, ``swalab.analysis``).

When it matters: a path that is not a run, a run that is missing a file, an output path that cannot be
written, a flag or config value out of range, an unknown data set or model: each is the user's to fix, so
it is said in one line naming the file or flag (exit 2) instead of a traceback, and before any work is done
where it can be known before. Every other error keeps its traceback, since it is a bug to report. ``run.py``
has its own, richer handling (``swalab.train``)."""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

from swalab.pausing import INTERRUPTED_EXIT_CODE

USAGE_EXIT_CODE = 2


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors that are the user's to fix: paths, permissions, config values, unknown config options, weights that
    cannot be read or do not fit the run's network (``CheckpointError``: what ``model.init_from=`` says of the same
    file), a folder another process holds (``RunLocked``: wait for it, or stop it)."""
    from hydra.errors import HydraException

    from swalab.checkpoint import CheckpointError
    from swalab.config import ConfigError
    from swalab.runlock import RunLocked

    return (FileNotFoundError, NotADirectoryError, FileExistsError, IsADirectoryError, PermissionError, ConfigError,
            HydraException, CheckpointError, RunLocked)


# Errors of the disk a command writes to: a full disk, a quota, a read-only file system, a name too long for it.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG)


def is_users_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's to fix (:func:`user_errors`, or a disk that cannot take the output)."""
    return isinstance(exc, user_errors()) or isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


def message(exc: BaseException) -> str:
    """What an error says, without Python's ``[Errno N]`` prefix on the OS errors swalab words itself."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is None:
        return str(exc.strerror).strip()
    return str(exc).strip()


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job's time limit) arrived while a command of whole-or-absent records ran
    (:func:`run_command` with ``interrupted``): raised where the command is, as Ctrl-C's ``KeyboardInterrupt`` is, so
    that the same clean-up runs (a folder a lock made and nothing was written to is removed:
    ``swalab.runlock.held_folders``)."""

    exit_code = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM


@contextlib.contextmanager
def sigterm_raises(raised: Callable[[int], BaseException] = lambda signum: Terminated()):
    """While the block runs, SIGTERM raises ``raised(signum)`` (:class:`Terminated` unless told) where the program is
    instead of ending the process at once, where no clean-up would run; the earlier handler comes back afterwards.
    Only in the main thread, where Python handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise raised(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def run_command(main: Callable, argv: Sequence[str] | None = None, prog: str = "swalab",
                interrupted: str | None = None) -> object:
    """Call ``main(argv)`` and return what it returns; a user's error ends in one line on stderr and exit 2. With
    ``interrupted`` (what Ctrl-C leaves behind, for a command whose records are whole or absent), Ctrl-C ends in
    one line saying it, exit 130, and SIGTERM likewise, exit 143."""
    import swalab

    if signal.getsignal(signal.SIGINT) is swalab.interrupted_while_starting:  # started: Ctrl-C is the tool's now
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if interrupted is None:
            return main(argv)
        with sigterm_raises():
            return main(argv)
    except Terminated:
        print(f"[{prog}] stopped by SIGTERM: {interrupted}", file=sys.stderr)
        raise SystemExit(Terminated.exit_code) from None
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"[{prog}] interrupted: {interrupted}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    except Exception as exc:
        if not is_users_error(exc):
            raise
        from swalab.config import unknown_key

        text = unknown_key(exc) or one_line(message(exc)) or type(exc).__name__  # a misspelt key: as run.py says it
        print(f"[{prog}] {text}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE) from None


def described(doc: str | None) -> str:
    """A tool's ``--help`` description: the first paragraph of its module's docstring, with reST's double backticks
    shown as single ones (a terminal renders no markup)."""
    return (doc or "").split("\n\n")[0].replace("``", "`")


def one_line(message: str) -> str:
    """A message on one line: Hydra's list of available options kept (``Could not find 'dataset/nosuch'; available
    options in 'dataset': cifar10, cifar100, ...``), its config search path left out; a list of refusals
    (``invalid config:`` then ``  - seed='abc' must be an integer``) kept as its items joined by ``;``."""
    lines = [line.strip() for line in message.split("Config search path")[0].splitlines() if line.strip()]
    if len(lines) > 1 and lines[1].lower().startswith("available options"):
        return f"{lines[0]}; {lines[1][0].lower()}{lines[1][1:]} {', '.join(lines[2:])}"
    if len(lines) > 1 and lines[0].endswith(":") and lines[1].startswith("- "):  # a list: ``invalid config:`` + items
        return f"{lines[0]} " + "; ".join(line.removeprefix("- ") for line in lines[1:] if line.startswith("- "))
    return lines[0] if lines else ""


def first_of_each(items: Sequence, key: Callable) -> list:
    """``items`` with one of each ``key``, the first given: what a command was asked twice it does once."""
    seen: dict = {}
    for item in items:
        seen.setdefault(key(item), item)
    return list(seen.values())


def each_once(paths: Sequence[str]) -> list[str]:
    """``paths`` (run directories given to a command) with each directory once, under the first spelling given: one
    typed twice, or as ``out/run`` and ``./out/run/``, is one run, worked on and locked once (locked twice, the
    command would refuse itself as another process holding it)."""
    return first_of_each(paths, lambda path: Path(path).resolve())


def output_folder(path: str | Path, flag: str) -> Path:
    """``path`` as a folder a command may write into (``--out``), checked before any work: refused, naming the flag,
    when it is a file or lies below one."""
    path = Path(path)
    check_name(path, flag, inside=32, sibling=24)  # the report's files; its work folder .<name>.<pid>.<random> beside
    for part in [path, *path.parents]:
        if part.exists():
            if not part.is_dir():
                where = "is a file" if part == path else f"lies below {part}, which is a file"
                raise NotADirectoryError(f"{flag} {path} {where}: give a folder")
            break
    return path


def output_file(path: str | Path, flag: str) -> Path:
    """``path`` as a file a command may write (``--out x.json``), checked before any work."""
    path = Path(path)
    check_name(path, flag, sibling=13)  # the temp file <name>.<random>.tmp it is written to first
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {path} is a folder: give a file name")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise NotADirectoryError(f"{flag} {path} lies below {blocking}, which is a file: give a path in a folder")
    return path


def check_name(path: Path, flag: str, inside: int = 0, sibling: int = 0) -> None:
    """Refuse, naming ``flag``, a path the file system cannot hold with what a command writes in and beside it
    (``swalab.config.check_path_fits``), before any work."""
    from swalab.config import check_path_fits

    check_path_fits(path, flag, f"give {flag} a shorter path", inside=inside, sibling=sibling)
