"""Twilight (Lin et al. 2025, `docs/methods/twilight.md`): top-p pruning of a base selector's candidates.

The base selector (Quest, DoubleSparsity or LOCKS) picks a candidate set M0 with the budget B0 = `budget` as its cap.
Each query head then estimates its attention weights on M0 from 4-bit keys and keeps the smallest high-mass part:

    K^_i = clamp(round((k_i - min_i) / s_i), 0, 15) s_i + min_i,  s_i = max(max_i - min_i, 1e-9) / 15
                                                                  (per token, over its d channels)
    e_i = scaling * q . K^_i on M0,   P = softmax(e) over M0
    M1 = top-p(P, p),   M = M0 and M1     (exact K/V of M enter the softmax; nothing else is forced)

top_p_mode=kernel_compat is the official CUDA kernel's rule, a bisection on a probability threshold anchored on token
0's weight (it keeps a superset of the exact set when token 0 is not the heaviest, and every candidate when token 0
is not one); exact: the tokens in decreasing P (ties: lower index first) while the mass before them is below p.
Scores and masses are accumulated in fp64, so eager, static and stacked steps decide alike. The first
`dense_layers` layers are dense (the core's, locks/core/dense.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from locks.core.options import Options, integer, number, one_of, option, path_or
from locks.core.quantize import min_max_quantize
from locks.core.reference import gather_tokens, paged_tokens
from locks.core.registry import register, selector_class
from locks.core.selector import LayerInfo, Selection, Selector, row_length
from locks.errors import ConfigError

BISECTION_STEPS = 20  # the kernel's loop ends within 18 (the bracket [0, P_0] halves to below its 1e-5 tolerance)


def top_p_exact(P: Tensor, tokens: Tensor, p: float) -> Tensor:
    """keep [..., K]: the candidates in decreasing P (ties: lower token first) while the mass before them is < p."""
    by_token = tokens.argsort(dim=-1, stable=True)
    order = by_token.gather(-1, P.gather(-1, by_token).argsort(dim=-1, descending=True, stable=True))
    mass = P.gather(-1, order).double()
    before = mass.cumsum(-1) - mass
    return torch.zeros_like(P, dtype=torch.bool).scatter(-1, order, before < p)


def top_p_bisection(P: Tensor, first: Tensor, p: float, steps: int = BISECTION_STEPS) -> tuple[Tensor, Tensor]:
    """The official kernel's rule: (keep [..., K], still searching [...]). low = 0, high = P_0 (`first`, token 0's
    weight); each step, with mid = (low + high) / 2, low = mid if the mass above mid is >= p, else high =
    min(mid, max{P <= high}); it stops once max{P <= high} - min{P > low} <= 1e-5, read before the update. Keeps
    P > low. fp32 thresholds as the kernel, the mass in fp64."""
    low, high = torch.zeros_like(first), first.clone()
    searching = torch.ones_like(first, dtype=torch.bool)
    for _ in range(steps):
        mid = (low + high) / 2
        mass = (P * (P > mid[..., None])).double().sum(-1)
        above_low = torch.where(P > low[..., None], P, float("inf")).amin(-1).minimum(high)
        below_high = torch.where(P <= high[..., None], P, float("-inf")).amax(-1).maximum(low)
        up = mass >= p
        low = torch.where(searching & up, mid, low)
        high = torch.where(searching & ~up, torch.minimum(mid, below_high), high)
        searching = searching & (below_high - above_low > 1e-5)
    return P > low[..., None], searching


@dataclass(frozen=True)
class TwilightOptions(Options):
    # the selector whose candidates (budget B0) are pruned
    base: str = option("quest", one_of("quest", "doublesparsity", "locks"), attr="base_name")
    top_p: float = option(0.85, number(0.0, 1.0))  # the mass each query head keeps
    top_p_mode: str = option("kernel_compat", one_of("kernel_compat", "exact"))
    estimate_bits: int = option(4, integer(1))  # bits of the per-token keys that estimate the weights
    dense_layers: int = option(2, integer(0))  # the first layers attend densely (locks/core/dense.py)
    # base=doublesparsity: its channel ranking (auto: calibrated on the model once, baselines/doublesparsity/)
    channel_config: str = option("auto", path_or("auto", "a channel-ranking JSON file"))

    def check(self):
        if self.top_p <= 0:
            raise ConfigError(f"method.top_p must be in (0, 1] (got {self.top_p})")

    def check_budget(self, budget: int) -> None:
        if self.base == "quest" and budget % 16:  # Quest's eval rule (fair) then takes Twilight's B0 / 16 pages
            raise ConfigError(f"method=twilight with base=quest needs a budget that is a multiple of its 16-token "
                              f"pages (got {budget})")


# the base selectors as the official configs run them (Twilight's Quest: every page scored, per query head, no forced;
# its DoubleSparsity: r = d/2 channels of the q ranking, 2-bit key labels, its own variant)
BASE_OPTIONS = {"quest": {"page_size": 16, "page_rule": "eval", "gqa": "per_head", "dense_layers": 0},
                "doublesparsity": {"variant": "twilight", "channel": "q", "group_factor": 2, "label_bits": 2,
                                   "dense_layers": 0},
                "locks": {}}


def base_options(options) -> dict:
    """The base selector's options (`options`: Twilight's)."""
    extra = {"channel_config": options.channel_config} if options.base == "doublesparsity" else {}
    return {**BASE_OPTIONS[options.base], "budget_mode": "fair", **extra}  # B0 is a cap in either mode


@register
class TwilightSelector(Selector):
    name = "twilight"
    display_name = "Twilight"
    report_order = 9
    plot_style = {"marker": "*"}
    row_state = ("base", "kept", "seen")
    Options = TwilightOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        self.base = selector_class(self.base_name)(info, budget, **base_options(self.options))
        self.kept: Tensor | None = None  # [B, 3] fp64: kept tokens summed over steps and query heads, heads, max
        self.folded: list[float] | None = None
        self.fused = info.backend == "triton"  # the pruning in one launch (kernels.py), imported only then
        self.top_p_on_device: Tensor | None = None  # [1] fp64, what the fused kernel compares the mass with
        self.seen: Tensor | None = None  # fused static steps: [B, Hkv, ceil(capacity / 32)] int32 slot bitmaps

    # ----- the base selector's options, state and accounting ------------------------------------------------------

    @classmethod
    def prepare_options(cls, model, options: dict) -> dict:
        """base=doublesparsity, channel_config=auto -> the model's calibration file (as DoubleSparsity's own)."""
        if options.get("base") != "doublesparsity":
            return options
        return {**options, **selector_class("doublesparsity").prepare_options(model, {
            "channel_config": options.get("channel_config", "auto")})}

    @classmethod
    def check_model_config(cls, options, model_config) -> None:
        if options.base == "doublesparsity":
            base = selector_class("doublesparsity")
            base.check_model_config(base.Options.build(base_options(options)), model_config)

    def prefill(self, ctx) -> None:
        self.base.prefill(ctx)
        self.kept = torch.zeros(ctx.keys.shape[0], 3, dtype=torch.float64, device=ctx.keys.device)
        self.top_p_on_device = torch.tensor([self.top_p], dtype=torch.float64, device=ctx.keys.device)

    def prefill_queries(self):
        return self.base.prefill_queries()

    def append(self, keys, values) -> None:
        self.base.append(keys, values)

    @property
    def estimate_bytes_per_token(self) -> float:
        """A token's 4-bit key: d b/8 bytes and an fp16 scale and zero."""
        return self.info.head_dim * self.estimate_bits / 8 + 4

    def estimate_bytes(self, candidates: Tensor) -> Tensor:
        """[B] fp64: the 4-bit keys of every query head's candidates."""
        return candidates.sum((1, 2, 3), dtype=torch.float64) * self.estimate_bytes_per_token

    def memory_bytes(self, length: int) -> dict[str, float]:
        own = self.info.num_kv_heads * length * self.estimate_bytes_per_token
        base = self.base.memory_bytes(length)
        return {**base, "state": base["state"] + own}

    def harness_bytes(self, length: int) -> float:
        """The 4-bit keys are recomputed from the cache at each step (the official Python path), not held."""
        return self.base.harness_bytes(length) - self.info.num_kv_heads * length * self.estimate_bytes_per_token

    def prefill_bytes(self, length: int) -> float:
        return self.base.prefill_bytes(length)

    def static_bytes(self, length: int) -> float:
        """The base's, and with the fused backend the count's slot bitmaps (a bit per slot and KV head)."""
        seen = 4 * self.info.num_kv_heads * -(-length // 32) if self.fused else 0
        return self.base.static_bytes(length) + seen

    def extra_metrics(self) -> dict:
        """twilight_tokens: tokens a query head kept per step (mean); twilight_tokens_max: the most it kept."""
        if self.kept is None:
            return self.base.extra_metrics()
        total, heads, most = self.folded or self.kept[0].tolist()
        own = {"twilight_tokens": total / heads, "twilight_tokens_max": most} if heads else {}
        return {**self.base.extra_metrics(), **own}

    # ----- the pruning: one rule for eager and static steps ---------------------------------------------------------

    def prune(self, query: Tensor, keys: Tensor, tokens: Tensor, valid: Tensor) -> Tensor:
        """tokens/valid [B, Hkv, Gs, K] (M0) -> M [B, Hkv, G, K] bool; counts the kept tokens. Backend triton: the
        estimate, P and the bisection in one launch (kernels.py)."""
        B, Hkv, Gs, K = tokens.shape
        G, d = self.info.group_size, self.info.head_dim
        bisection = self.top_p_mode == "kernel_compat"
        if self.fused:
            from baselines.twilight.kernels import twilight_prune

            pruned = twilight_prune(query, keys, tokens, valid, self.info.scaling, self.top_p_on_device,
                                    self.estimate_bits, bisection, BISECTION_STEPS)
            keep, P = pruned["keep"], pruned["P"]
        else:
            estimate = min_max_quantize(gather_tokens(keys, tokens).float(), self.estimate_bits)
            q = query.view(B, Hkv, G, d).double()
            e = torch.einsum("bhgd,bhgkd->bhgk", q, estimate.expand(B, Hkv, G, K, d).double()).float()
            e = (e * self.info.scaling).masked_fill(~valid, float("-inf"))
            w = torch.exp((e - e.amax(-1, keepdim=True)).double())
            P = (w / w.sum(-1, keepdim=True)).float()
        tokens, valid = tokens.expand(B, Hkv, G, K), valid.expand(B, Hkv, G, K)
        if not self.fused and bisection:
            keep = top_p_bisection(P, (P * (tokens == 0)).sum(-1), self.top_p)[0]
        elif not bisection:
            keep = top_p_exact(P, tokens, self.top_p)
        keep = keep & valid
        self.count(keep)
        return keep

    def count(self, keep: Tensor) -> None:
        """Add a step's kept tokens, keep [B, Hkv, G, K], to `kept`: their sum over the query heads, the heads, the
        most one head kept."""
        counts = keep.sum(-1).flatten(1).to(torch.float64)  # [B, Hq]
        self.kept[:, 0] += counts.sum(-1)
        self.kept[:, 1] += counts.shape[1]
        self.kept[:, 2] = torch.maximum(self.kept[:, 2], counts.amax(-1))

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        B, Hkv, L, _ = keys.shape
        self.append(keys, values)  # a no-op after the harness's append; direct calls may skip it
        base = self.base.select(query, keys, values)
        if base.dense:  # B0 covers the context: top-p over every token
            tokens = torch.arange(L, device=keys.device).expand(B, Hkv, 1, L)
            valid = torch.ones_like(tokens, dtype=torch.bool)
        else:
            tokens, valid = base.indices, base.valid
        keep = self.prune(query, keys, tokens, valid)
        metadata = base.metadata_bytes + float(self.estimate_bytes(valid.expand_as(keep)).mean())
        return Selection(indices=tokens.expand_as(keep), valid=keep, metadata_bytes=metadata, h2d_bytes=base.h2d_bytes)

    # ----- static decode: the base's hooks, the same pruning ------------------------------------------------------

    def static_decode_error(self):
        return self.base.static_decode_error()

    def static_sample_error(self):
        return self.base.static_sample_error()

    def start_static(self, capacity):
        self.base.start_static(capacity)
        if self.fused:  # the fused count's slot bitmaps, one bit per slot and KV head (kept clear between steps)
            self.seen = torch.zeros(self.kept.shape[0], self.info.num_kv_heads, -(-capacity // 32), dtype=torch.int32,
                                    device=self.kept.device)

    def prepare_static_step(self, length):
        return self.base.prepare_static_step(length)

    def static_host_work(self, keys, values):
        self.base.static_host_work(keys, values)

    def select_static(self, query, keys, values, length):
        B, Hkv, C, _ = keys.shape
        base = self.base.select_static(query, keys, values, length)
        if self.fused and not base.dense:
            return self._fused_static(query, keys, base, length)
        if base.dense:
            tokens = torch.arange(C, device=keys.device).expand(B, Hkv, 1, C)
            valid = tokens < row_length(length, 4)
        elif base.pages is not None:
            tokens, valid = paged_tokens(base, length, C)
        else:
            tokens, valid = base.indices, base.valid
        keep = self.prune(query, keys, tokens, valid)
        device_bytes = torch.zeros(B, 3, dtype=torch.float64, device=keys.device)
        device_bytes[:, 0] = self.estimate_bytes(valid.expand_as(keep))
        if base.device_bytes is not None:
            device_bytes = device_bytes + base.device_bytes
        return Selection(indices=tokens.expand_as(keep), valid=keep, device_bytes=device_bytes)

    def _fused_static(self, query: Tensor, keys: Tensor, base: Selection, length: Tensor) -> Selection:
        """`select_static`'s pruning and accounting in two launches (kernels.py): the pruning reads a page list's
        tokens itself; the count adds the kept tokens, each KV head's union and the 4-bit keys' bytes."""
        from baselines.twilight.kernels import twilight_count, twilight_prune

        paged = base.pages is not None
        pruned = twilight_prune(query, keys, base.pages if paged else base.indices,
                                base.page_valid if paged else base.valid, self.info.scaling, self.top_p_on_device,
                                self.estimate_bits, self.top_p_mode == "kernel_compat", BISECTION_STEPS,
                                length=length, page_size=base.page_size if paged else 0)
        tokens = pruned["tokens"] if paged else base.indices
        keep = pruned["keep"]
        if keep is None:  # exact: PyTorch ranks the kernel's P
            valid = pruned["valid"] if paged else base.valid
            keep = top_p_exact(pruned["P"], tokens.expand_as(pruned["P"]), self.top_p) & valid
        attended, device_bytes = twilight_count(keep, tokens, pruned["candidates"], self.seen, self.kept,
                                                self.estimate_bytes_per_token)
        if base.device_bytes is not None:
            device_bytes = device_bytes + base.device_bytes
        return Selection(indices=tokens.expand_as(keep), valid=keep, device_bytes=device_bytes,
                         attended_rows=attended)

    def static_state(self):
        return [*self.base.static_state(), self.kept]

    def finish_static(self):
        self.base.finish_static()
        self.folded = self.kept[0].tolist()

    def after_static_step(self, keys, values, length):
        self.base.after_static_step(keys, values, length)

    def static_step_cost(self, length):
        """The base's metadata on the host; the 4-bit keys and the attended tokens counted on the device."""
        return 0.0, self.base.static_step_cost(length)[1], None
