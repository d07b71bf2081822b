"""The GPU speed benchmarks as importable modules: decode.py (one layer's decode attention: FullKV, LOCKS, Quest),
e2e.py (the CUDA-graph decode step of a whole random-weight model), and what they share (shapes, inputs, timing,
records). `scripts/bench_decode.py` and `scripts/bench_e2e.py` are their command lines; `run.py
+experiment=paper_latency` calls them too. They use the selectors and kernels through their public API."""
