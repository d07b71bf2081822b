"""The one selector interface every method implements, and the registry that builds methods by name.

A selector owns the per-layer state of one method (page summaries, low-rank factors, min/max metadata, ...) at
KV-head granularity. The attention function (`locks/core/attention.py`) drives it with three hooks and never branches on
the method:

    prefill(ctx)            once per layer after the dense prefill: post-RoPE K/V, all prompt queries, positions,
                            and `ctx.pre_rope_keys()`; may build state or permanently evict tokens (`Selector.alive`)
    append(keys, values)    once per decode step, after the cache grew by the new token(s)
    select(query, ...)      once per decode step: returns a `Selection` of token indices per (batch, KV head[, q head])

Static decode (a decode step captured once as a CUDA graph and replayed, `locks/core/static_decode.py`) drives a selector
through a second set of hooks over a cache preallocated for the whole generation: `start_static(capacity)` once
after the prefill, then per step `select_static(query, keys, values, length)` inside the graph (fixed shapes, the
valid length only as a device tensor, no host reads), `prepare_static_step(length)` before it (a step that needs
host work, such as summarizing the page it completes, says so; it runs outside the graph and the core calls
`static_host_work(keys, values)` first), and `after_static_step(keys, values, length)` after it (Python-side
upkeep) with `static_step_cost(length)` for the accounting. A selector that does not implement them says why in
`static_decode_error()`.

Rows of different lengths decode in one static step (docs/batching.md) when every selector names its per-row device
state in `row_state`: the core stacks the rows' state along the batch axis and gives each row's selector views of
it, so `length` is then [B] (row b's valid length) and the host hooks still run on each row's own selector.

Budget convention (`docs/budgets.md`): `budget` = tokens whose exact K/V enter the softmax, forced tokens included,
unless a method's `budget_mode == "paper"` says otherwise; the forced (always-attended) tokens are reported
separately in `Selection.forced_tokens`, and metadata traffic in `Selection.metadata_bytes`.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from locks.core.options import Options
from locks.errors import ConfigError


@dataclass
class LayerInfo:
    """Static facts of one attention layer."""

    layer_idx: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    scaling: float
    kv_element_bytes: int = 2  # bytes per cached K/V element assumed by the bytes model (bf16 on GPU)
    backend: str = "torch"  # "torch" (reference) or "triton" (fused kernels in locks/kernels/), resolved per device
    # None: full attention (the method's selector acts here); W: a sliding-window layer that attends the last W
    # tokens, as transformers passes `sliding_window` to the attention function (docs/architecture.md, layer types)
    sliding_window: int | None = None
    num_layers: int = 0  # decoder layers of the model (0: unknown), for a method whose dense layers depend on it

    @property
    def layer_type(self) -> str:
        return "full_attention" if self.sliding_window is None else "sliding_attention"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def token_kv_bytes(self) -> float:
        """Bytes of one cached token's K and V over all KV heads: 2 * d * s * H_kv."""
        return 2.0 * self.head_dim * self.kv_element_bytes * self.num_kv_heads


@dataclass
class PrefillContext:
    """What a selector sees once per layer after the (dense) prefill."""

    keys: Tensor  # [B, Hkv, L, d] post-RoPE cached keys
    values: Tensor  # [B, Hkv, L, d]
    queries: Tensor  # [B, Hq, L, d] post-RoPE queries of the whole prompt (take the last window if needed)
    positions: Tensor  # [B, L] RoPE positions of the cached tokens
    pre_rope_keys: Callable[[], Tensor]  # -> [B, Hkv, L, d] keys before the rotation (inverted exactly, see cache.py)
    max_new_tokens: int | None = None  # the generation's token limit for this sample (RocketKV sizes its stages by it)
    max_length: int | None = None  # the model's maximum context (max_position_embeddings)
    rotate: Callable[[Tensor, Tensor], Tensor] | None = None  # (pre-RoPE keys [B, Hkv, n, d], positions [B, n]) -> post-RoPE
    # the cache's KeyRotation (locks/core/cache.py: rotate, quarter_turn, tables), for a selector that rotates keys
    # inside a kernel (ShadowKV's fused static step); None where `rotate` is None
    rotation: Any = None
    # The runs of a group that prefill once (locks/core/prefill.py) share one memo per sample and layer; None: a run
    # of its own, nothing is kept.
    memo: dict | None = None

    def shared(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """compute() of this layer's prompt, run once per sample for every run of a group that prefills once.

        `key` names the computation and every option it reads besides this context (e.g. ("locks.summaries",
        page_size, rank, quant)): a budget-independent part of a method's prefill (an SVD, a factorization, page
        summaries) is then computed once for all budgets and methods that ask for it, instead of once per run. Each
        caller gets its own deep copy (a selector may update its state in place), so a run's result is the same
        as if it had computed it alone (docs/architecture.md, "Sweeps that prefill once")."""
        if self.memo is None:
            return compute()
        if key not in self.memo:
            self.memo[key] = compute()
        return copy.deepcopy(self.memo[key])


@dataclass
class Selection:
    """Tokens to attend at one decode step, one layer.

    `indices` is [B, Hkv, Gs, K] (int64) with Gs = 1 (the whole GQA group shares the set) or Gs = G (each query head
    has its own set); K is fixed for a step, invalid tail entries are masked by `valid` (same shape, bool).
    `dense=True` means: attend every cached token (FullKV, or a selector whose budget covers the context).
    `keys` optionally overrides the gathered keys ([B, Hkv, Gs, K, d]) for methods that attend reconstructed keys;
    `values` likewise overrides the gathered values (methods that serve values from their own offloaded store).
    Static decode only (`select_static`): the tokens may instead be named by page, `pages` [B, Hkv, Gs, Kp] page ids
    with `page_valid` (bool, same shape, or None = all valid) and `page_size`; page j covers tokens
    [j * page_size, (j + 1) * page_size), and tokens at or past the valid length are masked. `attended_on_host`: the
    selector's `static_step_cost` counts the attended tokens, so the step does not count them on the device.
    """

    indices: Tensor | None = None
    valid: Tensor | None = None
    dense: bool = False
    keys: Tensor | None = None
    values: Tensor | None = None
    forced_tokens: float = 0.0  # always-attended extras among the attended tokens (mean per KV head)
    metadata_bytes: float = 0.0  # summary/metadata bytes read this step, summed over KV heads (batch mean)
    kv_bytes: float | None = None  # exact K/V bytes read, summed over KV heads; None -> computed from the indices
    h2d_bytes: float = 0.0  # host-to-device bytes moved this step (offloading methods)
    # Optional per-step diagnostics of the method: lse_sel [B, Hq] (the attended set's exact log-sum-exp per query
    # head) -> {name: (sum, count)} as 0-dim tensors, for the names in the selector's `diagnostic_names`; the cache
    # sums them by name (eager and static alike) and metrics.json reports sum / count (docs/architecture.md).
    diagnostics: Callable[[Tensor], dict[str, tuple[Tensor, Tensor]]] | None = None
    pages: Tensor | None = None
    page_valid: Tensor | None = None
    page_size: int = 0
    attended_on_host: bool = False
    # Static decode only: [3] float64 on the device, (metadata, K/V, host-to-device) bytes of this step that depend
    # on its data (rebuilt keys, misses), added to what `static_step_cost` names; summed on the device, read once.
    device_bytes: Tensor | None = None
    # Static decode only: [B, Hkv] fp64, the distinct tokens each KV head reads this step, counted by the selector's
    # own kernel (Quest's per-head page sets); None: the step counts them from the page or token list
    attended_rows: Tensor | None = None
    # Static decode only, with `keys` and `values` compacted ([B, Hkv, Gs, S, d]): [B] int32, every head of row b
    # attends its first key_count[b] slots (the fused path reads them in order, with no index list; ShadowKV's
    # compacted K/V, LRQK's per-query-head hot cache)
    key_count: Tensor | None = None
    # [B, Hkv, Gs, K] fp32 added to each selected token's scaled logit before the softmax (an estimator's importance
    # weight: MagicPIG's -ln(w_i + 1e-4)); the step's lse is then the estimator's normalizer. None: no bias
    logit_bias: Tensor | None = None
    # Static decode only: (out [B, Hq, d], lse [B, Hq] fp32) of the step, when the selector's fused kernel attends
    # as it selects (MagicPIG's sampling and weights in one pass); the core then attends nothing itself
    attention: tuple[Tensor, Tensor] | None = None
    # True: `indices` are the slots 0 .. K-1 in order for every row and head (MagicPIG's list of every slot, its
    # choice carried by `valid` and `logit_bias`), so the reference attends the cache in place instead of a copy
    all_slots: bool = False

    @staticmethod
    def all_tokens() -> "Selection":
        return Selection(dense=True, attended_on_host=True)


@dataclass
class StepStats:
    """Accounting of one decode step in one layer (all KV heads; batch mean)."""

    attended_tokens: float  # tokens whose exact K/V enter the softmax, mean per KV head (union over the group)
    forced_tokens: float
    metadata_bytes: float
    kv_bytes: float
    h2d_bytes: float
    full_bytes: float  # what FullKV reads for the same step: 2 * L * d * s per KV head (a sliding layer: its window)
    layer_type: str = "full_attention"  # LayerInfo.layer_type: only full-attention layers count tokens and coverage

    @property
    def bytes_read(self) -> float:
        return self.metadata_bytes + self.kv_bytes


class Selector(ABC):
    """Base class of every method. One instance per layer."""

    name: ClassVar[str]
    uses_budget: ClassVar[bool] = True  # False: the budget changes nothing (FullKV), so one run serves every budget
    display_name: ClassVar[str] = ""  # how tables and figures name the method (default: name)
    plot_style: ClassVar[dict] = {}  # matplotlib keyword arguments of its line in figures (marker, linestyle, ...)
    report_order: ClassVar[int] = 100  # rank of its rows in tables and legends
    # non-empty: an accuracy reference (it reads every key to choose), the upper bound of the selectors named here;
    # reports compare every method with the best such bound and leave it off the Pareto front
    bounds: ClassVar[str] = ""
    diagnostic_names: ClassVar[tuple[str, ...]] = ()  # the names its Selection.diagnostics report
    # The attributes holding its static-decode device state with a leading batch axis (tensors, or dataclasses of
    # tensors), which the core stacks when rows of different lengths decode in one step, and the host integers that
    # size a step's shapes (stacked: the rows' largest); everything else must be host state or the same for every
    # row. None: its rows cannot be stacked (each row then steps on its own).
    row_state: ClassVar[tuple[str, ...] | None] = None

    Options: ClassVar[type[Options]] = Options  # its config keys (locks/core/options.py)

    def __init__(self, info: LayerInfo, budget: int, **options):
        """`options`: the method's config keys, checked by its `Options`; each becomes an attribute of the selector."""
        if budget is None or budget <= 0:
            raise ConfigError(f"budget must be a positive number of tokens (got {budget})")
        self.options = self.Options.build(options)
        self.options.check_budget(int(budget))
        self.info = info
        self.budget = int(budget)
        for name, value in self.options.attributes().items():
            setattr(self, name, value)
        # Tokens permanently evicted at prefill are False here (None = nothing evicted). [B, Hkv, L]
        self.alive: Tensor | None = None

    @classmethod
    def prepare_options(cls, model, options: dict) -> dict:
        """The options as this model's selectors take them, resolved from the model itself once per cache (e.g. a
        calibration computed from its activations). Default: unchanged."""
        return options

    @classmethod
    def check_model_config(cls, options: Options, model_config) -> None:
        """Before the model loads: raise one ConfigError line when these options cannot serve a model of this
        transformers config (e.g. a calibration file made for another model). Default: nothing."""

    def prefill(self, ctx: PrefillContext) -> None:
        """Build per-layer state from the prompt. Default: nothing."""

    def prefill_queries(self) -> int | None:
        """How many trailing prompt query positions `prefill` reads from ctx.queries (None: all of them). A sweep
        that prefills once for several methods keeps only these (locks/core/prefill.py). Default: none."""
        return 0

    def append(self, keys: Tensor, values: Tensor) -> None:
        """The cache grew; `keys`/`values` are the whole cached [B, Hkv, L, d]. Default: nothing."""

    @abstractmethod
    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        """query [B, Hq, d] (post-RoPE, the current token); keys/values the whole cache [B, Hkv, L, d]."""

    def alive_mask(self, length: int) -> Tensor | None:
        """[B, Hkv, length] bool: tokens not evicted (tokens appended after the prefill are alive)."""
        if self.alive is None:
            return None
        extra = length - self.alive.shape[-1]
        if extra <= 0:
            return self.alive[..., :length]
        return torch.cat([self.alive, self.alive.new_ones(*self.alive.shape[:-1], extra)], dim=-1)

    def extra_metrics(self) -> dict:
        """Method-specific numbers of this layer for the current sample (hit rates, ...): name -> float.
        Averaged over layers per sample, then over samples, into metrics.json["method_metrics"]."""
        return {}

    def memory_bytes(self, length: int) -> dict[str, float]:
        """What one layer holds for one sequence after a prompt of `length` tokens, in the method's own design
        (docs/memory.md): "kv" the K/V bytes kept on the device, "state" the selection state on the device
        (summaries, min/max, factors, landmarks; index lists not counted), "host" the bytes kept in host memory.
        Default (FullKV, the oracles): the whole K/V on the device, no state."""
        return {"kv": float(length * self.info.token_kv_bytes), "state": 0.0, "host": 0.0}

    def harness_bytes(self, length: int) -> float:
        """Device bytes this selector holds in the harness beyond the whole K/V (which the harness always keeps) and
        its design "state" of `memory_bytes`: copies of K/V rows, room preallocated for growth. The memory plan
        (eval/memory_plan.py) adds them. Default: none."""
        return 0.0

    def prefill_bytes(self, length: int) -> float:
        """Device bytes this selector's prefill holds for a while beyond what it keeps, after a prompt of `length`
        tokens (the layers prefill one after another: the memory plan takes the largest). Default: none."""
        return 0.0

    def static_bytes(self, length: int) -> float:
        """Device bytes a static decode of this selector holds beyond `harness_bytes` (start_static's buffers), after
        a prompt of `length` tokens; the memory plan adds them when the run decodes statically. Default: none."""
        return 0.0

    # ----- static decode (CUDA-graph capturable) ------------------------------------------------------------------

    def static_decode_error(self) -> str | None:
        """None if this selector implements the static-decode hooks below in its current configuration, else why not."""
        return f"method {self.name!r} has no static (CUDA-graph) decode path"

    def static_sample_error(self) -> str | None:
        """After the prefill: None if this sample can decode statically, else why not (e.g. a state that only a
        longer prompt reaches); `static_decode=auto` then decodes it eagerly. Default: None."""
        return None

    def start_static(self, capacity: int) -> None:
        """After the prefill: preallocate whatever state grows with the context for `capacity` cached tokens."""

    def prepare_static_step(self, length: int) -> bool:
        """Before a static step that ends with `length` cached tokens (the new one included), on the host: True when
        this step does host work inside `select_static` (e.g. summarizing the page it completes before scoring it),
        so it cannot be a replay of the captured graph and runs outside it. Default: False."""
        return False

    def static_host_work(self, keys: Tensor, values: Tensor) -> None:
        """In a step that `prepare_static_step` said needs host work, before `select_static` (outside any graph):
        keys/values are this selector's rows of the preallocated cache, the new token written. Default: nothing."""

    def select_static(self, query: Tensor, keys: Tensor, values: Tensor, length: Tensor) -> Selection:
        """Inside the captured step: keys/values are the preallocated cache [B, Hkv, capacity, d] whose first
        `length` slots are valid (int64 on the device, the new token included: [1] for every row, or [B], row b's
        own, for stacked rows; `row_length` broadcasts either). The result must have the same shapes at every step
        and the code may not read device values on the host (no .item(), no bool(tensor))."""
        raise NotImplementedError(self.static_decode_error())

    def static_state(self) -> list[Tensor]:
        """The device tensors a static step updates from their own previous values (a solver's factors, a buffer of
        the previous selection, counters): repeating a step at one position would not repeat its result, so the
        warm-ups and the capture of a graph (and benchmark repetitions) restore them. Default: none."""
        return []

    def finish_static(self) -> None:
        """After the sample's last static step: fold counters kept on the device into host state (one read). A
        finished row of a batch keeps stepping, frozen, and what it adds afterwards is not counted."""

    def after_static_step(self, keys: Tensor, values: Tensor, length: int) -> None:
        """Outside the graph, after each step: the cache now holds `length` tokens."""

    def static_step_cost(self, length: int) -> tuple:
        """(forced tokens per KV head, metadata bytes over KV heads, attended tokens per KV head[, K/V bytes]) of the
        step that attended at `length` tokens, computed on the host; attended is None exactly when the step's
        Selection has attended_on_host=False (then it is counted on the device). The K/V bytes default to the
        attended tokens' (attended * LayerInfo.token_kv_bytes); a method that reads other rows names them (the
        Selection then sets kv_bytes, to any value: it tells the step not to count them again). Bytes that depend on
        the step's data come from Selection.device_bytes. Default: a dense step, (0, 0, length)."""
        return 0.0, 0.0, float(length)


BACKENDS = ("auto", "triton", "torch")


def resolve_backend(requested: str, device) -> str:
    """method.backend -> "triton" or "torch" for a model on `device` (Triton on CPU only under TRITON_INTERPRET=1)."""
    import importlib.util
    import os

    if requested not in BACKENDS:
        raise ConfigError(f"method.backend must be one of {BACKENDS} (got {requested!r})")
    on_cuda = torch.device(device).type == "cuda"
    have_triton = importlib.util.find_spec("triton") is not None
    if requested == "auto":
        return "triton" if on_cuda and have_triton else "torch"
    if requested == "triton":
        if not have_triton:
            raise ConfigError("method.backend=triton needs the triton package (pip install '.[gpu]')")
        if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ConfigError("method.backend=triton needs a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)")
    return requested


def row_length(length: Tensor, dims: int) -> Tensor:
    """A static step's valid length, [1] or [B] (one per row), as a [1 or B, 1, ..., 1] tensor of `dims` dims that
    broadcasts over each row's trailing axes."""
    return length.view(-1, *([1] * (dims - 1)))


def newest_key(keys: Tensor, position: Tensor) -> Tensor:
    """A static step's newest key: slot `position` (= length - 1; [1], or [B]: each stacked row's own) of the
    preallocated keys [B, H, capacity, d] -> [B, H, 1, d]."""
    if position.numel() == 1:
        return keys.index_select(2, position)
    return keys[torch.arange(keys.shape[0], device=keys.device), :, position].unsqueeze(2)


def write_slot(buffer: Tensor, position: Tensor, value: Tensor, rows: Tensor | None = None) -> None:
    """`newest_key`'s inverse: value [B, H, 1, d] into slot `position` ([1], or [B]: each stacked row's own) of the
    preallocated buffer [B, H, capacity, d], in place. `rows`: torch.arange(B), where the caller keeps one."""
    if position.numel() == 1:
        buffer.index_copy_(2, position, value)
        return
    rows = torch.arange(buffer.shape[0], device=buffer.device) if rows is None else rows
    buffer[rows, :, position] = value[:, :, 0]


def check_finite(name: str, x: Tensor) -> None:
    if not torch.isfinite(x).all():
        raise ConfigError(f"{name} contain NaN or inf; the model or its weights are broken (check model.dtype)")

