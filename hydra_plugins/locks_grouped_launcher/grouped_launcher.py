"""Hydra launchers that run a sweep's jobs in groups: jobs that differ only in method and budget share one process,
one model load and one dense prefill per sample (eval/sweep.py). Selected with

    python run.py -m method=locks,quest budget=128,512 hydra/launcher=grouped          # here, group after group
    python run.py -m method=locks,quest budget=128,512 hydra/launcher=grouped_slurm    # one SLURM job per group

The plain launchers (basic, slurm) still run one process per job. A group's jobs write their run directories
exactly as separate jobs would; the launcher returns one JobReturn per job, in the sweep's order.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


@dataclass
class GroupedLauncherConf:
    _target_: str = "hydra_plugins.locks_grouped_launcher.grouped_launcher.GroupedLauncher"
    # true: a grid cell that its method rejects (e.g. LRQK at a budget <= its lite_tokens) is skipped with its reason
    # logged and returned, and the rest of the sweep runs; false: the sweep stops before any work
    skip_invalid: bool = False


@dataclass
class GroupedSlurmLauncherConf:
    """One SLURM job per group, through submitit (the same resource keys as conf/hydra/launcher/slurm.yaml)."""

    _target_: str = "hydra_plugins.locks_grouped_launcher.grouped_launcher.GroupedSlurmLauncher"
    partition: Optional[str] = None
    gpus_per_node: Optional[int] = 1
    cpus_per_task: int = 8
    mem_gb: Optional[int] = None  # host GiB per job; null: from the largest group's memory plan (eval/memory_plan.py)
    timeout_min: int = 240
    max_num_timeout: int = 3
    array_parallelism: int = 16
    name: str = "locks_group"
    skip_invalid: bool = False
    setup: list = field(default_factory=lambda: ["export WANDB_MODE=offline", "export HF_HUB_OFFLINE=1",
                                                 "export TRANSFORMERS_OFFLINE=1"])


ConfigStore.instance().store(group="hydra/launcher", name="grouped", node=GroupedLauncherConf)
ConfigStore.instance().store(group="hydra/launcher", name="grouped_slurm", node=GroupedSlurmLauncherConf)


def _job_config(sweep_config: DictConfig) -> tuple:
    """(the resolved job config without hydra, the job's DictConfig without hydra, hydra's group choices)."""
    choices = OmegaConf.to_container(sweep_config.hydra.runtime.choices)
    cfg = sweep_config.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True), cfg, choices


def check_jobs(jobs: list, skip_invalid: bool) -> tuple[list[int], list]:
    """Check every job's config and method parameters before any work: (the indices of the jobs to run, results
    with {"skipped": reason, "method": ...} at each cell its method rejects). Without skip_invalid a rejected cell
    raises its ConfigError."""
    from eval.config_schema import check_config
    from eval.runner import check_method, rejected

    results: list = [None] * len(jobs)
    valid = []
    for i, (config, cfg, choices) in enumerate(jobs):
        check_config(cfg, choices)
        if not skip_invalid:
            check_method(config)  # raises the cell's ConfigError
        elif (reason := rejected(config)) is not None:
            log.warning(f"skipped {config['method']['name']} b={config['method']['budget']}: {reason}")
            results[i] = {"skipped": reason, "method": config["method"]}
            continue
        valid.append(i)
    return valid, results


def run_groups(jobs: list, skip_invalid: bool = False) -> list:
    """Check the jobs (check_jobs), then run them group by group (one process: this one). Returns each job's
    metrics (or its skip reason), in the order given."""
    from eval import events
    from eval.sweep import group_jobs, run_group

    events.record_startup()  # the interpreter and the imports, once per process
    valid, results = check_jobs(jobs, skip_invalid)
    for members in group_jobs([jobs[i][0] for i in valid]):
        members = [valid[k] for k in members]
        out = run_group([jobs[i][0] for i in members], [jobs[i][1] for i in members])
        for i, metrics in zip(members, out):
            results[i] = metrics
    return results


def planned_mem_gb(jobs: list, groups: list[list[int]], gpus_per_node) -> int:
    """Host GiB for every job of the array (one --mem for all): `slurm_mem_gb` of the largest group's plan, each
    planned for the node's device (CUDA when the jobs get a GPU) before anything is submitted. A chunk size of
    `auto` is planned as one forward (its host terms are the same; the node picks its chunk when the job starts)."""
    import torch

    from eval.memory_plan import SLURM_BASE_GIB, run_plan, slurm_mem_gb
    from eval.runner import method_spec

    device = torch.device("cuda" if gpus_per_node else "cpu")
    need = SLURM_BASE_GIB
    for members in groups:
        config, cfg, _ = jobs[members[0]]
        if config.get("prefill_chunk_size") == "auto":
            config = {**config, "prefill_chunk_size": None}
        plan = run_plan(config, cfg.model, [method_spec(jobs[i][0]["method"]) for i in members], len(members), device)
        need = max(need, slurm_mem_gb(plan))
    return need


def _checkpointable():
    import submitit

    return submitit.helpers.Checkpointable


class GroupTask(_checkpointable()):
    """A SLURM job's work: run its groups. On a timeout or preemption submitit requeues it with the same
    arguments; the groups then resume from their predictions.jsonl files (finished runs are skipped)."""

    def __call__(self, jobs: list) -> list:
        return run_groups(jobs)


class _ComposedOnce:
    """A config loader that composes each job's config once where Hydra composes it twice: the sweeper composes
    every job to validate the batch, then the launcher composes each again (0.1 s a job). The first composition
    is kept and handed, once, to the next caller with the same overrides; every other call composes anew."""

    def __init__(self, loader):
        self.loader = loader
        self.kept: dict = {}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list) -> DictConfig:
        key = (id(master_config), tuple(sweep_overrides))
        if key in self.kept:
            return self.kept.pop(key)
        config = self.loader.load_sweep_config(master_config, list(sweep_overrides))
        self.kept[key] = config
        return config

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


class GroupedLauncher(Launcher):
    def __init__(self, skip_invalid: bool = False, **_: Any) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context = None
        self.skip_invalid = bool(skip_invalid)

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        if not isinstance(hydra_context.config_loader, _ComposedOnce):  # shared with the sweeper (validation)
            hydra_context.config_loader = _ComposedOnce(hydra_context.config_loader)
        self.config, self.hydra_context = config, hydra_context

    def _sweep_configs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        configs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = sweep_config.hydra.job.num = idx
            configs.append(sweep_config)
        return configs

    def _returns(self, job_overrides, sweep_configs, results) -> list:
        returns = []
        for overrides, sweep_config, value in zip(job_overrides, sweep_configs, results):
            ret = JobReturn(overrides=list(overrides), cfg=sweep_config, hydra_cfg=self.config,
                            working_dir=str(Path.cwd()), task_name=sweep_config.hydra.job.name)
            ret.return_value, ret.status = value, JobStatus.COMPLETED
            returns.append(ret)
        return returns

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs in groups that share a model and their prefills")
        sweep_configs = self._sweep_configs(job_overrides, initial_job_idx)
        results = run_groups([_job_config(c) for c in sweep_configs], self.skip_invalid)
        return self._returns(job_overrides, sweep_configs, results)


class GroupedSlurmLauncher(GroupedLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(skip_invalid=params.get("skip_invalid", False))
        self.params = params

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        from eval.sweep import group_jobs

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        sweep_configs = self._sweep_configs(job_overrides, initial_job_idx)
        jobs = [_job_config(c) for c in sweep_configs]
        valid, results = check_jobs(jobs, self.skip_invalid)
        groups = [[valid[k] for k in members] for members in group_jobs([jobs[i][0] for i in valid])]
        log.info(f"Submitting {len(groups)} SLURM job(s), one per group, for {len(jobs)} sweep jobs")
        p = self.params
        mem_gb = p["mem_gb"] if p["mem_gb"] is not None else planned_mem_gb(jobs, groups, p["gpus_per_node"])
        log.info(f"Requesting {mem_gb} GB of host memory per job")
        executor = submitit.AutoExecutor(folder=str(sweep_dir / ".submitit" / "%j"), cluster="slurm",
                                         slurm_max_num_timeout=p["max_num_timeout"])
        executor.update_parameters(
            name=p["name"], timeout_min=p["timeout_min"], cpus_per_task=p["cpus_per_task"], mem_gb=mem_gb,
            slurm_partition=p["partition"], gpus_per_node=p["gpus_per_node"], slurm_setup=list(p["setup"]),
            slurm_array_parallelism=p["array_parallelism"], tasks_per_node=1, nodes=1)
        submitted = executor.map_array(GroupTask(), [[jobs[i] for i in members] for members in groups])
        for members, job in zip(groups, submitted):
            for i, metrics in zip(members, job.result()):
                results[i] = metrics
        return self._returns(job_overrides, sweep_configs, results)
