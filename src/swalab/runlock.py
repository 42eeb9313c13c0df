"""One process per run directory: a lock held for the life of the training process.

When it matters: the same command started twice (two terminals, a grid re-launched while the first
is still running, a requeued SLURM job whose first attempt still runs). Without a lock both would
train into one directory and overwrite each other's checkpoints.

The lock is an OS file lock (``flock``) on ``<run dir>/.lock``. The kernel releases it when the
holding process exits, however it exits (a crash, ``kill -9``, an out-of-memory kill), so a lock of a
dead process is never in the way: the next process takes it over and says so. A second process that
finds the lock held exits at once with :class:`RunLocked`, naming the holder (PID, host, start time),
which the holder writes into the file.

What it cannot catch: the lock is on the open file, not on its path, so deleting the directory of a run that is
still training removes the lock with it; the same command launched again makes a new ``.lock`` and trains beside
the old process (docs/reliability.md). Stop a run before deleting its directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from swalab import faults

LOCK_FILE = ".lock"


class RunLocked(RuntimeError):
    """Another live process holds the run directory; the message names it."""


def _describe(info: dict) -> str:
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"PID {info.get('pid', '?')} on host {info.get('host', '?')}, started {when}"


def _unwritable(path: Path, exc: OSError) -> PermissionError:
    cause = exc.strerror or str(exc)
    return PermissionError(exc.errno, f"cannot write the run directory {path} ({cause}): point the outputs somewhere "
                                      "writable with paths.output_dir=<dir> (all runs) or run.dir=<dir> (this run)")


def holder_of(run_dir: str | Path) -> dict | None:
    """The record of the process that holds ``run_dir``'s lock, read without taking it: empty when none does (an
    orderly exit clears it, :meth:`RunLock.release`); None when the run has no lock file to read."""
    try:
        return json.loads((Path(run_dir) / LOCK_FILE).read_text() or "{}")
    except OSError:
        return None
    except ValueError:
        return {}


def gone_holder(run_dir: str | Path) -> str | None:
    """Why no process trains ``run_dir`` now, or None when one may (a live process of this host holds its lock, or
    one of another host, which cannot be asked from here). A run whose ``status.json`` still says ``running`` and
    whose lock names a process of this host that no longer exists was killed or crashed mid-run (``kill -9``, an
    out-of-memory kill): the kernel took its lock, but nothing wrote its status."""
    info = holder_of(run_dir)
    if info is None:  # no lock file: nothing to tell
        return None
    if not info:
        return "no process holds its lock"
    pid, host = info.get("pid"), info.get("host")
    if host != socket.gethostname() or not isinstance(pid, int):
        return None
    return None if process_exists(pid) else f"{_describe(info)} is gone: killed or crashed"


def process_exists(pid: int) -> bool:
    """Whether a process of this host has the id ``pid`` (one of another user's counts: it cannot be signalled,
    but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, another user's
        return True
    return True


class RunLock:
    """``with RunLock(run_dir):`` holds ``run_dir`` for this process (creating the directory if needed).

    ``created`` lists the directories this lock created, so a run refused after taking the lock can
    remove them again (:meth:`discard`) and leave nothing behind."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.created: list[Path] = []
        self.previous: dict | None = None  # the holder before us, when we took a dead process's lock over
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        missing = []
        for parent in [self.run_dir, *self.run_dir.parents]:
            if parent.exists():
                break
            missing.append(parent)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.created = list(reversed(missing))
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self._remove_created()
            raise _unwritable(self.run_dir, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = self._read(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLocked(f"{self.run_dir} is being trained by another process ({_describe(holder)}): this "
                                "command exits so that the two do not overwrite each other. Wait for it to finish "
                                "(then the same command skips or resumes the run), or stop it first") from None
            raise
        self.previous = self._read(fd) or None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as exc:
            os.close(fd)
            self._remove_created()
            raise _unwritable(self.run_dir, exc) from exc
        self._fd = fd
        return self

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (OSError, ValueError):
            return {}

    def took_over(self) -> str | None:
        """A line naming the dead holder whose lock this process took over, if any."""
        if self.previous and self.previous.get("pid") not in (None, os.getpid()):
            return f"took over the lock of {_describe(self.previous)}, which no longer holds it"
        return None

    def release(self) -> None:
        """Unlock, clearing the holder's record first: only a process that died holding the lock leaves one
        behind, so the next holder's ``took_over`` names a real take-over, not an orderly hand-over."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _remove_created(self) -> None:
        for path in reversed(self.created):
            try:
                path.rmdir()
            except OSError:
                break
        self.created = []

    def discard(self) -> None:
        """Release, and remove the run directory again if this lock created it and it holds nothing else."""
        self.release()
        if self.created:
            if [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                self.path.unlink(missing_ok=True)
            self._remove_created()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def held_folders(folders, doing: str):
    """``with held_folders(folders, doing):`` holds the lock of each of ``folders`` (a run's ``scores/``,
    ``posthoc/``) for a command that writes there, all or none: a second command at once on one of them is refused
    in one line naming the process that holds it (``<folder> is being <doing> by another process (PID ...)``), and
    one that cannot write there is told to give a writable copy (the command writes inside the run directory, so no
    output setting helps). When the block ends, finished or not (a refusal, an error, Ctrl-C), a folder a lock made
    and nothing else was written to is removed again (the runs of a soup but the one it is written under), and the
    locks are released."""
    locks: list[RunLock] = []
    try:
        for folder in folders:
            try:
                locks.append(RunLock(folder).acquire())
            except RunLocked:
                raise RunLocked(f"{folder} is being {doing} by another process ({_describe(holder_of(folder) or {})}): "
                                "wait for it to finish, then run this command again") from None
            except PermissionError as exc:
                cause = getattr(exc.__cause__, "strerror", None) or "permission denied"
                raise PermissionError(exc.errno, f"cannot write {folder} ({cause}): this command writes inside the run "
                                                 "directory; copy the run somewhere writable and give the copy") from None
        faults.hit("folders_held")  # test-only: a signal here finds the folders locked and nothing written
        yield locks
    finally:
        for lock in locks:
            lock.discard()
