"""Entry point: `python run.py method=locks budget=2048` (Hydra app; see conf/ and README.md). `run(cfg)` is the same
job as a function returning its exit code, for tests and notebooks: `run(compose_config(["method=quest"]))`."""
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from locks.errors import ConfigError

CONF = Path(__file__).resolve().parent / "conf"


def run_profile(cfg: DictConfig) -> int:
    """`job: profile` (conf/experiment/paper_latency.yaml): the GPU decode benchmarks, bench/decode.py (one layer's
    decode attention) then bench/e2e.py (the CUDA-graph decode step of a whole random-weight model)."""
    from bench import decode, e2e

    p = cfg.profile
    dry = ["--dry-run"] if p.dry_run else []
    rc = decode.main(["--out", str(p.out), "--budget", str(cfg.budget), "--reps", str(p.reps),
                      "--contexts", *map(str, p.contexts), "--shapes", *p.shapes, "--batch", *map(str, p.batch)] + dry)
    if p.get("e2e_out"):
        rc = max(rc, e2e.main(["--out", str(p.e2e_out), "--budget", str(cfg.budget), "--reps", str(p.reps),
                               "--contexts", *map(str, p.contexts), "--shapes", *p.shapes] + dry))
    return rc


def run(cfg: DictConfig) -> int:
    """One job of the composed config (Hydra's runtime config set, as under `hydra.main` or `compose_config`) -> its
    exit code: 0, the profile's, or 2 after one line `error: ...` on stderr for a bad key or value or a missing
    file, found before any model loads."""
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
        return 2
    return 0


def compose_config(overrides: list[str]) -> DictConfig:
    """The config `python run.py <overrides>` would run, composed in-process, with Hydra's runtime config (the chosen
    group files) set as `hydra.main` sets it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    rc = run(cfg)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
