"""Experiment tracking: one W&B run per job (offline by default), or nothing (`logger=none`)."""
from __future__ import annotations

import os
from pathlib import Path


class NoLogger:
    def log_samples(self, rows: list[dict]) -> None: ...
    def log_summary(self, metrics: dict) -> None: ...
    def finish(self) -> None: ...


class WandbLogger:
    """wandb.init with id = run key, so a resumed run appends to the same W&B run (`resume="allow"`)."""

    def __init__(self, cfg, config: dict, run_key: str, run_dir: Path, name: str):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project, entity=cfg.get("entity"), group=cfg.get("group"), job_type="benchmark",
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

    def finish(self) -> None:
        self.run.finish()


def build_logger(cfg, config: dict, run_key: str, run_dir: Path, name: str):
    if cfg.name == "none":
        return NoLogger()
    if cfg.name == "wandb":
        if cfg.mode not in ("offline", "online", "disabled"):
            raise ValueError(f"logger.mode must be offline, online or disabled (got {cfg.mode!r})")
        return WandbLogger(cfg, config, run_key, run_dir, name)
    raise ValueError(f"unknown logger {cfg.name!r}")
