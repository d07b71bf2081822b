"""Entry point: `python run.py method=locks budget=2048` (Hydra app; see conf/ and README.md)."""
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from locks.selector import ConfigError


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from eval.runner import run_benchmark

    try:
        config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run_benchmark(config, cfg)
    except (ConfigError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
