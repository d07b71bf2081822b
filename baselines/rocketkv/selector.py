"""RocketKV (ICML'25, `docs/methods/rocketkv.md`): SnapKV++ permanent eviction at prefill + hybrid sparse decode attention.

One traffic budget B drives both stages. `rocket_params` splits the compression c = S/B between them per sample
(§3.1), S = min(prompt_len + max_new_tokens, max_length):
  stage 1 (once per layer, after the dense prefill): the last `window` prompt queries score the prefix; the scores are
  summed over the window and over the G query heads of each KV head, max-pooled (kernel `pool_kernel`), and per KV head
  only the top (prompt_budget - window) prefix tokens plus the window survive; the rest are evicted for good
  (`Selector.alive`; the harness never evicts physically, so survivors keep their RoPE phases and new tokens get
  absolute positions);
  stage 2 (every decode step) on the T' survivors of each KV head in compacted order (decode tokens appended, never
  evicted): per-chunk (cs tokens) element-wise min/max keys, kept incrementally; the r_ch channels with the largest
  sum_g |Q_{g,i}|; sign-selected bound s_{g,c} = sum_{i in I} Q_{g,i} (sigma_i > 0 ? Max_{c,i} : Min_{c,i}) with
  sigma_i = sign(sum_g Q_{g,i}); softmax over the survivors of s / tau_g, tau_g = sqrt(d sum_I |Q_g| / sum |Q_g|);
  sum over the group; exact top-k tokens, shared by the group (Gs = 1), attended with the full softmax. One rule for
  eager and static steps (`survivor_scores`); the static step's fused kernels are in kernels.py.

Budget semantics:
  paper: `budget` is the paper's memory-traffic budget B (K+V of B dense tokens): k = B // 2 tokens are attended and
         the approximation pass reads about as much as the other half.
  fair (default): at most `budget` tokens are attended. The identical decomposition runs with a traffic budget of
         2 * budget, so k = budget and every internal proportion (alpha, T, cs, r_ch) is the paper's for that traffic.
Nothing is always attended at decode (forced_tokens = 0); the window survives stage 1 but competes in stage 2.
Bytes (§3.6), per KV head summed over heads: metadata = s * r_ch * ceil(T'/cs) (the needed half of the min/max
auxiliary keys, r_ch channels) + 4 * G * T' (the unfused fp32 approximate scores); K/V bytes from the k attended tokens.

Deviations from the official code (NVlabs/RocketKV @ 63637c8):
- Observation window: our harness prefills the whole prompt, so the window is the last `window` prompt tokens and ends
  AT the prompt end. The accuracy harness feeds the last prompt token as the first decode step, so its window ends one
  token earlier and that token is appended after stage 1 (never evicted) instead of being part of the window.
- Auxiliary keys are kept incrementally (gpt-fast style) instead of being recomputed from K every step (accuracy path);
  the values are identical (min/max are exact).
- Scores in fp32 (official: fp16 accuracy path, bf16 gpt-fast). Group aggregation by sum (gpt-fast) instead of mean
  (accuracy path): same ranking.
- prompt_budget < window (the official code asserts): stage 1 keeps the window only. gpt-fast's last-prompt-token
  off-by-one at LAST_PREFILL is not reproduced; `params=gpt_fast` changes only the decomposition.
- When k >= T' every survivor is attended without the approximation pass (the official code scores and then selects
  all of them anyway); that step reports no metadata bytes.
- Each row of a batch has its own decomposition (its own S), stage-1 set and stage-2 sets, as at batch 1.
- Stage-2 ties (every token of a chunk shares its score) go to the earlier survivor (`survivor_scores`); the official
  torch.topk leaves them to its implementation. The chunk channels are ranked with ties to the lower channel.
- Not implemented: the multi-turn `rocket_mt` variant and skip_layers. The official function default is 0 (every
  layer sparse), which is what runs here; its LongChat and Llama-2 configs set `skip_layers: 2` (the first two layers
  dense), so numbers for those models are not comparable with the official ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from locks.core.buffers import resized
from locks.core.options import Options, number, odd_positive_int, one_of, option, positive_int
from locks.core.page_bounds import fold_into_page
from locks.core.registry import register
from locks.core.selector import LayerInfo, Selection, Selector
from locks.core.topk import top_units
from locks.errors import ConfigError

VARIANTS = ("accuracy", "gpt_fast")


@dataclass(frozen=True)
class RocketParams:
    """The per-sample decomposition of a traffic budget B (spec §3.1)."""

    S: int  # sequence length the sample is sized for: min(prompt + max_new, max_length)
    B: int  # traffic budget (paper's token_budget)
    c: float  # total compression max(1, S/B)
    alpha: float  # share of log c given to stage 1
    T: int  # capacity after stage 1 (prompt survivors + room for the outputs)
    prompt_budget: int  # prompt tokens SnapKV++ keeps per KV head (window included)
    k: int  # stage-2 exact top-k
    c2: float  # stage-2 compression max(1, T/B)
    cs: int  # chunk size of the auxiliary min/max keys
    r_ch: int  # head-dim channels of the approximation


def rocket_params(S: int, B: int, max_new: int, d: int, variant: str = "accuracy", alpha: float | None = None) -> RocketParams:
    """accuracy: infllm_utils.py compress() L136-158 + rocket.py L218-219, L247; gpt_fast: get_params_for_token_budget.

    `alpha` fixes the stage split (the rocket_r0.x ablations) instead of min(0.2 + 0.06 log2 c, 0.8).
    """
    if variant == "accuracy":
        c = max(1.0, float(S) / B)
        a = min(0.2 + math.log2(c) * 0.06, 0.8) if alpha is None else float(alpha)
        T = int(float(S) / (c**a))
        T = max(T, min(2 * max_new, S))
        prompt_budget = T - max_new
        k = int(B // 2)
        c2 = max(1.0, float(T) / B)
        cs = math.ceil(math.sqrt(c2))
        cs = cs if cs <= c2 else 1
        r_ch = int(d * cs / c2)
        return RocketParams(S, B, c, a, T, prompt_budget, k, c2, cs, r_ch)
    if variant == "gpt_fast":
        b = min(S, B)
        c = max(1.0, float(S) / b)
        a = min(0.2 + math.log2(c) * 0.06, 0.8) if alpha is None else float(alpha)
        T = int(float(S) / (c**a))
        prompt_budget = min(S - max_new, T - max_new)
        k = min(round(b / 2), T)
        c2 = max(1.0, float(T) / b)
        cs = min(math.floor(c2), math.ceil(math.sqrt(c2)))
        r_ch = min(d, max(1, round(d * cs / c2)))
        return RocketParams(S, B, c, a, T, prompt_budget, k, c2, cs, r_ch)
    raise ConfigError(f"method.params must be one of {VARIANTS} (got {variant!r})")


def snapkv_scores(queries: Tensor, keys: Tensor, window: int, pool_kernel: int, scaling: float) -> Tensor:
    """Pooled SnapKV++ scores of the prefix [B, Hkv, L - window] (queries [B, Hq, w_q, d] = the window's queries).

    P_{g,i,j} = softmax_j(scaling q_{g,i} . k_j) causally (window query i sits at position L - window + i);
    score_j = maxpool_{|j'-j| <= kernel//2} sum_{g in group} sum_i P_{g,i,j'} over prefix columns j' < L - window.
    """
    B, Hkv, L, d = keys.shape
    G = queries.shape[1] // Hkv
    w = window
    prefix = L - w
    allowed = torch.arange(w, device=keys.device)[:, None] + prefix >= torch.arange(L, device=keys.device)[None, :]
    out = keys.new_empty(B, Hkv, prefix, dtype=torch.float32)
    for h in range(Hkv):  # one KV head at a time: the [B, G, w, L] fp32 scores stay small at long contexts
        q = queries[:, h * G : (h + 1) * G].float()
        logits = torch.einsum("bgid,bld->bgil", q, keys[:, h].float()) * scaling
        p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        out[:, h] = p[..., :prefix].sum(dim=(1, 2))
    return F.max_pool1d(out, kernel_size=pool_kernel, stride=1, padding=pool_kernel // 2)


def approx_scores(q: Tensor, kmin: Tensor, kmax: Tensor, r_ch: int | Tensor) -> tuple[Tensor, Tensor]:
    """Stage-2 chunk scores before the temperature: q [B, Hkv, G, d], kmin/kmax [B, Hkv, C, d] (fp32).

    Returns (s_hat [B, Hkv, G, C], tau [B, Hkv, G, 1]) with I = top-r_ch of a_i = sum_g |q_{g,i}| (ties to the lower
    channel), sigma = sign(sum_g q), s_hat_{g,c} = sum_{i in I} q_{g,i} (sigma_i > 0 ? kmax_{c,i} : kmin_{c,i}),
    tau_g = sqrt(d sum_I |q_g| / sum |q_g|). `r_ch` may be a tensor [B or 1, 1, 1] (stacked rows: row b's own).
    """
    d = q.shape[-1]
    absq = q.abs()
    a = absq.sum(dim=2)  # [B, Hkv, d]
    channel = torch.arange(d, device=q.device)
    ahead = (a.unsqueeze(-2) > a.unsqueeze(-1)) | ((a.unsqueeze(-2) == a.unsqueeze(-1)) & (channel < channel[:, None]))
    chosen = ahead.sum(-1) < r_ch  # rank_i = #{j ahead of i}
    q_sel = q.masked_fill(~chosen.unsqueeze(2), 0.0)
    bound = torch.where((q.sum(dim=2) > 0).unsqueeze(2), kmax, kmin)  # sum 0 -> min (as both official paths)
    s_hat = torch.einsum("bhgd,bhcd->bhgc", q_sel, bound)
    tiny = torch.finfo(torch.float32).tiny  # an all-zero query would give 0/0 (the official code returns NaN)
    tau = torch.sqrt(d * q_sel.abs().sum(-1, keepdim=True) / absq.sum(-1, keepdim=True).clamp_min(tiny)).clamp_min(tiny)
    return s_hat, tau


def survivor_scores(q: Tensor, kmin: Tensor, kmax: Tensor, r_ch, cs, n, capacity: int) -> Tensor:
    """Ranking keys [B, Hkv, capacity] (int64) of the T' = n survivors: q [B, Hkv, G, d], kmin/kmax [B, Hkv, C, d];
    r_ch, cs, n ints or [B or 1, 1, 1] tensors (stacked rows).

    score_t = sum_g softmax_t(s_hat_{g, c(t)} / tau_g) over the survivors, c(t) = t // cs: a chunk's live tokens
    share its score, so the softmax is taken per chunk with n_c = its live tokens,
        score_t = sum_g exp(x_{g,c} - m_g) / Z_g,  Z_g = sum_c n_c exp(x_{g,c} - m_g)   (float64, then fp32),
    and key_t = (fp32 bits of score_t) * 2^31 + (2^31 - 1 - t): larger score first, ties to the earlier survivor
    (every token of a chunk ties; the official torch.topk leaves them to its implementation). -1 - t past T'."""
    s_hat, tau = approx_scores(q, kmin.float(), kmax.float(), r_ch)
    chunk = torch.arange(kmin.shape[2], device=q.device)
    live = (n - chunk * cs).clamp_min(0).clamp_max(cs).unsqueeze(-2)  # [B or 1, 1, 1, C] (or [1, C])
    x = (s_hat / tau).masked_fill(live == 0, float("-inf")).double()
    p = torch.exp(x - x.amax(-1, keepdim=True))
    w = (p / (p * live).sum(-1, keepdim=True)).sum(2).float()  # [B, Hkv, C]
    token = torch.arange(capacity, device=q.device)
    c = torch.div(token, cs, rounding_mode="floor").clamp_max(w.shape[-1] - 1)  # stacked rows: past T' masked below
    score = w.gather(-1, c.expand(*w.shape[:2], capacity))
    key = (score.view(torch.int32).long() << 31) + (2**31 - 1 - token)
    return torch.where(token < n, key, -1 - token)


@dataclass(frozen=True)
class RocketKVOptions(Options):
    params: str = option("accuracy", one_of(*VARIANTS), attr="variant")  # the official script's stage settings
    # the share of log c given to stage 1 (None: min(0.2 + 0.06 log2 c, 0.8))
    alpha: float | None = option(None, number(0, 1, allow_none=True))
    window: int = option(32, positive_int)  # SnapKV++'s observation window of prompt queries
    pool_kernel: int = option(63, odd_positive_int)  # SnapKV++'s pooling of the window's scores

    def check_budget(self, budget):
        if self.budget_mode == "paper" and budget < 2:
            raise ConfigError(f"budget must be >= 2 in budget_mode=paper (k = budget // 2 tokens are attended; "
                              f"got {budget})")


@register
class RocketKVSelector(Selector):
    name = "rocketkv"
    display_name = "RocketKV"
    report_order = 6
    Options = RocketKVOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        # fair: attend at most `budget` tokens = the paper's decomposition of a traffic budget 2 * budget
        self.traffic_budget = 2 * self.budget if self.budget_mode == "fair" else self.budget
        self.params: RocketParams | None = None
        self.prompt_len = 0
        self.kept = 0  # prompt tokens surviving stage 1 per KV head
        self.n = 0  # T': survivors + decode tokens per KV head
        self.seen = 0  # cache length already folded into the state
        self.index: Tensor | None = None  # [B, Hkv, cap] cache index of each compacted position
        self.kmin: Tensor | None = None  # [B, Hkv, capC, d] per-chunk element-wise min (cache dtype: min/max are exact)
        self.kmax: Tensor | None = None

    def memory_bytes(self, length: int) -> dict[str, float]:
        """RocketKV's design after a prompt of `length` tokens (no tokens generated yet): SnapKV++ evicts every prompt
        token but its `prompt_budget` survivors for good, so the device keeps their K/V and, per chunk of cs
        survivors, the element-wise key min and max (the keys' dtype)."""
        info = self.info
        p = rocket_params(length, self.traffic_budget, 0, info.head_dim, self.variant, self.alpha)
        keep = max(p.prompt_budget, min(self.window, length))
        kept = keep if length > keep else length
        state = 2 * -(-kept // p.cs) * info.head_dim * info.kv_element_bytes * info.num_kv_heads
        return {"kv": float(kept * info.token_kv_bytes), "state": float(state), "host": 0.0}

    def prefill_queries(self) -> int | None:
        return self.window  # SnapKV++ scores with the last `window` prompt queries

    def prefill(self, ctx) -> None:
        keys, queries = ctx.keys, ctx.queries
        B, Hkv, L, d = keys.shape
        max_new = int(ctx.max_new_tokens or 0)
        S = L + max_new if ctx.max_length is None else min(L + max_new, int(ctx.max_length))
        p = rocket_params(S, self.traffic_budget, max_new, d, self.variant, self.alpha)
        self.params, self.prompt_len = p, L
        w = min(self.window, L)
        keep = max(p.prompt_budget, w)
        device = keys.device
        if L > keep:
            # budget-independent: one scoring per sample for every budget of a group (PrefillContext.shared)
            scores = ctx.shared(("rocketkv.snapkv", w, self.pool_kernel), lambda: snapkv_scores(
                queries[:, :, -w:], keys, w, self.pool_kernel, self.info.scaling))
            top = top_units(scores, keep - w)
            kept = torch.cat([top, torch.arange(L - w, L, device=device).expand(B, Hkv, w)], dim=-1)
            self.alive = torch.zeros(B, Hkv, L, dtype=torch.bool, device=device)
            self.alive.scatter_(2, kept, True)
        else:
            kept = torch.arange(L, device=device).expand(B, Hkv, L)
            self.alive = None
        self.kept = self.n = kept.shape[-1]
        self.seen = L
        cap = self.n + max(max_new, 16)
        self.index = kept.new_zeros(B, Hkv, cap)
        self.index[:, :, : self.n] = kept
        cs = p.cs
        chunks = -(-self.n // cs)
        k = keys.gather(2, kept[..., None].expand(-1, -1, -1, d))
        pad = chunks * cs - self.n  # a trailing partial chunk covers its existing tokens only
        kmin = torch.cat([k, k.new_full((B, Hkv, pad, d), float("inf"))], 2).view(B, Hkv, chunks, cs, d).amin(3)
        kmax = torch.cat([k, k.new_full((B, Hkv, pad, d), float("-inf"))], 2).view(B, Hkv, chunks, cs, d).amax(3)
        cap_c = -(-cap // cs)
        self.kmin, self.kmax = k.new_empty(B, Hkv, cap_c, d), k.new_empty(B, Hkv, cap_c, d)
        self.kmin[:, :, :chunks], self.kmax[:, :, :chunks] = kmin, kmax

    def _grow(self) -> None:
        cap = 2 * self.index.shape[-1]
        self.index = resized(self.index, self.n, cap, dim=-1, zero=True)
        cap_c = -(-cap // self.params.cs)
        self.kmin, self.kmax = (resized(buf, buf.shape[2], cap_c) for buf in (self.kmin, self.kmax))

    def append(self, keys: Tensor, values: Tensor) -> None:
        if self.params is None:
            raise ConfigError("rocketkv: append() before prefill(); the selector sizes its stages at prefill")
        cs = self.params.cs
        for pos in range(self.seen, keys.shape[2]):  # decode tokens are appended to every KV head, never evicted
            if self.n == self.index.shape[-1]:
                self._grow()
            c, offset = divmod(self.n, cs)
            fold_into_page(self.kmax, self.kmin, keys[:, :, pos : pos + 1], c, opens=offset == 0)
            self.index[:, :, self.n] = pos
            self.n += 1
        self.seen = max(self.seen, keys.shape[2])

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        if self.params is None:
            raise ConfigError("rocketkv: select() before prefill(); the selector sizes its stages at prefill")
        p, n = self.params, self.n
        k = self._top_k(n)
        if k >= n:  # every survivor fits: attended exactly (the harness restricts a dense selection to `alive`)
            return Selection.all_tokens()
        B, Hq, d = query.shape
        Hkv = keys.shape[1]
        chunks = -(-n // p.cs)
        key = survivor_scores(query.float().view(B, Hkv, Hq // Hkv, d), self.kmin[:, :, :chunks],
                              self.kmax[:, :, :chunks], p.r_ch, p.cs, n, n)
        idx = self.index[:, :, :n].gather(-1, key.topk(k, dim=-1).indices).sort(dim=-1).values
        return Selection(indices=idx.unsqueeze(2), valid=torch.ones(B, Hkv, 1, k, dtype=torch.bool, device=idx.device),
                         forced_tokens=0.0, metadata_bytes=self._metadata_bytes(n))

    def _top_k(self, n: int) -> int:
        """Tokens the hybrid top-k keeps among n survivors: min(k, n), at least 1 (gpt_fast's round(b / 2) is 0 for a
        1-token sequence)."""
        return max(1, min(self.params.k, n))

    def _metadata_bytes(self, n: int) -> float:
        """A scored step over T' = n survivors: the r_ch channels of each chunk's needed min/max bound, and the
        approximate fp32 scores of every survivor and query head (over KV heads)."""
        p, info = self.params, self.info
        return float(info.num_kv_heads * (info.kv_element_bytes * p.r_ch * -(-n // p.cs) + 4 * info.group_size * n))

    # ----- static decode: the survivors' order, chunks and top-k in fixed shapes, T' only on the device ------------
    # Each row's decomposition is device state (static_params: cs, r_ch, prompt - survivors, k), so rows of different
    # lengths, whose cs, r_ch and T' differ, stack in one step; the top-k width is the rows' largest.

    row_state = ("index", "kmin", "kmax", "static_params", "static_k")

    def static_decode_error(self):
        return None

    def start_static(self, capacity):
        """Room for every token up to `capacity` in the compacted order and its chunks, exactly (unwritten entries
        are finite, their scores masked), and the row's decomposition on the device."""
        p = self.params
        cap = self._survivors(capacity)
        chunks = -(-self.n // p.cs)
        index = self.index.new_zeros(*self.index.shape[:2], cap)
        index[:, :, : self.n] = self.index[:, :, : self.n]
        self.index = index
        self.kmin, self.kmax = (torch.cat([buf[:, :, :chunks], buf.new_zeros(*buf.shape[:2], -(-cap // p.cs) - chunks,
                                                                              buf.shape[3])], 2)
                                for buf in (self.kmin, self.kmax))
        self.static_k = self._top_k(cap)
        self.static_params = torch.tensor([[p.cs, p.r_ch, self.prompt_len - self.kept, self.static_k]],
                                          device=index.device).repeat(index.shape[0], 1)  # [B, 4]: one per sequence

    def select_static(self, query, keys, values, length):
        """The eager step at T' = `length` - (prompt - survivors) over the preallocated order: the approximation
        over every chunk with the entries at or past T' masked, then the exact top min(k, T') of the survivors
        (k fixed; while T' <= k every survivor, as the eager dense step over `alive`). Cache slots ascending, the
        invalid ones last."""
        if self.info.backend == "triton":
            return self._select_static_fused(query, keys, length)
        cs, r_ch, evicted, k = (x.view(-1, 1, 1) for x in self.static_params.unbind(-1))  # [1 or B, 1, 1] each
        n = self._static_append(keys, length, cs, evicted)
        B, Hq, d = query.shape
        Hkv = keys.shape[1]
        key = survivor_scores(query.float().view(B, Hkv, Hq // Hkv, d), self.kmin, self.kmax, r_ch, cs, n,
                              self.index.shape[-1])
        top = key.topk(self.static_k, dim=-1).indices  # positions < T' first
        valid = (top < n) & (torch.arange(self.static_k, device=keys.device) < k)
        idx = torch.where(valid, self.index.gather(-1, top), keys.shape[2]).sort(dim=-1).values  # invalid last
        valid = idx < keys.shape[2]
        return Selection(indices=idx.masked_fill(~valid, 0).unsqueeze(2), valid=valid.unsqueeze(2),
                         attended_on_host=True)

    def _static_append(self, keys: Tensor, length: Tensor, cs: Tensor, evicted: Tensor) -> Tensor:
        """Fold the token at slot length - 1 into the compacted order at T' - 1 and its chunk's min/max on the
        device (a new chunk starts from it). -> T' [1 or B, 1, 1] (survivors + decode tokens, the new one
        included)."""
        position = length.reshape(-1) - 1  # [1], or [B]: each row's own slot (stacked rows)
        rows = position.numel()  # one length: the sequences share one decomposition
        evicted, cs = evicted.view(-1)[:rows], cs.view(-1)[:rows]
        n = position + 1 - evicted
        slot = n - 1
        chunk = torch.div(slot, cs, rounding_mode="floor")
        opens = slot % cs == 0
        if position.numel() == 1:
            fold_into_page(self.kmax, self.kmin, keys.index_select(2, position), chunk, opens=opens)
            self.index.index_copy_(2, slot, position.view(1, 1, 1).expand(*self.index.shape[:2], 1))
        else:
            rows = torch.arange(keys.shape[0], device=keys.device)
            fold_into_page(self.kmax, self.kmin, keys[rows, :, position].unsqueeze(2), chunk, opens=opens)
            self.index[rows, :, slot] = position.view(-1, 1)
        return n.view(-1, 1, 1)

    def _select_static_fused(self, query, keys, length):
        """`select_static` in four launches (baselines/rocketkv/kernels.py): the chunk update, every survivor's
        aggregated score, torch.topk, and the token list."""
        from baselines.rocketkv.kernels import rocket_append, rocket_static_tokens, rocket_token_scores

        rocket_append(keys, self.kmin, self.kmax, self.index, self.static_params, length)
        key = rocket_token_scores(query, self.kmin, self.kmax, self.static_params, length, self.index.shape[-1])
        top = torch.topk(key, self.static_k, dim=-1).indices
        indices, valid = rocket_static_tokens(top, self.index, self.static_params, length, keys.shape[2])
        return Selection(indices=indices, valid=valid, attended_on_host=True)

    def _survivors(self, length: int) -> int:
        """T' at `length` cached tokens: the prompt's survivors and every decode token."""
        return self.kept + length - self.prompt_len

    def after_static_step(self, keys, values, length):
        self.n = self._survivors(length)
        self.seen = length

    def static_step_cost(self, length):
        n = self._survivors(length)
        k = self._top_k(n)
        if k >= n:
            return 0.0, 0.0, float(n)
        return 0.0, self._metadata_bytes(n), float(k)

    def extra_metrics(self) -> dict:
        if self.params is None:
            return {}
        p = self.params
        return {"alpha": p.alpha, "prompt_budget": float(p.prompt_budget), "cs": float(p.cs), "r_ch": float(p.r_ch),
                "kept_fraction": self.kept / self.prompt_len if self.prompt_len else 1.0}
