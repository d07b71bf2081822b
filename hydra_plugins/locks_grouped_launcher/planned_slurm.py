"""hydra/launcher=slurm: hydra-submitit-launcher's SLURM job arrays (one task per sweep job), with `mem_gb: null`
asking every task for the host memory its memory plan needs (eval/memory_plan.py) instead of a fixed amount.

The plan is made before anything is submitted, for the node's device (CUDA when the jobs get a GPU): each job is a
run of its own, and the array asks for the largest job's need (one --mem for all its tasks). An explicit
`hydra.launcher.mem_gb=N` wins.
"""

import logging
from typing import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

from hydra_plugins.locks_grouped_launcher.grouped_launcher import _job_config, planned_mem_gb

log = logging.getLogger(__name__)


class PlannedSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        if self.params.get("mem_gb") is None:
            loader = self.hydra_context.config_loader
            jobs = [_job_config(loader.load_sweep_config(self.config, list(overrides))) for overrides in job_overrides]
            self.params["mem_gb"] = planned_mem_gb(jobs, [[i] for i in range(len(jobs))],
                                                   self.params.get("gpus_per_node"))
            log.info(f"Requesting {self.params['mem_gb']} GB of host memory per job (the largest job's memory plan)")
        return super().launch(job_overrides, initial_job_idx)
