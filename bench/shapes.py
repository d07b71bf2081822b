"""Model shapes of the GPU benchmarks (bench/decode.py, bench/e2e.py) and of the ahead-of-time kernel compile check
(scripts/compile_kernels.py): one place for them."""

# per-layer decode attention: (query heads, KV heads, head dim)
ATTENTION = {"llama": (32, 8, 128), "glm": (32, 2, 128)}  # Llama-3.1-8B, GLM-4-9B
ATTENTION_DRY = {"llama": (8, 2, 64), "glm": (16, 1, 64)}  # the same GQA groups (4, 16), tiny: CPU dry runs

# every model the harness is configured for (conf/model/): (query heads, KV heads, head dim)
CONFIGURED = {"smollm2-135m": (9, 3, 64), "llama-3.1-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128),
              "glm-4-9b": (32, 2, 128)}

# whole random-weight models of the end-to-end step: (transformers model kind, config overrides)
MODELS = {
    "glm": ("glm", {}),  # GlmConfig's defaults are GLM-4-9B's
    "llama": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0)),
}
MODELS_DRY = {  # the same GQA groups (16 and 4), tiny
    "glm": ("glm", dict(vocab_size=1024, pad_token_id=0, eos_token_id=[1], hidden_size=256, intermediate_size=512,
                        num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=1, head_dim=64)),
    "llama": ("llama", dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=64)),
}

# whole models of the device-memory table (paper_figs/memory_table.py): (name, layers, query heads, KV heads, head dim)
FULL_MODELS = {"glm": ("GLM-4-9B", 40, 32, 2, 128), "llama": ("Llama-3.1-8B", 32, 32, 8, 128)}

# the model whose static step bench/launches.py counts: 4 layers (Quest's 2 dense layers and 2 selecting ones), the
# GQA group of Llama-3.1-8B (4), tiny
LAUNCH_MODEL = ("llama", dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096))
