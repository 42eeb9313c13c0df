"""A benchmark started from a working tree with uncommitted changes refuses to write its result unless
``SWALAB_BENCH_ALLOW_DIRTY=1`` says so, and then the file records ``"dirty": true`` (bench/_common.py's module doc).

bench/_common.py reads the tree's state with ``git status`` in the repository it lies in, when it is imported; so the
module is copied into a throwaway git repository, made clean or dirty there, and imported by a fresh process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# what a benchmark does at its end: bench/<name>.py imports _common from its own folder and calls write_result
BENCHMARK = """
import sys, torch
import _common
path = _common.write_result("probe", torch.device("cpu"), {"value": 1.5}, out=sys.argv[1])
print("WROTE", path)
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                   cwd=repo, check=True, capture_output=True, text=True)


@pytest.fixture
def bench_repo(tmp_path) -> Path:
    """A git repository holding bench/_common.py and one tracked file, committed: a clean tree."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "_common.py", repo / "bench" / "_common.py")
    (repo / "tracked.txt").write_text("committed\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    return repo


def run_benchmark(repo: Path, out: Path, allow_dirty: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SWALAB_BENCH_ALLOW_DIRTY"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    if allow_dirty is not None:
        env["SWALAB_BENCH_ALLOW_DIRTY"] = allow_dirty
    return subprocess.run([sys.executable, "-c", BENCHMARK, str(out)], cwd=repo / "bench", env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_benchmark_from_a_dirty_tree_writes_nothing_unless_allowed_and_then_says_dirty(bench_repo, tmp_path):
    (bench_repo / "tracked.txt").write_text("an uncommitted change\n")  # a tracked file changed: the tree is dirty

    refused = tmp_path / "refused.json"
    done = run_benchmark(bench_repo, refused)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "not written: the working tree had uncommitted changes" in done.stderr
    assert "SWALAB_BENCH_ALLOW_DIRTY=1" in done.stderr
    assert not refused.exists()

    other = tmp_path / "other_value.json"  # only "1" allows it
    done = run_benchmark(bench_repo, other, allow_dirty="yes")
    assert done.returncode != 0 and not other.exists()

    allowed = tmp_path / "allowed.json"
    done = run_benchmark(bench_repo, allowed, allow_dirty="1")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(allowed.read_text())
    assert result["value"] == 1.5 and result["provenance"]["dirty"] is True


def test_a_benchmark_from_a_clean_tree_writes_its_result_marked_clean(bench_repo, tmp_path):
    (bench_repo / "untracked.txt").write_text("not part of the code\n")  # untracked files do not make it dirty
    out = tmp_path / "clean.json"
    done = run_benchmark(bench_repo, out)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["provenance"]["dirty"] is False and len(result["provenance"]["commit"]) == 40


def test_a_result_an_earlier_benchmark_rewrote_does_not_make_the_tree_dirty(bench_repo, tmp_path):
    # gpu_suite.sh runs benchmarks one after another; the earlier ones rewrite committed bench/results/*.json
    results = bench_repo / "bench" / "results"
    results.mkdir()
    (results / "earlier_cuda.json").write_text("{}\n")
    git(bench_repo, "add", ".")
    git(bench_repo, "commit", "-q", "-m", "a committed result")
    (results / "earlier_cuda.json").write_text('{"value": 2}\n')

    out = tmp_path / "after_an_earlier_result.json"
    done = run_benchmark(bench_repo, out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["provenance"]["dirty"] is False

    (bench_repo / "bench" / "_common.py").write_text((bench_repo / "bench" / "_common.py").read_text() + "\n# edit\n")
    done = run_benchmark(bench_repo, tmp_path / "after_a_code_change.json")  # code under bench/ still counts
    assert done.returncode != 0 and "uncommitted changes" in done.stderr


def test_a_result_names_the_folders_it_was_given_by_their_variables_not_the_machines_paths(bench_repo, tmp_path):
    """On the GPU machine a benchmark writes to ``$OUT`` and reads the data staged where ``SWALAB_CIFAR10_JPG`` says:
    the committed result names the variables, and the home folder as ``~``."""
    out_dir, data = "/srv/device_out", "/mnt/staged/cifar10-jpg"  # named only, outside the repository's folder
    probe = BENCHMARK.replace('{"value": 1.5}', f'{{"value": 1.5, "data": "{data} (train)", '
                                                f'"cache": "{Path.home()}/.cache/swalab", '
                                                f'"command": "--out {out_dir}/suite --data {data}"}}')
    env = {**os.environ, "OUT": out_dir, "SWALAB_CIFAR10_JPG": data, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    written = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, "-c", probe, str(written)], cwd=bench_repo / "bench", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(written.read_text())
    assert result["data"] == "$SWALAB_CIFAR10_JPG (train)" and result["cache"] == "~/.cache/swalab"
    assert result["command"] == "--out $OUT/suite --data $SWALAB_CIFAR10_JPG"


MACHINE_PATH = re.compile(r"(?<![\w.~$])/(?:root|home|work|Users)/")


def test_committed_results_and_docs_name_no_absolute_path_of_a_machine():
    """The brief's rule for what is committed: a folder of the machine a result was measured on is written relative
    to the repository, as ``$OUT``/``$SWALAB_CIFAR10_JPG``, or as ``~`` (scratch folders under ``/tmp`` are the
    commands' own, named in the scripts that made them)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listed = subprocess.run(["git", "ls-files", "README.md", "docs", "bench", "conf"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    if not listed:
        pytest.skip("not a git checkout")
    found = []
    for name in listed:
        try:
            text = (REPO / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # figures and archives
        found += [f"{name}: {m.group(0)}" for m in MACHINE_PATH.finditer(text)]
    assert found == []
