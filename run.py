"""Train one run (``python run.py method=swa model=wrn28_10 dataset=cifar100``) or a grid (``-m``).

``python run.py --help`` lists the config groups; ``--cfg job`` prints the composed config.
A job that fails inside a grid (``-m``) is recorded as failed in its run directory (status.json)
and the grid goes on; a single run that fails exits non-zero. A preempted run (SIGTERM/SIGUSR1)
writes a checkpoint and exits with code 75, and re-launching the same command continues it.
"""

import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import swalab  # noqa: F401  (registers the config resolvers before Hydra composes)
from swalab.train import train
from swalab.trainer import PREEMPTED_EXIT_CODE, Preempted


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        metrics = train(cfg)
    except Preempted as exc:
        print(f"[swalab] {exc}", file=sys.stderr)
        # A launcher that installed its own handler (submitit: SIGUSR1 -> checkpoint() -> requeue) gets the
        # signal now that the checkpoint is safely written; a plain launch exits 75 for a requeue wrapper.
        signum = getattr(exc, "signum", None)
        handler = signal.getsignal(signum) if signum else None
        if callable(handler):
            handler(signum, None)
        sys.exit(PREEMPTED_EXIT_CODE)
    except Exception as exc:
        if not multirun:
            raise
        print(f"[swalab] job failed, the grid goes on: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    first = next((m for m in metrics.values() if "acc" in m), None)
    return None if first is None else first["acc"]


if __name__ == "__main__":
    main()
