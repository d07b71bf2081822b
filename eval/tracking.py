"""Experiment tracking: one W&B run per job (offline by default), or nothing (`logger=none`)."""
from __future__ import annotations

import os
from pathlib import Path


class NoLogger:
    def log_samples(self, rows: list[dict]) -> None: ...
    def log_summary(self, metrics: dict) -> None: ...
    def log_results_dir(self) -> None: ...
    def finish(self) -> None: ...


class WandbLogger:
    """wandb.init with id = run key, so a resumed or requeued job appends to the same W&B run (`resume="allow"`);
    group = the sweep (its output directory name) unless `logger.group` is set; job type = benchmark."""

    def __init__(self, cfg, config: dict, run_key: str, run_dir: Path, name: str, group: str | None = None):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run_dir = Path(run_dir)
        self.run = wandb.init(
            project=cfg.project, entity=cfg.get("entity"), group=cfg.get("group") or group, job_type="benchmark",
            id=run_key[:16], name=name, config=config, mode=cfg.mode, dir=str(run_dir), resume="allow",
            settings=wandb.Settings(console="off"),
        )

    def log_samples(self, rows: list[dict]) -> None:
        if rows:
            columns = list(rows[0])
            table = self.wandb.Table(columns=columns, data=[[str(r.get(c)) if isinstance(r.get(c), list) else r.get(c)
                                                              for c in columns] for r in rows])
            self.run.log({"predictions": table})

    def log_summary(self, metrics: dict) -> None:
        flat = {f"score/{t}": s for t, s in metrics["scores"].items()}
        flat.update({k: v for k, v in metrics.items() if isinstance(v, (int, float)) and v is not None})
        self.run.log(flat)
        self.run.summary.update(flat)
        table = self.wandb.Table(columns=["task", "score", "n"],
                                 data=[[t, s, metrics["num_samples"][t]] for t, s in metrics["scores"].items()])
        self.run.log({"per_task": table})

    def log_results_dir(self) -> None:
        """The run directory's result files as one artifact of type "results"."""
        artifact = self.wandb.Artifact(f"results-{self.run.id}", type="results")
        for name in ("config.yaml", "predictions.jsonl", "metrics.json"):
            if (self.run_dir / name).exists():
                artifact.add_file(str(self.run_dir / name), name=name)
        self.run.log_artifact(artifact)

    def finish(self) -> None:
        self.run.finish()


def sweep_group() -> str | None:
    """The Hydra multirun directory (last two parts: date_time by default): one W&B group per sweep; None for a
    single run."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        return "_".join(Path(hc.sweep.dir).parts[-2:]) if hc.mode == RunMode.MULTIRUN else None
    except Exception:  # not running under Hydra (tests, library use)
        return None


def build_logger(cfg, config: dict, run_key: str, run_dir: Path, name: str):
    if cfg.name == "none":
        return NoLogger()
    if cfg.name == "wandb":
        if cfg.mode not in ("offline", "online", "disabled"):
            raise ValueError(f"logger.mode must be offline, online or disabled (got {cfg.mode!r})")
        return WandbLogger(cfg, config, run_key, run_dir, name, group=sweep_group())
    raise ValueError(f"unknown logger {cfg.name!r}")
