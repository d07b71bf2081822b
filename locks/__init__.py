"""Sparse KV-cache decode attention. core/: the method-agnostic harness core; kernels/: the generic fused Triton
kernels; method/: the LOCKS selector (summaries, selector, kernels); errors.py: the one user-facing error type. The
baselines live in the top-level `baselines` package. docs/architecture.md."""
