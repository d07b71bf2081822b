"""Model loading for the three kinds of `conf/model/*.yaml`: the embedded GGUF model, random-weight configs, and
user-provided checkpoints (local path or hub id, never downloaded when offline).

Every model is loaded with `attn_implementation="sparse_kv"`: our registered attention function, which runs the
configured selector. Device: CUDA in bf16 when available, else CPU in fp32.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from locks.core.attention import register_attention
from locks.core.embedded_model import embedded_gguf_path, smollm2_gguf_path
from locks.errors import ConfigError


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    max_context: int
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: list[int]


def default_device_dtype() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def _embedded_tokenizer():
    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _gguf_path(cfg) -> Path:
    """The embedded model's GGUF file (model.gguf, default the SmolLM2 one)."""
    get = cfg.get if hasattr(cfg, "get") else (lambda key, default=None: default)
    return embedded_gguf_path(get("gguf", "smollm2_135m"), get("cache_dir"))


def _gguf_cache(cfg, dtype: torch.dtype) -> Path | None:
    """The folder of the dequantized embedded model: keyed by the GGUF file, its size and time, the dtype and the
    transformers version; None when model.cache_dir is null."""
    import transformers

    cache_dir = cfg.get("cache_dir") if hasattr(cfg, "get") else None
    if not cache_dir:
        return None
    path = _gguf_path(cfg)
    st = path.stat()
    key = f"{path.stem}-{st.st_size}-{int(st.st_mtime)}-{str(dtype).replace('torch.', '')}-tf{transformers.__version__}"
    return Path(os.path.expanduser(str(cache_dir))) / key


def _load_gguf(cfg, dtype: torch.dtype, attn: str, tokenizer=None):
    """The embedded GGUF model. Dequantizing it takes most of a run's start-up (about 17 s of 22 on 2 CPU cores),
    so the dequantized weights and the tokenizer are saved once to `model.cache_dir` (_gguf_cache) and loaded from
    there next time: the same tensors, in a second or two. cache_dir null: always dequantize."""
    from filelock import FileLock

    cached = _gguf_cache(cfg, dtype)
    if cached is None:
        return _dequantize(cfg, dtype, attn, None, tokenizer)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cached) + ".lock"):  # concurrent runs (test workers, array jobs): one dequantizes, the rest wait
        if not (cached / "config.json").exists():
            return _dequantize(cfg, dtype, attn, cached, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype, attn_implementation=attn)
    return model, tokenizer or _gguf_tokenizer(cfg, dtype)


def _dequantize(cfg, dtype: torch.dtype, attn: str, cached: Path | None, tokenizer=None):
    """The GGUF file's model, dequantized; saved to `cached` (written aside, then renamed) when given."""
    import shutil
    import tempfile

    path = _gguf_path(cfg)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                 attn_implementation=attn)
    if cached is not None:
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
        try:  # written aside, then renamed: a concurrent or killed run never sees half a checkpoint
            import copy

            from safetensors.torch import save_model

            config = copy.deepcopy(model.config)  # the dequantized weights carry no quantization
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config.save_pretrained(tmp)
            if model.generation_config is not None:
                model.generation_config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"))  # tied embeddings stored once
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, cached)
        except OSError:  # another process renamed its copy first
            shutil.rmtree(tmp, ignore_errors=True)
    return model, tokenizer


def _gguf_tokenizer(cfg, dtype: torch.dtype):
    """The embedded model's tokenizer: from the dequantized copy when there is one, else from the GGUF file."""
    path = _gguf_path(cfg)
    cached = _gguf_cache(cfg, dtype)
    if cached is not None and (cached / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(cached)
        tokenizer.name_or_path = str(path.parent)  # what runs record (and RULER's sample cache keys on)
        return tokenizer
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _is_local_path(path: str) -> bool:
    """A filesystem path rather than a Hub id ("org/name"): absolute, ~ or ./-relative, or an existing entry."""
    return os.path.isabs(path) or path.startswith((".", "~")) or os.path.exists(path) or path.count("/") > 1


def _path_key(cfg) -> str:
    """How the user set the checkpoint: model.path, or the environment variable it came from."""
    env = cfg.get("path_env") if hasattr(cfg, "get") else None
    if env and os.environ.get(env) is not None and os.environ.get(env) == str(cfg.path):
        return f"${env} (model.path)"
    return "model.path"


def check_model_files(cfg) -> None:
    """What loading the model will read from disk, checked before any work: the embedded model's package, or a
    pretrained model's local checkpoint folder (with its config.json). One ConfigError names the key and the fix.
    A Hub id is left to the loader (the HF cache, or the Hub when online)."""
    if cfg.source in ("gguf_package", "random"):
        try:
            _gguf_path(cfg) if cfg.source == "gguf_package" else smollm2_gguf_path()
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None
        return
    if cfg.source != "pretrained":
        raise ConfigError(f"model.source must be gguf_package, random or pretrained (got {cfg.source!r})")
    path = os.path.expanduser(str(cfg.path))
    if not _is_local_path(path):
        return
    fix = (f"download it on a machine with internet (`huggingface-cli download {cfg.hub_id}`) and pass its local "
           f"folder with model.path=/path/to/checkpoint" + (f" (or set {cfg.path_env})" if cfg.get("path_env") else ""))
    if not os.path.isdir(path):
        raise ConfigError(f"{_path_key(cfg)}={cfg.path}: no such folder for model {cfg.name!r}; {fix}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"{_path_key(cfg)}={cfg.path}: the folder has no config.json, so it is not a transformers "
                          f"checkpoint of model {cfg.name!r}; {fix}")


def load_tokenizer(cfg):
    """The model's tokenizer alone (cheap: no weights), so that a benchmark can check it before the model loads."""
    if cfg.source == "gguf_package":
        return _gguf_tokenizer(cfg, default_device_dtype()[1])
    if cfg.source == "random":
        return _embedded_tokenizer()
    path = os.path.expanduser(str(cfg.path))
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"the tokenizer of model {cfg.name!r} could not be loaded from {_path_key(cfg)}={path!r} "
            f"({type(err).__name__}); download the checkpoint on a machine with internet (`huggingface-cli download "
            f"{cfg.hub_id}`) and pass its local folder with model.path=/path/to/checkpoint"
            + (f" (or set {cfg.path_env})" if cfg.get("path_env") else "")
        ) from None


def load_model(cfg, tokenizer=None) -> LoadedModel:
    """cfg: the `model` config group (source: gguf_package | random | pretrained); `tokenizer`: the one
    load_tokenizer gave, when the caller has already loaded it."""
    attn = register_attention()
    device, dtype = default_device_dtype()
    if cfg.source == "gguf_package":
        model, tokenizer = _load_gguf(cfg, dtype, attn, tokenizer)
    elif cfg.source == "random":
        torch.manual_seed(cfg.seed)
        config = LlamaConfig(**cfg.config, attn_implementation=attn)
        model = LlamaForCausalLM(config).to(dtype)
        tokenizer = tokenizer or _embedded_tokenizer()
        if config.vocab_size < len(tokenizer):
            raise ConfigError(f"model.config.vocab_size must be >= the tokenizer's {len(tokenizer)} tokens")
    elif cfg.source == "pretrained":
        path = os.path.expanduser(str(cfg.path))
        try:
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"model {cfg.name!r} could not be loaded from {path!r} ({type(err).__name__}); download it on a "
                f"machine with internet (`huggingface-cli download {cfg.hub_id}`) and pass its local folder with "
                f"model.path=/path/to/checkpoint (or set {cfg.path_env})"
            ) from None
    else:
        raise ConfigError(f"model.source must be gguf_package, random or pretrained (got {cfg.source!r})")
    model.to(device).eval()
    # what a method that calibrates on the model reads (DoubleSparsity: its text, and where to cache the result)
    model.locks_tokenizer, model.locks_cache_dir = tokenizer, cfg.get("cache_dir")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=cfg.name,
        max_context=int(model.config.max_position_embeddings),
        device=device,
        dtype=dtype,
        eos_token_ids=_eos_ids(model, tokenizer),
    )
