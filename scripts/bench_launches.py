"""Kernels per static decode step of every method, per layer, at batch 1 and 8, with and without coverage, and the
GPU step time they imply for the GLM-4-9B / Llama-3.1-8B shapes (bench/launches.py says how it counts):

    python scripts/bench_launches.py --out results/launches.json
"""
import sys

from bench.launches import main

if __name__ == "__main__":
    sys.exit(main())
