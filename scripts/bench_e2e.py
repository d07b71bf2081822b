"""End-to-end CUDA-graph decode step of a random-weight GLM-4-9B / Llama-3.1-8B model (bench/e2e.py says what it
measures):

    python scripts/bench_e2e.py --out results/gpu/e2e.jsonl
    python scripts/bench_e2e.py --dry-run --out /tmp/e2e.jsonl         # CPU plumbing check (CI)
"""
import sys

from bench.e2e import main

if __name__ == "__main__":
    sys.exit(main())
