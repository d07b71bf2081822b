"""The KV cache that carries one selector per layer next to the full K/V (transformers `Cache` + `CacheLayerMixin`).

The cache never evicts physically: `get_seq_length()` is always the logical length (so RoPE positions stay right,
`integration.md` pitfall 3) and a selector that evicts marks tokens dead in `Selector.alive` instead. The runner sets
`cache.phase` ("prefill" / "decode") explicitly; the attention function reads it (pitfall 9). For a static decode
(`locks/core/static_decode.py`) `start_static` preallocates every layer for the whole generation and sets the phase to
"decode_static": the new token's slot and the valid length are then device tensors, not Python state.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from locks.core.buffers import grown, resized
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, Selector, StepStats, resolve_backend, write_slot
from locks.core.window import SlidingWindow
from locks.errors import ConfigError

SOFTCAP_ERROR = ("attention logit soft-capping (Gemma 2's attn_logit_softcapping={}) is not supported by the sparse "
                 "decode: every method would attend without it; use a model without soft-capping")

# How each supported transformers model type rotates keys (what rotate/unrotate apply and invert):
#   half         k*cos + rotate_half(k)*sin over the full head dim, rotate_half(x) = (-x[d/2:], x[:d/2])
#   interleaved  GLM: the same on the first rotary_dim channels with the pairs (x[2i], x[2i+1]) rotated together
#                (cos/sin of rotary_dim/2 frequencies, each repeated twice), the other channels passed through
#   (GPT-OSS hands cos/sin over half the head dim, each applied to both halves: the same rotation)
ROPE_LAYOUTS = {"llama": "half", "mistral": "half", "qwen2": "half", "glm": "interleaved", "glm4": "interleaved",
                "gemma2": "half", "gemma3_text": "half", "gpt_oss": "half"}


def config_windows(config) -> list[int | None]:
    """Each layer's sliding window as `config.layer_types` declares it (None: full attention; no layer_types: all
    full). Only a first guess: the attention function corrects every layer from the `sliding_window` that
    transformers passes it at the prefill (SelectorCache.configure_layer)."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if not types or not window:
        return [None] * n
    return [int(window) if t == "sliding_attention" else None for t in types]


def flash_attn_usable(device="cuda") -> bool:
    """Whether flash-attn's kernel imports and runs: a wheel built for another torch is found by the import system
    but fails when its compiled extension loads, and one built for another GPU architecture loads but fails at its
    first call; both must show here (one warning, SDPA instead), not at the first prefill."""
    import importlib.util
    import warnings

    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from flash_attn import flash_attn_func
    except (ImportError, OSError, RuntimeError) as err:
        warnings.warn(f"flash-attn is installed but does not load ({type(err).__name__}: {err}); the prefill uses "
                      f"SDPA (reinstall flash-attn built for torch {torch.__version__})")
        return False
    failure = flash_attn_fails(flash_attn_func, device)
    if failure is not None:
        warnings.warn(f"flash-attn loads but a tiny call fails on {device} ({failure}); the prefill uses SDPA "
                      f"(reinstall flash-attn built for this GPU and torch {torch.__version__})")
        return False
    return True


def flash_attn_fails(flash_attn_func, device) -> str | None:
    """Why one tiny call of flash-attn (one head of dimension 64, bf16) fails on `device`, or None when it runs."""
    try:
        q = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16, device=device)
        flash_attn_func(q, q, q)
    except Exception as err:  # any failure of the kernel (an unsupported GPU, a missing symbol) means SDPA
        return f"{type(err).__name__}: {err}"
    return None


def prefill_backend(device, dtype) -> str:
    """"flash_attn" when the optional flash-attn package loads and runs and the model runs on CUDA in fp16/bf16
    (`pip install '.[gpu]'`), else "sdpa" (transformers' SDPA path)."""
    usable = torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    return "flash_attn" if usable and flash_attn_usable(device) else "sdpa"


class SelectorLayer(DynamicLayer):
    """K/V of one layer in a buffer that grows geometrically (no O(L) re-concatenation per step), plus its selector."""

    def __init__(self, selector: Selector):
        super().__init__()
        self.selector = selector  # the method's selector, or SlidingWindow on a sliding-window layer
        self.length = 0
        self.reserve = 0  # slots the first update (the prompt) adds for the tokens the generation will append
        self.prompt_queries: Tensor | None = None  # a chunked prefill: the trailing queries the selector reads
        self.static_position: Tensor | None = None  # static decode: [1] int64 slot of the token being decoded
        self.static_rows: Tensor | None = None  # stacked rows: [B] row indices, static_position is then [B]

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        B, H, _, D = key_states.shape
        self._k = key_states.new_empty(B, H, 0, D)
        self._v = value_states.new_empty(B, H, 0, value_states.shape[-1])
        self.is_initialized = True

    def _grow(self, needed: int, exact: bool = False) -> None:
        """exact=True (static decode): exactly `needed` slots, those after the cached tokens zero-filled (a static
        step reads them masked, so they must hold finite values; a buffer that already has `needed` slots, e.g. one
        shared with a prefill capture, may hold anything there)."""
        if exact and needed == self._k.shape[2]:
            self._k[:, :, self.length :].zero_()
            self._v[:, :, self.length :].zero_()
        elif exact:
            self.hold(*(resized(buf, self.length, needed, zero=True) for buf in (self._k, self._v)))
        else:
            self.hold(*(grown(buf, self.length, needed, minimum=256) for buf in (self._k, self._v)))

    def hold(self, key_buffer: Tensor, value_buffer: Tensor) -> None:
        """Make these buffers the layer's K/V. The cached tokens' views (`keys`, `values`) follow them, or a replaced
        buffer would stay alive through the views."""
        self._k, self._v = key_buffer, value_buffer
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def adopt(self, key_buffer: Tensor, value_buffer: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """Take buffers [B, H, capacity, d] whose first `length` slots hold cached tokens as this layer's own, without
        a copy (a group's prefill capture: the prompt slots are only read, the later ones are this run's decode
        slots). -> the cached K/V, as `update` returns them."""
        self.device = key_buffer.device
        self.length = length
        self.is_initialized = True
        self.hold(key_buffer, value_buffer)
        return self.keys, self.values

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if self.static_position is not None:  # static decode: write the slot named on the device, return all slots
            # (stacked rows, locks/core/batch.py: row b's token goes to its own slot static_position[b])
            write_slot(self._k, self.static_position, key_states, self.static_rows)
            write_slot(self._v, self.static_position, value_states, self.static_rows)
            return self._k, self._v
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self._grow(self.length + n + (self.reserve if self.length == 0 else 0))
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        raise NotImplementedError("a SelectorCache holds per-sample selector state; build a new one per sample")


@dataclass
class DecodeStats:
    """Per-sample accounting, summed over layers within a step and averaged over steps at the end."""

    steps: int = 0
    layer_steps: int = 0  # full-attention layer-steps: tokens, coverage and diagnostics are counted on these only
    bytes_read: float = 0.0
    full_bytes: float = 0.0
    metadata_bytes: float = 0.0
    h2d_bytes: float = 0.0
    attended_tokens: float = 0.0
    forced_tokens: float = 0.0
    context_tokens: float = 0.0
    coverage_sum: float = 0.0
    coverage_count: int = 0
    diagnostics: dict = field(default_factory=dict)  # name -> [sum, count] (Selection.diagnostics)
    by_type: dict = field(default_factory=dict)  # layer type -> [bytes read, FullKV's bytes, layer-steps]

    def add_device_counts(self, tokens: float, metadata_bytes: float, kv_bytes: float, h2d_bytes: float) -> None:
        """What static decode steps counted on the device, summed over their full-attention layer-steps: attended
        tokens, and the bytes that depended on the step's data (K/V of a per-head union, rebuilt keys, misses)."""
        self.attended_tokens += tokens
        self.metadata_bytes += metadata_bytes
        self.h2d_bytes += h2d_bytes
        self.bytes_read += metadata_bytes + kv_bytes
        self.by_type.setdefault("full_attention", [0.0, 0.0, 0])[0] += metadata_bytes + kv_bytes

    def add_diagnostics(self, values: dict) -> None:
        """Sum a step's diagnostics {name: (sum, count)} (tensors or floats) by name."""
        for name, (total, count) in values.items():
            acc = self.diagnostics.setdefault(name, [0.0, 0.0])
            acc[0] += float(total)
            acc[1] += float(count)

    def add(self, s: StepStats, context: int, coverage: Tensor | None, diagnostics: dict | None = None) -> None:
        """One layer's step. Bytes are summed over every layer (a sliding layer reads its window, for FullKV too);
        attended, forced and context tokens, coverage and diagnostics over the full-attention layers only."""
        kind = self.by_type.setdefault(s.layer_type, [0.0, 0.0, 0])
        kind[0] += s.bytes_read
        kind[1] += s.full_bytes
        kind[2] += 1
        self.bytes_read += s.bytes_read
        self.full_bytes += s.full_bytes
        self.metadata_bytes += s.metadata_bytes
        self.h2d_bytes += s.h2d_bytes
        if s.layer_type != "full_attention":
            return
        self.layer_steps += 1
        self.attended_tokens += s.attended_tokens
        self.forced_tokens += s.forced_tokens
        self.context_tokens += context
        if coverage is not None:
            self.coverage_sum += float(coverage.sum())
            self.coverage_count += coverage.numel()
        if diagnostics is not None:
            self.add_diagnostics(diagnostics)

    def summary(self) -> dict:
        """Means per decode step (bytes: all layers and KV heads of one step; tokens: per layer and KV head)."""
        steps = max(self.steps, 1)
        layer_steps = max(self.layer_steps, 1)
        return {
            "decode_steps": self.steps,
            "bytes_read_per_step": self.bytes_read / steps,
            "full_bytes_per_step": self.full_bytes / steps,
            "metadata_bytes_per_step": self.metadata_bytes / steps,
            "h2d_bytes_per_step": self.h2d_bytes / steps,
            "attended_tokens_per_step": self.attended_tokens / layer_steps,
            "forced_tokens_per_step": self.forced_tokens / layer_steps,
            "context_tokens_per_step": self.context_tokens / layer_steps,
            "coverage": self.coverage_sum / self.coverage_count if self.coverage_count else None,
            # each diagnostic's mean over what it counted (None when it never counted anything)
            "diagnostics": {name: (total / count if count else None)
                            for name, (total, count) in sorted(self.diagnostics.items())},
            # per layer type: layers per step and bytes per step (the method's and FullKV's for the same step)
            "by_layer_type": {kind: {"layers": n / steps, "bytes_read_per_step": read / steps,
                                     "full_bytes_per_step": full / steps}
                              for kind, (read, full, n) in sorted(self.by_type.items())},
        }


class SelectorCache(Cache):
    """A transformers `Cache` with one `SelectorLayer` per decoder layer, built for one model and one method."""

    def __init__(self, model, method: MethodSpec, kv_element_bytes: int = 2, measure_coverage: bool = False,
                 window_layers: bool = True):
        """window_layers=False: the method's selector on every layer, sliding ones too (a prefill capture's
        recorder, which keeps what every layer's prefill sees)."""
        config = model.config
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ConfigError(SOFTCAP_ERROR.format(config.attn_logit_softcapping))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        weight = next(model.parameters())
        self.backend = resolve_backend(method.backend, weight.device)
        self.prefill_backend = prefill_backend(weight.device, weight.dtype)
        self.method = method = method.for_model(model)
        self.window_layers = window_layers
        infos = [
            LayerInfo(
                layer_idx=i,
                num_heads=config.num_attention_heads,
                num_kv_heads=config.num_key_value_heads,
                head_dim=head_dim,
                scaling=head_dim**-0.5,
                kv_element_bytes=kv_element_bytes,
                backend=self.backend,
                sliding_window=window,
                num_layers=config.num_hidden_layers,
            )
            for i, window in enumerate(config_windows(config))
        ]
        super().__init__(layers=[SelectorLayer(self._build(info)) for info in infos])
        self.infos = infos
        self.rotation = KeyRotation(model)
        self.phase = "prefill"
        self.prefill_last = True  # a chunked prefill (locks/core/chunked_prefill.py): False before the last chunk
        self.max_new_tokens = None  # set by `generate` before the prefill
        self.max_length = int(getattr(config, "max_position_embeddings", 0)) or None
        self.measure_coverage = measure_coverage
        self.stats = DecodeStats()
        self.decode_mode = "eager"  # set by `generate`: eager | static | cuda_graph
        self.prefill_seconds = self.decode_seconds = 0.0  # set by `generate`
        self.capture_seconds = 0.0  # the CUDA graph's warm-ups and capture, not part of decode_seconds
        # eager steps: the coverage and diagnostic passes and the accounting, timed on the host and taken out of
        # decode_seconds; decode_instrumented (set by `generate`): whether decode_seconds still holds any of them
        self.instrumentation_seconds = 0.0
        self.decode_instrumented = False
        # static decode: count on the device the attended tokens the host cannot know (e.g. Quest's per-head union);
        # a benchmark may turn it off to time the selection and attention alone
        self.device_accounting = True

    def _build(self, info: LayerInfo) -> Selector:
        if info.sliding_window is not None and self.window_layers:
            return SlidingWindow(info)
        return self.method.build(info)

    def prompt_queries(self, layer_idx: int, queries: Tensor) -> Tensor:
        """A prefill chunk's queries [B, Hq, n, d] joined to the ones kept from the earlier chunks, of which the
        layer's selector reads only the trailing `prefill_queries()` (None: all). Before the last chunk they are
        kept; at the last, returned (and no longer kept)."""
        layer = self.layers[layer_idx]
        if layer.prompt_queries is not None:
            queries = torch.cat([layer.prompt_queries, queries], dim=2)
        if self.prefill_last:
            layer.prompt_queries = None
            return queries
        needed = layer.selector.prefill_queries()
        if needed is not None:
            queries = queries[:, :, queries.shape[2] - min(needed, queries.shape[2]) :]
        layer.prompt_queries = queries.clone() if needed is not None else queries
        return queries

    def configure_layer(self, layer_idx: int, sliding_window: int | None, scaling: float) -> None:
        """The layer as transformers runs it (the attention function's `sliding_window` and `scaling`, at the
        prefill): a layer whose window or scale differs from the first guess gets its info and selector rebuilt."""
        info = self.infos[layer_idx]
        window = int(sliding_window) if sliding_window else None
        if info.sliding_window == window and info.scaling == scaling:
            return
        self.infos[layer_idx] = info = dataclasses.replace(info, sliding_window=window, scaling=float(scaling))
        self.layers[layer_idx].selector = self._build(info)

    @property
    def full_attention_layers(self) -> int:
        return sum(info.sliding_window is None for info in self.infos)

    @property
    def max_new_tokens(self) -> int | None:
        return self._max_new_tokens

    @max_new_tokens.setter
    def max_new_tokens(self, value: int | None) -> None:
        """The generation's token limit; set before the prefill, it makes every layer's buffer hold the prompt and
        the whole generation from the start (a decode step never regrows, i.e. copies, the cache)."""
        self._max_new_tokens = value
        for layer in self.layers:
            layer.reserve = int(value or 0)

    # ----- static decode (locks/core/static_decode.py) -------------------------------------------------------------------

    def start_static(self, capacity: int) -> None:
        """After the prefill: preallocate every layer's K/V (and its selector's state) for `capacity` tokens and
        switch to the static decode phase, whose steps have the same shapes and launch the same kernels at every
        length (the token's slot and the valid length are device tensors set by `set_static_position`)."""
        errors = sorted({e for layer in self.layers if (e := layer.selector.static_decode_error()) is not None})
        if errors:
            raise ConfigError("static (CUDA-graph) decode is not available: " + "; ".join(errors))
        length = self.get_seq_length()
        if capacity <= length:
            raise ConfigError(f"static decode capacity {capacity} must exceed the cached length {length}")
        device = self.layers[0]._k.device
        B, n = self.layers[0]._k.shape[0], len(self.layers)
        self.static_position = torch.zeros(1, dtype=torch.long, device=device)
        self.static_length = torch.ones(1, dtype=torch.long, device=device)
        # The device counters, per layer and row (rows stacked into one step each keep their own, as views):
        # attended tokens per KV head counted on the device; (metadata, K/V, host-to-device) bytes known only there
        # (Selection.device_bytes, the K/V of tokens counted there); coverage summed over the row's query heads;
        # per diagnostic name of the layer's selector, the (sum, count) of Selection.diagnostics, when measured
        self.static_attended = torch.zeros(n, B, dtype=torch.float64, device=device)
        self.static_bytes = torch.zeros(n, B, 3, dtype=torch.float64, device=device)
        self.static_coverage = torch.zeros(n, B, dtype=torch.float64, device=device)
        self.static_diagnostics = [torch.zeros(B, len(layer.selector.diagnostic_names), 2, dtype=torch.float64,
                                               device=device) for layer in self.layers]
        self.static_host_rows: list | None = None  # stacked rows (stack_rows): the rows with host work this step
        self.static_steps = 0
        self.static_host_step = False
        for layer in self.layers:
            layer._grow(capacity, exact=True)
            layer.static_position = self.static_position
            layer.selector.start_static(layer._k.shape[2])
        self.capacity = self.layers[0]._k.shape[2]
        self.phase = "decode_static"

    def static_sample_error(self) -> str | None:
        """After the prefill: why this sample cannot decode statically (a selector's `static_sample_error`), or None."""
        return next((e for layer in self.layers if (e := layer.selector.static_sample_error()) is not None), None)

    def static_counters(self) -> list[Tensor]:
        """The device tensors a static step accumulates into (attended tokens, bytes, coverage, diagnostics per layer)."""
        return [self.static_attended, self.static_bytes, self.static_coverage, *self.static_diagnostics]

    def add_static_diagnostics(self, layer_idx: int, values: dict[str, tuple[Tensor, Tensor]]) -> None:
        """Inside a static step: add the step's diagnostics {name: (sum [B], count [B])} per row to the layer's
        device counters."""
        names = self.layers[layer_idx].selector.diagnostic_names
        if set(values) != set(names):
            raise ValueError(f"diagnostics {sorted(values)} differ from the selector's diagnostic_names {names}")
        step = torch.stack([torch.stack([values[n][0], values[n][1]], dim=-1) for n in names], dim=-2)
        self.static_diagnostics[layer_idx].add_(step.to(torch.float64))

    def static_host_work(self, layer_idx: int, keys: Tensor, values: Tensor) -> None:
        """In a step with host work (`static_host_step`): each selector that asked for it does it on its own rows
        (stacked rows: the rows whose selectors asked this step)."""
        if self.static_host_rows is None:
            self.layers[layer_idx].selector.static_host_work(keys, values)
            return
        for r in self.static_host_rows:
            self.row_caches[r].layers[layer_idx].selector.static_host_work(keys[r : r + 1], values[r : r + 1])

    @contextlib.contextmanager
    def static_counters_kept(self):
        """Runs of a static step inside this block (warm-ups, a capture, timing replays) leave the counters and
        each selector's `static_state()` as they were: a step at a fixed position is otherwise idempotent."""
        tensors = self.static_counters() + [t for layer in self.layers for t in layer.selector.static_state()]
        saved = [t.clone() for t in tensors]
        try:
            yield
        finally:
            for t, value in zip(tensors, saved):
                t.copy_(value)

    def set_static_position(self, position: int) -> None:
        """Before a static step: the new token goes to slot `position`, so `position + 1` tokens are valid.
        `static_host_step` then says whether a selector does host work inside this step (it runs outside the graph)."""
        if position >= self.capacity:
            raise ConfigError(f"static decode ran out of preallocated cache ({self.capacity} tokens)")
        self.static_position.fill_(position)
        self.static_length.fill_(position + 1)
        needs_host = [layer.selector.prepare_static_step(position + 1) for layer in self.layers]
        self.static_host_step = any(needs_host)

    def finish_static_step(self) -> None:
        """After a static step (outside the graph): advance the host-side lengths, let each selector do its host
        upkeep (e.g. LRQK moves a full ring to its cold store) and account the step."""
        self.static_steps += 1
        for layer in self.layers:
            layer.length += 1
        L = self.layers[0].length
        for layer, info in zip(self.layers, self.infos):
            layer.selector.after_static_step(layer._k, layer._v, L)
            forced, metadata, attended, *kv = layer.selector.static_step_cost(L)
            attended = attended or 0.0  # None: counted on the device, folded in by finish_static
            context = L if info.sliding_window is None else min(L, info.sliding_window)
            kv_bytes = kv[0] if kv else attended * info.token_kv_bytes
            self.stats.add(StepStats(attended_tokens=attended, forced_tokens=forced, metadata_bytes=metadata,
                                     kv_bytes=kv_bytes, h2d_bytes=0.0,
                                     full_bytes=context * info.token_kv_bytes, layer_type=info.layer_type), L, None)

    def finish_static(self) -> None:
        """After the last static step: fold what was counted on the device into the stats (one read)."""
        info = self.infos[0]
        # the stats are batch means: each row's sums over layers and steps, averaged over the rows
        metadata, kv, h2d = self.static_bytes.sum(0).mean(0).tolist()
        self.stats.add_device_counts(float(self.static_attended.sum(0).mean()), metadata, kv, h2d)
        if self.measure_coverage and self.static_steps:
            batch = self.layers[0]._k.shape[0]
            self.stats.coverage_sum += float(self.static_coverage.sum())
            self.stats.coverage_count += self.static_steps * self.full_attention_layers * batch * info.num_heads
            for layer, counters in zip(self.layers, self.static_diagnostics):
                values = counters.sum(0).tolist()
                self.stats.add_diagnostics({name: values[i] for i, name in enumerate(layer.selector.diagnostic_names)
                                            if values[i][1] > 0})
        for counter in self.static_counters():
            counter.zero_()
        self.static_steps = 0
        for layer in self.layers:
            layer.selector.finish_static()

    def selector(self, layer_idx: int) -> Selector:
        return self.layers[layer_idx].selector

    def extra_metrics(self) -> dict:
        """Each selector's `extra_metrics()` averaged over the layers that report it."""
        sums: dict[str, list[float]] = {}
        for layer in self.layers:
            for name, value in layer.selector.extra_metrics().items():
                if value is not None:
                    sums.setdefault(name, []).append(float(value))
        return {name: sum(v) / len(v) for name, v in sums.items()}


class KeyRotation:
    """The model's RoPE applied to or removed from cached keys, per layer (ShadowKV's pre-RoPE factors). It holds the
    model's rotary embedding, never the cache: a selector that keeps it (`PrefillContext.rotate`) forms no reference
    cycle with its cache, which is then freed as soon as its sample ends."""

    def __init__(self, model):
        config = model.config
        self.rotary_emb = model.model.rotary_emb
        # a model with one rotary embedding per layer type (Gemma 3) asks for the layer's type in its forward, as
        # config.layer_types names it (what the model's own layers index their position embeddings by)
        self.layer_types = ((getattr(config, "layer_types", None) or []) if "layer_type" in
                            inspect.signature(self.rotary_emb.forward).parameters else None)
        self.model_type = getattr(config, "model_type", None)

    def _rope_terms(self, keys: Tensor, positions: Tensor, layer_idx: int | None = None
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(k, rot(k), cos, sin, passed-through channels) in fp32 for keys [B, Hkv, n, d] at positions [B, n], with
        the layer's own rotary embedding (a model with one per layer type, e.g. Gemma 3's local theta = 10K and
        global theta = 1M, is asked for `layer_idx`'s), in the model's layout (ROPE_LAYOUTS)."""
        layout = ROPE_LAYOUTS.get(self.model_type)
        if layout is None:
            raise ConfigError(f"pre-RoPE keys (needed by ShadowKV) are implemented for the RoPE layouts of "
                              f"{sorted(ROPE_LAYOUTS)}; model_type {self.model_type!r} is not among them")
        kwargs = {}
        if self.layer_types is not None:
            if layer_idx is None or not self.layer_types:
                raise ConfigError(f"model_type {self.model_type!r} rotates each layer type with its own RoPE: the "
                                  f"rotation needs the layer (config.layer_types)")
            kwargs["layer_type"] = self.layer_types[layer_idx]
        cos, sin = self.rotary_emb(keys, position_ids=positions, **kwargs)
        cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
        if layout == "half" and 2 * cos.shape[-1] == keys.shape[-1]:  # GPT-OSS: one angle per channel pair
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        k = keys.float()
        if layout == "interleaved":
            cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
            sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
            k, rest = k[..., : cos.shape[-1]], k[..., cos.shape[-1] :]
            rotated = torch.stack((-k[..., 1::2], k[..., 0::2]), dim=-1).flatten(-2)
            return k, rotated, cos, sin, rest
        half = k.shape[-1] // 2
        return k, torch.cat((-k[..., half:], k[..., :half]), dim=-1), cos, sin, k[..., :0]

    def quarter_turn(self, x: Tensor, layer_idx: int | None = None) -> Tensor:
        """rot(x) over the last dim in x's dtype (exact: a permutation and sign of the rotated channels), 0 on the
        channels RoPE passes through, so that rotate(k) = k*cos + rot(k)*sin on every channel with `tables`."""
        flat = x.reshape(1, 1, -1, x.shape[-1])
        _, rotated, _, _, rest = self._rope_terms(flat, torch.zeros(1, flat.shape[2], dtype=torch.long,
                                                                    device=x.device), layer_idx)
        return torch.cat([rotated, torch.zeros_like(rest)], dim=-1).to(x.dtype).view(x.shape)

    def tables(self, positions: Tensor, layer_idx: int | None, like: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) [B, n, d] in like's dtype (the values the rotation multiplies by, exactly) at positions [B, n],
        1 and 0 on the channels RoPE passes through. Kept for the last positions and layer type asked: every
        layer of one rotary embedding shares them."""
        kind = None if self.layer_types is None else self.layer_types[layer_idx]
        memo = getattr(self, "_tables", None)
        if (memo is not None and memo[0] == (kind, like.dtype, like.device) and memo[1].shape == positions.shape
                and torch.equal(memo[1], positions)):
            return memo[2]
        probe = like.new_zeros(positions.shape[0], 1, positions.shape[1], like.shape[-1])
        _, _, cos, sin, rest = self._rope_terms(probe, positions, layer_idx)
        one, zero = torch.ones_like(rest), torch.zeros_like(rest)
        out = (torch.cat([cos, one], -1)[:, 0].to(like.dtype).contiguous(),
               torch.cat([sin, zero], -1)[:, 0].to(like.dtype).contiguous())
        self._tables = ((kind, like.dtype, like.device), positions.clone(), out)
        return out

    def rotate(self, keys: Tensor, positions: Tensor, layer_idx: int | None = None) -> Tensor:
        """Post-RoPE keys from pre-RoPE keys: k' = k*cos + rot(k)*sin on the rotary channels."""
        k, rotated, cos, sin, rest = self._rope_terms(keys, positions, layer_idx)
        return torch.cat([k * cos + rotated * sin, rest], dim=-1).to(keys.dtype)

    def unrotate(self, keys: Tensor, positions: Tensor, layer_idx: int | None = None) -> Tensor:
        """Pre-RoPE keys from post-RoPE keys by the inverse rotation with the layer's own cos/sin.

        RoPE: k' = k*cos + rot(k)*sin with rot a quarter turn of each rotated channel pair and cos, sin possibly
        scaled by an attention factor m (cos = m cos(theta), sin = m sin(theta)). Rotating back by -theta gives
        k'*cos - rot(k')*sin = m^2 k, and m^2 = cos^2 + sin^2 elementwise, hence the division.
        """
        k, rotated, cos, sin, rest = self._rope_terms(keys, positions, layer_idx)
        return torch.cat([(k * cos - rotated * sin) / (cos * cos + sin * sin), rest], dim=-1).to(keys.dtype)
