#!/usr/bin/env bash
# The GPU checks of issues 6 and 7 as one prepared command for a lent H200 (the `device` tool), printing every result
# as it is taken and writing it under $OUT, so that a time-out loses nothing measured before it:
#   1. the kernel and static-decode tests, compiled on the GPU (real CUDA-graph capture of every method's decode step,
#      ShadowKV's and LRQK's reading their pinned host stores from inside the graph)
#   2. scripts/bench_decode.py  per-layer decode attention at 128K / 256K / 1M, every selector -> $OUT/decode.jsonl
#   3. scripts/bench_e2e.py     the CUDA-graph decode step of whole random models, every selector -> $OUT/e2e.jsonl
#   4. scripts/fit_t_node.py    t_node of the launch model (docs/launches.md) from those steps -> $OUT/t_node.json
# Each part has its own time limit (TESTS_S, DECODE_S, E2E_S seconds), so one run stays well inside a device call.
#
# Here, first (the image has transformers 5.17; this project pins 5.24, a pure-Python wheel that travels):
#   echo /.whl/ >> .git/info/exclude; bash scripts/gpu_session.sh fetch
# Then one device call: carry [".whl"], command "bash scripts/gpu_session.sh run", timeout_s about 420 (the three
# limits below add up to about 6 minutes, leaving device time for a rerun).
# On this machine `bash scripts/gpu_session.sh dry` runs the same sequence on CPU at dry-run sizes.
set -u
cd "$(dirname "$0")/.."
mode=${1:-run}
PY=${PY:-python3}

if [ "$mode" = fetch ]; then
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl transformers==5.24.0
fi
if [ "$mode" != run ] && [ "$mode" != dry ]; then
  echo "usage: $0 fetch | run | dry" >&2
  exit 2
fi

OUT=${OUT:-outputs/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$mode" = run ] && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
# per layer: the 1M context first (the headline targets come before anything a time limit could cut off), batch 1;
# end to end: 128K first, where every selector's step fits next to the cache, then 1M and 256K
sizes=(--contexts 1048576 131072 262144 --batch 1)
e2e_sizes=(--contexts 131072 1048576 262144)
if [ "$mode" = dry ]; then sizes=(--dry-run); e2e_sizes=(--dry-run); fi

{
  date -u
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"triton", triton.__version__, "transformers", transformers.__version__, "gpu", torch.cuda.is_available())'
} 2>&1 | tee "$OUT/env.txt"

echo "== 1. kernel and static-decode tests"
timeout "${TESTS_S:-120}" "$PY" -m pytest -q -x -p no:cacheprovider tests/core/test_decode_kernels.py tests/core/test_host_rows.py \
  tests/core/test_static_decode.py \
  2>&1 | tee "$OUT/tests.txt"
echo "== 2. per-layer decode attention"
timeout "${DECODE_S:-110}" "$PY" scripts/bench_decode.py --out "$OUT/decode.jsonl" "${sizes[@]}" 2>&1 \
  | tee "$OUT/decode.txt"
echo "== 3. end-to-end CUDA-graph decode step"
timeout "${E2E_S:-140}" "$PY" scripts/bench_e2e.py --out "$OUT/e2e.jsonl" "${e2e_sizes[@]}" 2>&1 | tee "$OUT/e2e.txt"
echo "== 4. t_node, the device time per graph node, fitted from the e2e steps (a dry run has none to fit)"
"$PY" scripts/fit_t_node.py "$OUT/e2e.jsonl" --out "$OUT/t_node.json" 2>&1 | tee "$OUT/t_node.txt"
echo "== done: $OUT"
