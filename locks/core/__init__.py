"""The method-agnostic core of the harness: the selector interface (selector.py) and registry (registry.py), the
`sparse_kv` attention function (attention.py) and its PyTorch reference decode (reference.py), the KV cache that
carries one selector per layer (cache.py), page-selection helpers shared by page selectors (paging.py), the static
(CUDA-graph) decode step (static_decode.py), greedy generation (generation.py) and model loading (models.py,
embedded_model.py). Nothing here imports a method: docs/architecture.md."""
