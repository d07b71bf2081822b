"""DoubleSparsity's channel calibration of a configured model (docs/methods/doublesparsity.md, "Calibration"),
written in the official JSON format: every layer's q_proj, k_proj and qk_proj rankings.

    python scripts/calibrate_doublesparsity.py --out results/doublesparsity/smollm2_135m.json
    python scripts/calibrate_doublesparsity.py model=gemma3_270m --out results/doublesparsity/gemma3_270m.json
    python scripts/calibrate_doublesparsity.py model=llama31_8b model.path=/ckpt/Llama-3.1-8B-Instruct --out llama.json

The overrides are run.py's (`model=...`). The result is also the model's cached calibration, which
`method.channel_config=auto` (the default) reads; pass the written file to another machine with
`method.channel_config=/path/to/file.json`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from baselines.doublesparsity.calibration import calibrated_file
    from locks.core.models import load_model
    from run import compose_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="run.py overrides that choose the model, e.g. model=gemma3_270m")
    p.add_argument("--out", required=True, help="where to write the JSON")
    args = p.parse_args(argv)
    cfg = compose_config(args.overrides)
    loaded = load_model(cfg.model)
    cached = calibrated_file(loaded.model)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, out)
    print(f"calibrate_doublesparsity: {cfg.model.name} -> {out} (cached as {cached})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
