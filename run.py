"""Entry point: `python run.py method=locks budget=2048` (Hydra app; see conf/ and README.md)."""
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from locks.errors import ConfigError


def run_profile(cfg: DictConfig) -> None:
    """`job: profile` (conf/experiment/paper_latency.yaml): the GPU decode benchmarks, bench/decode.py (one layer's
    decode attention) then bench/e2e.py (the CUDA-graph decode step of a whole random-weight model)."""
    from bench import decode, e2e

    p = cfg.profile
    dry = ["--dry-run"] if p.dry_run else []
    rc = decode.main(["--out", str(p.out), "--budget", str(cfg.budget), "--reps", str(p.reps),
                                    "--contexts", *map(str, p.contexts), "--shapes", *p.shapes,
                                    "--batch", *map(str, p.batch)] + dry)
    if p.get("e2e_out"):
        rc = max(rc, e2e.main(["--out", str(p.e2e_out), "--budget", str(cfg.budget), "--reps",
                                             str(p.reps), "--contexts", *map(str, p.contexts),
                                             "--shapes", *p.shapes] + dry))
    sys.exit(rc)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from eval import events
    from eval.config_schema import check_config
    from eval.runner import run_benchmark

    events.record_startup()  # the interpreter and the imports, once per process

    try:
        check_config(cfg, HydraConfig.get().runtime.choices)  # a wrong key or type: one line, before any work
        if cfg.get("job", "benchmark") == "profile":
            return run_profile(cfg)
        config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run_benchmark(config, cfg)
    except (ConfigError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
