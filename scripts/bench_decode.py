"""Per-layer decode-attention benchmark on the GPU (bench/decode.py says what it measures):

    python scripts/bench_decode.py --out results/gpu/decode.jsonl
    python scripts/bench_decode.py --dry-run --out /tmp/dry.jsonl      # CPU plumbing check (CI)
"""
import sys

from bench.decode import main

if __name__ == "__main__":
    sys.exit(main())
