"""DoubleSparsity's offline channel calibration (`docs/methods/doublesparsity.md`, "Calibration").

Per layer and head, each of the d channels is ranked by its mean magnitude over calibration text, most important
first, as the official `config/offline_calibration.py` does:

    q_proj[h]  = mean_t |q_t,h|          (query projection output, before RoPE; one row per query head)
    k_proj[j]  = mean_t |k_t,j|          (key projection output, before RoPE; one row per KV head)
    qk_proj[h] = mean_t |q_t,h * k_t,j|  (after RoPE, j = the KV head of h: "each token attends to itself")

The result is the official JSON format, {"model.layers.{l}.self_attn.{q_proj,k_proj,qk_proj}": [[channel, ...],
...]}. The official calibration text is 256 documents of at most 512 tokens from the Pile's validation set (shuffled
with seed 42, concatenated, cut into 512-token blocks). The harness has no Pile: its stand-in is the offline text it
ships, the World English Bible (locks/offline_text.py), cut at sentence ends into documents of at most
DOCUMENT_CHARS characters, then the same rule. A model with no tokenizer (the random-weight test models) calibrates
on seeded random tokens instead, and says so in the log.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import re
import tempfile
import weakref
from pathlib import Path

import torch
from tqdm import tqdm

from locks.errors import ConfigError

log = logging.getLogger(__name__)

VERSION = 1  # of the calibration text and rule; part of every cached file's name
DOCUMENTS, BLOCK, SEED = 256, 512, 42  # the official get_calib_dataset(n_samples=256, block_size=512), shuffle seed
DOCUMENT_CHARS = 1000  # a stand-in document: consecutive sentences up to this many characters
RANDOM_BLOCKS = 32  # a model without a tokenizer: this many blocks of random tokens
KINDS = {"q": "q_proj", "k": "k_proj", "qk": "qk_proj"}
RECORDER = "doublesparsity_calibration"  # the attention function that records post-RoPE q and k


def layer_key(layer: int, kind: str) -> str:
    return f"model.layers.{layer}.self_attn.{kind}"


def offline_documents() -> list[str]:
    """The shipped text as documents: consecutive sentences, each document at most DOCUMENT_CHARS characters."""
    from locks.offline_text import web_text

    documents, current = [], ""
    for sentence in re.split(r"(?<=[.!?])\s+", web_text()):
        if current and len(current) + 1 + len(sentence) > DOCUMENT_CHARS:
            documents.append(current)
            current = ""
        current = f"{current} {sentence}" if current else sentence
    return documents + [current] if current else documents


def calibration_blocks(tokenizer, vocab_size: int) -> list[torch.Tensor]:
    """[1, BLOCK] token blocks: the first DOCUMENTS shuffled documents of at most BLOCK tokens (longer ones skipped,
    as the official loader does), concatenated and cut; without a tokenizer, RANDOM_BLOCKS seeded random blocks."""
    if tokenizer is None:
        generator = torch.Generator().manual_seed(SEED)
        return list(torch.randint(0, vocab_size, (RANDOM_BLOCKS, 1, BLOCK), generator=generator))
    documents = offline_documents()
    random.Random(SEED).shuffle(documents)
    ids, taken = [], 0
    for document in documents:
        encoded = tokenizer.encode(document.strip())
        if 0 < len(encoded) <= BLOCK:
            ids.extend(encoded)
            taken += 1
            if taken == DOCUMENTS:
                break
    stream = torch.tensor([ids])
    return [stream[:, i * BLOCK : (i + 1) * BLOCK] for i in range(stream.shape[1] // BLOCK)]


def _attention_modules(model) -> dict[int, torch.nn.Module]:
    """Decoder layer index -> its self-attention module (any transformers family with q_proj / k_proj)."""
    found = {}
    for name, module in model.named_modules():
        match = re.search(r"layers\.(\d+)\.self_attn$", name)
        if match and hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            found[int(match.group(1))] = module
    if not found:
        raise ConfigError(f"{type(model).__name__}: no layers.N.self_attn with q_proj and k_proj to calibrate")
    return found


@torch.no_grad()
def channel_rankings(model, blocks: list[torch.Tensor], progress: bool = True) -> dict[str, list[list[int]]]:
    """The official JSON dict of `model` over `blocks` (module docstring), every layer and all three kinds."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    from locks.core.attention import dense_prefill

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    Hq, Hkv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // Hq
    sums: dict[str, torch.Tensor] = {}

    def add(key: str, value: torch.Tensor) -> None:
        sums[key] = sums[key] + value if key in sums else value

    def projection_hook(layer: int, kind: str, heads: int):
        return lambda module, inputs, out: add(layer_key(layer, kind), out.reshape(-1, heads, d).abs().float().mean(0))

    def record(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        product = query * key.repeat_interleave(Hq // Hkv, dim=1)  # query [B, Hq, T, d], key [B, Hkv, T, d]
        add(layer_key(module.layer_idx, "qk_proj"), product.abs().float().mean((0, 2)))
        # the harness's own dense attention (sliding windows and attention sinks as the model has them)
        return dense_prefill(module, query, key, value, attention_mask, dropout, scaling, "sdpa", **kwargs), None

    AttentionInterface.register(RECORDER, record)
    AttentionMaskInterface.register(RECORDER, sdpa_mask)
    hooks = []
    for layer, attention in _attention_modules(model).items():
        hooks.append(attention.q_proj.register_forward_hook(projection_hook(layer, "q_proj", Hq)))
        hooks.append(attention.k_proj.register_forward_hook(projection_hook(layer, "k_proj", Hkv)))
    previous = model.config._attn_implementation
    device = next(model.parameters()).device
    model.set_attn_implementation(RECORDER)
    try:
        for block in tqdm(blocks, desc="DoubleSparsity calibration", leave=False, disable=not progress):
            model(input_ids=block.to(device), use_cache=False)
    finally:
        model.set_attn_implementation(previous)
        for hook in hooks:
            hook.remove()
    return {key: torch.sort(value, dim=-1, descending=True, stable=True).indices.tolist()
            for key, value in sorted(sums.items())}


def _fingerprint(model, tokenizer) -> str:
    """What a cached calibration depends on: the model's config, a sample of every weight, the tokenizer, VERSION."""
    digest = hashlib.sha256(f"{VERSION}|{model.config.to_json_string()}".encode())
    for name, parameter in model.named_parameters():
        flat = parameter.detach().reshape(-1)
        sample = torch.cat([flat[:64], flat[-64:]]).float().cpu()
        digest.update(f"{name}{tuple(parameter.shape)}".encode() + sample.numpy().tobytes())
    if tokenizer is not None:
        digest.update(f"{getattr(tokenizer, 'name_or_path', '')}|{len(tokenizer)}".encode())
    return digest.hexdigest()[:16]


_CALIBRATED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def calibrated_file(model) -> Path:
    """This model's calibration JSON, computed once and cached: in memory per model, and on disk under the model's
    `locks_cache_dir` (set by locks.core.models.load_model from model.cache_dir; else a temporary directory), named
    by its fingerprint. The calibration text is read with the model's `locks_tokenizer` (also set at load)."""
    from filelock import FileLock

    if model in _CALIBRATED:
        return _CALIBRATED[model]
    tokenizer = getattr(model, "locks_tokenizer", None)
    root = getattr(model, "locks_cache_dir", None) or os.path.join(tempfile.gettempdir(), "locks")
    path = Path(os.path.expanduser(str(root))) / "doublesparsity" / f"{_fingerprint(model, tokenizer)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):  # concurrent runs of one model: one calibrates, the rest read its file
        if not path.exists():
            if tokenizer is None:
                log.warning("DoubleSparsity: the model has no tokenizer, so its channels are calibrated on seeded "
                            "random tokens (a random-weight model; pass method.channel_config= for a real one)")
            vocab = model.config.get_text_config().vocab_size
            rankings = channel_rankings(model, calibration_blocks(tokenizer, vocab))
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                json.dump(rankings, f)
            os.replace(tmp, path)
    _CALIBRATED[model] = path
    return path


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"method.channel_config={path}: not a readable channel-ranking JSON file "
                          f"({type(err).__name__}); make one with scripts/calibrate_doublesparsity.py") from None


def resolve_channel_config(path: str) -> dict:
    """The JSON dict of a channel-config file (read once per path and modification time)."""
    if path == "auto":
        raise ConfigError("method.channel_config=auto is resolved per model when the cache is built "
                          "(DoubleSparsitySelector.prepare_options); a selector built alone needs a file")
    if not os.path.isfile(path):
        raise ConfigError(f"method.channel_config={path}: no such file; make one with "
                          f"scripts/calibrate_doublesparsity.py or pass the official config/<org>/<model>.json")
    return _load(path, os.path.getmtime(path))


def layer_channels(config: dict, layer: int, channel: str) -> list[list[int]]:
    key = layer_key(layer, KINDS[channel])
    if key not in config:
        raise ConfigError(f"method.channel_config has no {key!r} (channel={channel}): it was calibrated for another "
                          f"model or without that kind; recalibrate with scripts/calibrate_doublesparsity.py")
    return config[key]


def check_channels(rows: list, heads: int, head_dim: int, where: str) -> None:
    """A ranking has one row per head, each a permutation of range(head_dim)."""
    if len(rows) != heads or any(sorted(row) != list(range(head_dim)) for row in rows):
        raise ConfigError(f"method.channel_config: {where} needs {heads} rows, each a permutation of "
                          f"0..{head_dim - 1}; this file was calibrated for another model")


def check_channel_file(path: str, model_config, channel: str, dense_layers: int) -> None:
    """Before the model loads: every sparse layer of `model_config` (a transformers config) has its ranking."""
    config = resolve_channel_config(path)
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    heads = text.num_attention_heads if channel != "k" else text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    for layer in range(dense_layers, text.num_hidden_layers):
        check_channels(layer_channels(config, layer, channel), heads, head_dim, f"layer {layer}")
