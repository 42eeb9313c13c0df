"""What a data set *is*: a fingerprint of the files a loader reads, for a run's identity and the decode cache.

A run trained on a folder of images is a run on those images, not on a path: if images are added,
removed or rewritten under a run that is resumed or skipped, that run would silently mix or reuse old
data. So every data set a run reads has a record of its files (:func:`folder_record`,
:func:`files_record`): per split and class folder the number of files and a hash of their names and
contents, and one overall ``fingerprint``. The fingerprint is part of the run's identity
(``swalab.identity``): a run directory refuses a data set that changed, and :func:`changes` says which
class folders did.

Reading every file at every start would be slow, so each file's content digest is cached, keyed by
its size, modification time, inode and *change* time (``ctime``). A file rewritten in place changes its
``ctime`` even when its size and modification time are set back (``touch -d``), so a stale digest is
never used; a copied or moved folder gets new ``ctime``s and is read once more, giving the same
fingerprint. The digest of a file is SHA-1 of its size, its first and its last 32 KiB (the whole file
when smaller: every CIFAR JPEG), a cheap hash that sees a rewritten image.

A weights file is identified the same way, by its content (:func:`weights_fingerprint`: SHA-256 of the whole file,
since a trained file keeps its size, its start and often its end), never by its path.

The cache lives in the user's cache directory (:func:`swalab.data.cache.default_cache_dir`), never in the
data folder, which is often read-only or shared."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .cache import cache_root, root_key

CHUNK = 32 * 1024
RECORD_VERSION = 1


def file_digest(path: str, size: int) -> str:
    """SHA-1 of ``size``, the first and the last ``CHUNK`` bytes of ``path`` (the whole file when it is smaller)."""
    h = hashlib.sha1(str(size).encode())
    with open(path, "rb") as f:
        if size <= 2 * CHUNK:
            h.update(f.read())
        else:
            h.update(f.read(CHUNK))
            f.seek(size - CHUNK)
            h.update(f.read(CHUNK))
    return h.hexdigest()


def whole_file_digest(path: str, size: int) -> str:
    """SHA-256 of the whole of ``path``: for a weights file, whose middle (the tensors) is what changes when it is
    trained on, while its size, its start (the pickled names and shapes) and its end may not."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class DigestCache:
    """Each file's digest under one data folder, kept in ``<cache dir>/fingerprints/<root key>.json`` and reused
    while the file's (size, mtime, ctime, inode) are unchanged (module doc). ``whole``: digests of whole files
    (:func:`whole_file_digest`, for weights files), kept apart from the data's."""

    def __init__(self, root: Path, cache_dir: str | Path | None = None, whole: bool = False):
        self.root = root
        self.whole = whole
        self.path = cache_root(cache_dir) / "fingerprints" / f"{root_key(root)}{'.sha256' if whole else ''}.json"
        try:
            self.entries: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def digest(self, relpath: str, st: os.stat_result) -> str:
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        entry = self.entries.get(relpath)
        if entry is not None and entry[:4] == key:
            return entry[4]
        digest = (whole_file_digest if self.whole else file_digest)(os.path.join(self.root, relpath), st.st_size)
        self.entries[relpath] = [*key, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        """Write the digests back (atomically); a cache that cannot be written costs only speed next time."""
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.entries, f, separators=(",", ":"))
            os.replace(tmp, self.path)
        except OSError:
            pass


def _class_folders(split_dir: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def _files(class_dir: Path, extensions: Sequence[str]) -> list[os.DirEntry]:
    return sorted((e for e in os.scandir(class_dir)
                   if not e.name.startswith(".") and e.name.lower().endswith(tuple(extensions)) and e.is_file()),
                  key=lambda e: e.name)


def _combine(lines: Sequence[str]) -> str:
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def folder_record(root: str | Path, splits: Sequence[str], extensions: Sequence[str],
                  cache_dir: str | Path | None = None) -> dict:
    """The record of an image folder ``root/<split>/<class>/<file>``: ``{"fingerprint": hex, "files":
    {"<split>/<class>": [count, hex]}}``, over the files with one of ``extensions`` (hidden ones ignored).

    A split folder that is missing is left out (the loader names that error itself)."""
    root = Path(root).resolve()
    digests = DigestCache(root, cache_dir)
    files: dict[str, list] = {}
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            continue
        for name in _class_folders(split_dir):
            entries = _files(split_dir / name, extensions)
            lines = [f"{e.name}\0{digests.digest(f'{split}/{name}/{e.name}', e.stat())}\n" for e in entries]
            files[f"{split}/{name}"] = [len(entries), _combine(lines)]
    digests.save()
    return _record(files)


def files_record(paths: dict[str, str | Path], cache_dir: str | Path | None = None) -> dict:
    """The record of named single files (``{"train": <path>, ...}``: CIFAR's pickles), as :func:`folder_record`."""
    files: dict[str, list] = {}
    by_root: dict[Path, DigestCache] = {}
    for name, path in sorted(paths.items()):
        path = Path(path).resolve()
        digests = by_root.setdefault(path.parent, DigestCache(path.parent, cache_dir))
        files[name] = [1, digests.digest(path.name, path.stat())]
    for digests in by_root.values():
        digests.save()
    return _record(files)


WEIGHTS_PREFIX = "sha256-"


def weights_fingerprint(path: str | Path, cache_dir: str | Path | None = None) -> str | None:
    """``sha256-<16 hex>``: what a weights file (``model.pretrained_file``, ``model.init_from=<file>``) holds, for a
    run's identity (``swalab.identity``), so that a file moved or copied elsewhere is the same weights and a file
    rewritten in place is other weights; None when ``path`` is no file. Read once per file, then cached like the
    data's digests (its size, mtime, ctime and inode: a moved file is read once more, with the same result)."""
    path = Path(path)
    if not path.is_file():
        return None
    path = path.resolve()
    digests = DigestCache(path.parent, cache_dir, whole=True)
    digest = digests.digest(path.name, path.stat())
    digests.save()
    return WEIGHTS_PREFIX + digest[:16]


def records_files(recorder: Callable[..., dict | None]) -> Callable:
    """Declare ``recorder`` the record of the files a loader reads, as a decorator of the loader: the protocol by
    which ``swalab.train`` finds a data set's record before loading it (``loader.files_record``, called with the
    loader's arguments from ``dataset.source``; None while the files are not there) and hands it back (the loader
    takes ``record=``, so that its files are not read twice). A loader that declares none has no record."""

    def declare(loader: Callable) -> Callable:
        loader.files_record = recorder
        return loader

    return declare


def data_record(fingerprint_text: str) -> dict:
    """The record of data that ship inside a package (the digits): one fingerprint of their bytes."""
    return _record({"data": [1, hashlib.sha256(fingerprint_text.encode()).hexdigest()]})


def _record(files: dict[str, list]) -> dict:
    overall = _combine([f"{key}\0{count}\0{digest}\n" for key, (count, digest) in sorted(files.items())])
    return {"version": RECORD_VERSION, "fingerprint": overall[:16], "files": files}


def changes(then: dict, now: dict, limit: int = 6) -> str:
    """What changed between two records, in words: ``train/cat: 5000 files then, 5003 now; test/dog: contents
    changed``; the first ``limit`` class folders, then how many more."""
    a, b = then.get("files") or {}, now.get("files") or {}
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            lines.append(f"{key}: gone")
        elif key not in a:
            lines.append(f"{key}: new ({b[key][0]} files)")
        elif a[key][0] != b[key][0]:
            lines.append(f"{key}: {a[key][0]} files then, {b[key][0]} now")
        elif a[key][1] != b[key][1]:
            lines.append(f"{key}: files rewritten or renamed")
    more = f"; and {len(lines) - limit} more" if len(lines) > limit else ""
    return "; ".join(lines[:limit]) + more if lines else "its files differ"
