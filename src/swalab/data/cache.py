"""A decode cache for image data sets: decoded uint8 tensors saved in the user's cache directory.

Decoding the 60,000 JPEGs of CIFAR-10 takes far longer than reading the same pixels back from one
tensor file, so the first load saves its result to ``<cache>/<name>-<root key>-<layout>-v2.pt`` (a subset
or another decode setting to ``<name>-<root key>-<layout>-<hash>-v2.pt``) and later loads read that
instead. ``<cache>`` is ``run.cache_dir`` when set, else :func:`default_cache_dir`
(``$XDG_CACHE_HOME/swalab``, ``~/.cache/swalab`` by default): never the data folder itself, which is often
read-only or shared. ``<root key>`` is a hash of the data folder's absolute path, so two folders of the
same name never share a file. The file is written to a temporary name in the same folder and then renamed with
``os.replace`` (atomic on POSIX), so several jobs starting together on a shared file system either see
no cache or a complete one, never half a file; at worst each of them decodes once."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CACHE_DIR = "swalab"  # below $XDG_CACHE_HOME (~/.cache)
CACHE_FORMAT_VERSION = 2  # 2: 16-bit grey images kept at 16 bits (uint16), where 1 held them scaled to 8
CACHE_KEYS = ("format_version", "source", "train_images", "train_labels", "test_images", "test_labels", "classes")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/swalab``, or ``~/.cache/swalab``: where decoded images and file digests are cached
    unless ``run.cache_dir`` says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / CACHE_DIR


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` (``run.cache_dir``) when given, else :func:`default_cache_dir`."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def root_key(root: str | Path) -> str:
    """A short hash of a data folder's absolute path: its files in the cache never meet another folder's."""
    import hashlib

    return hashlib.sha256(str(Path(root).expanduser().resolve()).encode()).hexdigest()[:10]


def cache_path(root: Path, name: str, layout: str, cache_dir: str | Path | None = None,
               variant: str | None = None) -> Path:
    """Where the cache for data set ``name`` read from ``layout`` under ``root`` lives (see the module doc).

    ``variant``, a short hash of the chosen files and decode options, gives every subset (``train_size``
    / ``test_size``) and every decode setting its own file: ``<name>-<root key>-<layout>-<variant>-v2.pt``.
    A subset and the full set therefore never overwrite each other's cache when runs alternate."""
    stem = f"{name}-{root_key(root)}-{layout}" + (f"-{variant}" if variant else "")
    return cache_root(cache_dir) / f"{stem}-v{CACHE_FORMAT_VERSION}.pt"


def load_cache(path: Path, source: dict[str, Any], keys: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Read a cache written by :func:`save_cache`, or return ``None`` if it must be (re)built.

    A missing file returns ``None`` quietly. A file that cannot be loaded, has another
    ``format_version``, lacks a key (of :data:`CACHE_KEYS` or the loader's own ``keys``), or was built
    from other source files (``source`` differs) also returns ``None``, with a warning saying why, so the
    caller rebuilds and overwrites it."""
    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt, or written by an incompatible torch: all mean "rebuild"
        warnings.warn(f"decode cache {path} could not be loaded ({type(err).__name__}: {err}); rebuilding it", stacklevel=3)
        return None
    if not isinstance(obj, dict):
        warnings.warn(f"decode cache {path} holds a {type(obj).__name__}, not a dict; rebuilding it", stacklevel=3)
        return None
    version = obj.get("format_version")
    if version != CACHE_FORMAT_VERSION:
        warnings.warn(f"decode cache {path} has format_version {version!r} but this swalab reads version "
                      f"{CACHE_FORMAT_VERSION}; rebuilding it", stacklevel=3)
        return None
    missing = [k for k in (*CACHE_KEYS, *keys) if k not in obj]
    if missing:
        warnings.warn(f"decode cache {path} lacks {missing}; rebuilding it", stacklevel=3)
        return None
    if obj["source"] != source:
        warnings.warn(f"decode cache {path} was built from other files than those now under the data folder "
                      f"(images added, removed or modified since); rebuilding it", stacklevel=3)
        return None
    return obj


def save_cache(path: Path, payload: dict[str, Any]) -> bool:
    """Write ``payload`` (which gets ``format_version`` added) atomically to ``path``.

    Returns ``False`` with a warning, instead of raising, when the folder is not writable (a read-only
    data mount, a full disk): the caller already has the data, it only loses the speed-up next time."""
    payload = {"format_version": CACHE_FORMAT_VERSION, **payload}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.stem}.", suffix=".pt.tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; other users sharing the data folder must read it too
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as err:
        warnings.warn(f"cannot write decode cache {path} ({type(err).__name__}: {err}); continuing without it, so the "
                      f"images will be decoded again on the next load. Point run.cache_dir at a writable folder to "
                      f"cache them", stacklevel=3)
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def cached(path: Path | None, source: dict[str, Any], build: Callable[[], dict[str, Any]],
           keys: tuple[str, ...] = ()) -> tuple[dict[str, Any], str | None]:
    """The payload cached at ``path`` for ``source``, or ``build()``'s, saved there for next time; and a line
    saying where the cache is when this call wrote it (None when it read it, or wrote nothing).

    ``path=None`` (caching off) always builds and saves nothing. The saved file holds ``source`` too,
    so :func:`load_cache` can tell later whether it still describes the files on disk; ``keys`` are the
    payload entries beyond :data:`CACHE_KEYS` that a usable file must hold."""
    if path is not None:
        hit = load_cache(path, source, keys)
        if hit is not None:
            return hit, None
    payload = build()
    if path is not None and save_cache(path, {"source": source, **payload}):
        return payload, f"decoded images cached in {path} (run.cache_dir moves the cache)"
    return payload, None
