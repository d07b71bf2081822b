"""DoubleSparsity (Yang et al. 2024, `docs/methods/doublesparsity.md`): token top-k per query head, scored on a few
offline-calibrated "label" channels of the keys.

Offline, each layer's channels are ranked per query head (calibration.py: mean |q|, |k| or |q * k| over calibration
text); query head h keeps the first r = d / group_factor of its ranking, S_h. At a decode step (the prefill is dense):

    q~ = Q_b(q_h[S_h]),   k~_i = Q_b(k_i[S_h])   (k_i from the KV head of h; Q_b: row-wise b-bit min/max
                                                   pseudo-quantization over the r entries, none at b = 16)
    s_i = q~ . k~_i / sqrt(r)

and head h attends exactly its `budget` tokens of largest s_i (every token while L <= budget). variant=twilight is
Twilight's re-implementation (its DoubleSparsity base, docs/methods/twilight.md): q~ = q_h[S_h] unquantized, k~_i by
the per-token min/max quantizer of locks/core/quantize.py, s_i over sqrt(d). Nothing is forced: no
sink, no window, the newest token competes too. A KV head reads the union of its G heads' sets. The key labels are
kept per query head and cached as tokens arrive (the official system path's label cache); the first `dense_layers`
layers are dense (the core's, locks/core/dense.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from locks.core.buffers import grown, resized
from locks.core.chunks import by_chunks
from locks.core.options import Options, integer, one_of, option, path_or
from locks.core.quantize import min_max_quantize
from locks.core.registry import register
from locks.core.selector import LayerInfo, Selection, Selector, newest_key, row_length, write_slot
from locks.core.topk import top_of_keys, top_units_lowest_first
from locks.errors import ConfigError

from baselines.doublesparsity.calibration import (calibrated_file, check_channel_file, check_channels, layer_channels,
                                                  resolve_channel_config)

SCORE_CHUNK_BYTES = 64 << 20  # the most fp64 labels a step's scoring holds at once (`_scores`)


def pseudo_quantize(x: Tensor, bits: int) -> Tensor:
    """Row-wise over the last axis: x~ = round((x - min) s) / s + min with s = (2^b - 1) / (max - min) (a range of 0
    counts as 1); the official label quantizer. b = 16: x unchanged."""
    if bits >= 16:
        return x
    levels = 2**bits - 1
    low, high = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = levels / torch.where(high == low, torch.ones_like(high), high - low)
    return torch.round((x - low) * scale).clamp(0, levels) / scale + low


@dataclass(frozen=True)
class DoubleSparsityOptions(Options):
    channel: str = option("q", one_of("q", "k", "qk"))  # the ranking: mean |q|, |k| or |q * k| per channel
    group_factor: int = option(2, integer(1))  # r = head_dim / group_factor label channels per query head
    label_bits: int = option(2, integer(1))  # b-bit labels (16: unquantized)
    dense_layers: int = option(2, integer(0))  # the first layers attend densely (locks/core/dense.py)
    # auto: this model's calibration, computed once and cached (calibration.py); else a JSON file in the official format
    channel_config: str = option("auto", path_or("auto", "a channel-ranking JSON file"))
    variant: str = option("official", one_of("official", "twilight"))  # twilight: Twilight's base (module docstring)


@register
class DoubleSparsitySelector(Selector):
    name = "doublesparsity"
    display_name = "DoubleSparsity"
    report_order = 8
    plot_style = {"marker": "P"}
    row_state = ("labels",)
    Options = DoubleSparsityOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        d, G = info.head_dim, info.group_size
        if d % self.group_factor:
            raise ConfigError(f"method.group_factor={self.group_factor} must divide head_dim={d}")
        if self.channel == "k" and G > 1:
            raise ConfigError("method.channel=k ranks channels per KV head, which the official code applies to the "
                              "first H_kv query heads only under GQA; use channel=q or qk")
        self.r = d // self.group_factor
        self.fused = info.backend == "triton"  # the static selection in one launch (kernels.py), imported only then
        self.channels: Tensor | None = None  # S_h [Hq, r], read from the channel config at the prefill
        self.labels: Tensor | None = None  # k~ per query head [B, Hq, capacity, r] fp32
        self.length = 0  # tokens labelled
        self.reserve = 0

    @classmethod
    def prepare_options(cls, model, options: dict) -> dict:
        """channel_config=auto -> this model's calibration file (computed once, calibration.py)."""
        if options.get("channel_config", "auto") != "auto":
            return options
        return {**options, "channel_config": str(calibrated_file(model))}

    @classmethod
    def check_model_config(cls, options, model_config) -> None:
        if options.channel_config != "auto":
            check_channel_file(options.channel_config, model_config, options.channel, options.dense_layers)

    def _read_channels(self, device) -> Tensor:
        rows = layer_channels(resolve_channel_config(self.channel_config), self.info.layer_idx, self.channel)
        check_channels(rows, self.info.num_heads, self.info.head_dim, f"layer {self.info.layer_idx}")
        return torch.as_tensor(rows, device=device)[:, : self.r]

    def _quantizers(self) -> tuple[str, str]:
        """(query's, keys') label quantizer: official = pseudo_quantize, twilight = min_max_quantize, or none."""
        if self.label_bits >= 16:
            return "none", "none"
        return ("official", "official") if self.variant == "official" else ("none", "twilight")

    def _scale(self) -> float:
        return (self.r if self.variant == "official" else self.info.head_dim) ** 0.5

    def _label(self, x: Tensor, key: bool) -> Tensor:
        """x [B, Hq, n, d] (queries, or keys repeated to query heads) -> Q_b(x[S_h]) [B, Hq, n, r] in fp32."""
        index = self.channels.view(1, -1, 1, self.r).expand(*x.shape[:3], self.r)
        label = x.float().gather(-1, index)
        quantizer = self._quantizers()[key]
        if quantizer == "official":
            return pseudo_quantize(label, self.label_bits)
        return min_max_quantize(label, self.label_bits) if quantizer == "twilight" else label

    def _key_labels(self, keys: Tensor) -> Tensor:
        return self._label(keys.repeat_interleave(self.info.group_size, dim=1), key=True)

    def prefill(self, ctx) -> None:
        self.reserve = int(ctx.max_new_tokens or 0)  # room for the generation's labels, as the cache has for its K/V
        self.append(ctx.keys, ctx.values)

    def append(self, keys: Tensor, values: Tensor) -> None:
        L = keys.shape[2]
        if L <= self.length:
            return
        if self.channels is None:
            self.channels = self._read_channels(keys.device)
        new = self._key_labels(keys[:, :, self.length :])
        if self.labels is None:
            self.labels = new.new_zeros(*new.shape[:2], 0, self.r)
        self.labels = grown(self.labels, self.length, L, minimum=L + self.reserve)
        self.labels[:, :, self.length : L] = new
        self.length = L

    def _scores(self, query: Tensor, slots: int) -> Tensor:
        """s [B, Hkv, G, slots] of the first `slots` labels, accumulated in fp64 (the fp32 products are exact there):
        a token's score then does not depend on how many slots the product spans, so the eager step (L slots) and
        the static one (every preallocated slot) rank the many exact ties of low-bit labels alike. The fp64 labels
        are made SCORE_CHUNK_BYTES at a time (at once they would be 8 bytes per label entry: 1 GiB a step for
        Llama-3.1-8B's shape at 64K tokens)."""
        B, Hq, d = query.shape
        q = self._label(query.view(B, Hq, 1, d), key=False).double()
        step = max(1, SCORE_CHUNK_BYTES // (B * Hq * self.r * 8))  # the fp64 labels of `step` slots at a time
        s = by_chunks(slots, step, lambda chunk: torch.einsum("bhxr,bhlr->bhl", q, self.labels[:, :, chunk].double()))
        s = s.float() / self._scale()
        return s.view(B, self.info.num_kv_heads, self.info.group_size, slots)

    def _metadata_bytes(self, length: int) -> float:
        """Every token's label per query head (r b-bit entries, plus an fp16 minimum and scale when quantized)."""
        per_label = self.r * self.label_bits / 8 + (4 if self.label_bits < 16 else 0)
        return float(self.info.num_heads * length * per_label)

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        L = keys.shape[2]
        self.append(keys, values)  # a no-op after the harness's append; direct calls may skip it
        if self.budget >= L:
            return Selection.all_tokens()
        top = top_units_lowest_first(self._scores(query, L), self.budget)
        return Selection(indices=top, valid=torch.ones_like(top, dtype=torch.bool),
                         metadata_bytes=self._metadata_bytes(L))

    def memory_bytes(self, length: int) -> dict[str, float]:
        return {**super().memory_bytes(length), "state": self._metadata_bytes(length)}

    def harness_bytes(self, length: int) -> float:
        """The labels are held dequantized, in fp32."""
        return float(self.info.num_heads * length * self.r * 4) - self._metadata_bytes(length)

    # ----- static decode: fixed shapes, the length on the device ------------------------------------------------------

    def static_decode_error(self):
        return None

    def start_static(self, capacity):
        self.static_fits = capacity <= self.budget  # the whole generation fits: attend everything
        self.labels = resized(self.labels, self.length, capacity, zero=True)  # slot i: token i, as the K/V

    def select_static(self, query, keys, values, length):
        """The newest key's labels written at slot length - 1; the top `budget` of the scores over the slots, those
        at or past the length at -inf (while L <= budget that is every valid token, as the eager dense step).
        Backend triton: labels, scores and ranking keys in one launch (kernels.py), then torch.topk."""
        L, (B, Hkv, cap, _) = row_length(length, 4), keys.shape
        if self.fused and not self.static_fits:
            from baselines.doublesparsity.kernels import ds_static_keys

            ranking = ds_static_keys(query, keys, self.channels, self.labels, length, self.label_bits,
                                     *self._quantizers(), self._scale()).view(B, Hkv, -1, cap)
            top = top_of_keys(ranking, self.budget)
            return Selection(indices=top, valid=top < L)
        position = length.reshape(-1) - 1  # [1], or [B]: each stacked row's newest slot
        write_slot(self.labels, position, self._key_labels(newest_key(keys, position)))
        if self.static_fits:
            return Selection.all_tokens()
        valid_slots = torch.arange(self.labels.shape[2], device=keys.device) < L
        scores = self._scores(query, self.labels.shape[2]).masked_fill(~valid_slots, float("-inf"))
        top = top_units_lowest_first(scores, self.budget)
        return Selection(indices=top, valid=top < L)

    def after_static_step(self, keys, values, length):
        self.length = length

    def static_step_cost(self, length):
        if self.static_fits:
            return 0.0, 0.0, float(length)
        return 0.0, self._metadata_bytes(length) if length > self.budget else 0.0, None
