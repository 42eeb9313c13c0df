"""A grid (``python run.py -m ...``): one record per job, and a summary when the grid ends.

Each job trains in its own run directory (``swalab.identity``); the grid itself keeps a record in
``<paths.output_dir>/grids/<date_time>/`` (Hydra's sweep directory): ``multirun.yaml`` (Hydra's),
``jobs/<n>.json`` (the job's overrides, run directory, state and error line, written by the job
itself, so this works with any launcher that shares the file system) and ``summary.txt``.

When the grid ends, :class:`GridSummary` (a Hydra callback, ``conf/hydra/default.yaml``) prints one
line per job and makes the command exit non-zero if any job did not finish, so a grid started from a
script or a scheduler fails visibly instead of exiting 0 over failed jobs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from swalab.runstatus import OK_STATES
from swalab.rundir import read_json, write_text

JOBS_DIR = "jobs"
SUMMARY_FILE = "summary.txt"


def record_job(grid_dir: str | Path, number: int, overrides: list[str], run_dir: str | Path | None, state: str,
               error: str | None = None) -> Path:
    """Write ``<grid_dir>/jobs/<number>.json`` (atomically) for one job of the grid."""
    folder = Path(grid_dir) / JOBS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{number:04d}.json"
    line = (error or "").strip().splitlines()[0] if error else None
    where = None if run_dir is None else os.path.relpath(os.path.abspath(run_dir), os.path.abspath(grid_dir))
    write_text(path, json.dumps({"job": number, "overrides": list(overrides), "run_dir": where, "state": state,
                                 "error": line}))
    return path


def read_jobs(grid_dir: str | Path) -> list[dict[str, Any]]:
    """The job records of a grid, in job order (a job that died before writing one is absent), each
    ``run_dir`` as a path that reaches the run from here: records name it relative to the record itself, so a
    grid's record and its runs can be read from any directory and moved together."""
    folder = Path(grid_dir) / JOBS_DIR
    jobs = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        job = read_json(path)
        if job is None:
            continue
        if job.get("run_dir"):
            job["run_dir"] = str(job_run_dir(grid_dir, job["run_dir"]))
        jobs.append(job)
    return jobs


def job_run_dir(grid_dir: str | Path, stored: str) -> Path:
    """A run directory named in a job record: relative to the record's directory (or, in records written before
    that, absolute or relative to the working directory the grid ran in)."""
    path = Path(stored)
    if path.is_absolute():
        return path
    beside = Path(os.path.normpath(Path(grid_dir) / path))
    return beside if beside.exists() or not path.exists() else path


def summary_lines(jobs: list[dict[str, Any]], interrupted: bool = False) -> list[str]:
    """A count line, then ``#<n>  <state>  <run dir>  <error>`` per job. A job still marked ``running`` at
    the end was killed before it could record how it ended. ``interrupted``: the jobs are those started before the
    grid stopped (the grid's own length is not known here), and the count says so."""
    lines = []
    width = max([9, *(len(str(job["state"])) for job in jobs)])  # 'interrupted' keeps the run dirs in one column
    for job in jobs:
        where = job.get("run_dir") or " ".join(job.get("overrides", []))
        tail = f"  {job['error']}" if job.get("error") else ""
        lines.append(f"  #{job['job']:<3} {job['state']:<{width}} {where}{tail}")
    bad = [j for j in jobs if j["state"] not in OK_STATES]
    started = " started before the grid stopped" if interrupted else ""
    count = f"{len(jobs) - len(bad)} of {len(jobs)} jobs{started} finished"
    if bad:
        count += f"; {len(bad)} did not: " + ", ".join(sorted({j['state'] for j in bad}))
    return [f"[swalab] grid summary: {count}", *lines]


def close_grid(grid_dir: str | Path, interrupted: bool = False) -> list[dict[str, Any]]:
    """Print the grid's summary and write it to ``summary.txt``; return its job records. ``interrupted``: the
    grid stopped before its last job (Ctrl-C, a preemption), which the summary says, with how to go on."""
    jobs = read_jobs(grid_dir)
    lines = summary_lines(jobs, interrupted)
    if interrupted:
        lines.append("[swalab] the grid was stopped before its end: re-run the same command to continue it "
                     "(finished runs are skipped, paused ones continue)")
    text = "\n".join(lines)
    print(text, flush=True)
    try:  # atomically: a grid stopped while it writes keeps the summary it had
        write_text(Path(grid_dir) / SUMMARY_FILE, text + "\n")
    except OSError:
        pass
    return jobs


class GridSummary(Callback):
    """Hydra callback: check the output directory before a grid starts; summarise the grid at its end."""

    def __init__(self) -> None:
        self.grid_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not str(config.paths.output_dir).strip():
            print("[swalab] paths.output_dir is empty: give the directory that holds the runs and the grid's record "
                  "(paths.output_dir=outputs)", file=sys.stderr)
            sys.exit(2)
        self.grid_dir = Path(str(config.hydra.sweep.dir))
        parent = next((p for p in [self.grid_dir, *self.grid_dir.parents] if p.exists()), None)
        if parent is not None and not (parent.is_dir() and os.access(parent, os.W_OK)):
            why = "is not writable" if parent.is_dir() else "is a file, not a folder"
            print(f"[swalab] cannot write the grid's record {self.grid_dir}: {parent} {why}. Point the "
                  "outputs somewhere writable with paths.output_dir=<dir>", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.grid_dir is None:
            return
        jobs = close_grid(self.grid_dir)
        if any(j["state"] not in OK_STATES for j in jobs):
            sys.exit(1)
