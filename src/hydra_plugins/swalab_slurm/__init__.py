"""swalab's SLURM launcher for Hydra (``hydra/launcher=slurm``, ``conf/hydra/launcher/slurm.yaml``).

Hydra instantiates launchers only from the ``hydra_plugins`` package, and imports every module there at
start-up, so this one stays light: submitit and its Hydra plugin are imported only when a grid is launched.
The work is done by the plugin's own launcher (``hydra-submitit-launcher``); see ``swalab.slurm_launcher``
for what is added."""

from __future__ import annotations

from typing import Any, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class SlurmLauncher(Launcher):
    """hydra-submitit-launcher's ``SlurmLauncher`` with the same keys, quiet where SLURM keeps no accounting."""

    def __init__(self, **params: Any) -> None:
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as Submitit

        self.submitit = Submitit(**params)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.submitit.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from swalab.slurm_launcher import watch_jobs

        with watch_jobs():
            return self.submitit.launch(job_overrides, initial_job_idx)
