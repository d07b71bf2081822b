"""ShadowKV (ICML'25, `docs/methods/shadowkv.md`): low-rank pre-RoPE keys, offloaded values, chunk-mean landmarks.

Prefill (once per layer, prompt of Lp tokens, chunk size C, per batch row):
  * thin SVD in fp32 of the pre-RoPE keys reshaped [Lp, Hkv*d]:  K_pre = U S V^T.  Stored: U[:, :r] [Lp, r], shared
    by all KV heads, and S_r V_r^T split per head [Hkv, r, d], both in the keys' dtype (bf16 in the official code).
    Effective rank r = min(rank, Hkv*d, Lp): the scale-down rule for small models (the tiny test Llama has
    Hkv*d = 32 < 160, so it runs at full rank; SmolLM2-135M has 3*64 = 192 >= 160). Reported as `effective_rank`.
  * local window: chunks = Lp//C - local_chunks (rounded down to a multiple of 8 with align_chunks_to_8, the CPU
    class); the trailing W = Lp - chunks*C prompt tokens are attended exactly.
  * landmarks: per KV head the mean of each chunk of C post-RoPE keys.
  * outliers: per KV head the O chunks with the lowest  min_{i in chunk} cos(k_i, landmark)  are attended exactly
    and removed from the candidates.
  * values of the `chunks*C` non-local prompt tokens go to a host store [B, Hkv, chunks, C*d] (pinned when CUDA
    exists; offload_values=true), and, as in the CPU class (kv_cache.py L590-603), one selection is made with the
    last prompt query to fill the device buffer, so the first decode step already measures hits against it.

Decode step (query q_g of head g in the group of KV head h, candidate chunk c):
    a_{g,c} = softmax_c(q_g . landmark_{h,c} * scale),  score_{h,c} = max_g a_{g,c}          (fp32)
with scale = 1/sqrt(128) (landmark_scale=official, the hard-coded constant) or 1/sqrt(d) (head_dim); the top n_sel
chunks per KV head are selected (Gs = 1: one set per KV head). Their keys are rebuilt, K_pre[p] = U[p] (S V_h), and
rotated at their original positions with `ctx.rotate` (identity when the context has none: then `pre_rope_keys()`
returns the cached keys). Local, outlier and generated keys (every token appended after the prefill, the current one
included) and all values are exact. The Selection carries the full K/V rows: exact rows for the forced parts,
reconstructed keys for the selected chunks, values served from the device buffer (hits: chunks selected at the
previous step) or copied host->device (misses only).

Budget (`docs/budgets.md`):
  * paper: n_sel = budget // C chunks; W + C*O + g outside the budget (budget % C != 0 -> ConfigError, the official
    assert). O = outlier_chunks (48, the accuracy class) or (budget//1024)*24 with outlier_chunks=auto (CPU class).
  * fair: W + C*O + g + C*n_sel <= budget with O = min(outlier_chunks, (budget//1024)*24) (the CPU class rule capped
    by the configured count) and n_sel = (budget - W - C*O - g) // C. When W + g alone exceed budget - C*O, only
    the most recent budget - C*O tokens of the local+generated tail are attended (and n_sel = 0): the budget then
    drops the oldest local/generated tokens instead of the official code's silent drop of new tokens past its
    buffer headroom (spec 2.1 item 7). budget < W + C*O -> ConfigError at prefill, naming the minimum.
  In both modes n_sel >= #candidates selects every candidate, and O is capped at the number of chunks.

Bytes per step (spec 2.5, accuracy-class formula with the measured hits; per KV head, summed, batch mean; s =
kv_element_bytes, misses = reconstructed tokens (all selected tokens with offload_values=false)):
    metadata = s*d*(#candidates) + 4*G*(#candidates)     (landmark read + scores; only when top-k scoring runs)
             + s*misses*r + s*d*r                          (U-row gather + S V_h; only when something is rebuilt)
    kv       = 2*d*s*(tail + C*O + C*n_sel) + s*misses*d   (attention read + write of the rebuilt keys)
    h2d      = s*d*misses                                  (value misses over PCIe; 0 with offload_values=false)
The landmark read counts the landmarks actually stored, chunks - O (spec: L/C - O, which also counts the local
window that has no landmark). Hit moves inside the device buffer are not counted (hits are reused in place).

Deviations from the official code (bytedance/ShadowKV @ a21f5a9):
  * prefill is the harness's explicit phase flag, not `q_len > 4096` (ShadowKV#8): a prompt of any length is
    compressed, and a decode step is never mistaken for a prefill.
  * scores stay fp32 through softmax, max and top-k (the accuracy class casts the softmax to bf16 before them).
  * the outlier rule's cosine similarity (each chunk's keys against its mean) is computed in fp32; the official code
    computes it in bf16, so chunks whose similarities are within bf16 rounding may swap in or out of the outliers.
  * the key reconstruction U[p] (S V_h) accumulates in fp32 before the cast to the keys' dtype (official: bf16 GEMM).
  * one decode path for both classes: offload_values only decides where values come from (host store + temporal
    buffer, or the device cache); selection and keys are identical, so spec 2.6 item 9 holds by construction.
  * the host store holds the values of all non-local chunks (like the CPU class, [Hkv, L/C, C*d]); outlier chunks
    are never fetched from it.
  * small prompts: O is capped at the number of chunks and top-k at the number of candidates (the official code
    asserts instead); the fair-mode tail cap above replaces the fixed buffer headroom.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from locks.core.host_rows import device_view, gather_missed_rows
from locks.core.options import Options, flag, integer, one_of, option, or_literal, positive_int
from locks.core.reference import take_rows
from locks.core.registry import register
from locks.core.selector import LayerInfo, PrefillContext, Selection, Selector
from locks.errors import ConfigError

LANDMARK_SCALES = ("official", "head_dim")


def chunk_outlier_scores(keys: Tensor, C: int, chunks: int) -> tuple[Tensor, Tensor]:
    """Landmarks and outlier scores of the first `chunks` chunks of C post-RoPE keys [B, H, L, d] -> (means
    [B, H, chunks, d] fp32, min_cos [B, H, chunks]): min_cos_c = min_{i in c} cos(k_i, mean_c). Budget-independent."""
    B, H, _, d = keys.shape
    k = keys[:, :, : chunks * C].float().view(B, H, chunks, C, d)
    means = k.mean(dim=3)
    unit = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    unit_mean = means / means.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    return means, (unit * unit_mean.unsqueeze(3)).sum(-1).amin(dim=-1)


@dataclass(frozen=True)
class ShadowKVOptions(Options):
    rank: int = option(160, positive_int)  # rank of the pre-RoPE key SVD
    chunk_size: int = option(8, positive_int)  # tokens per chunk (one landmark each)
    local_chunks: int = option(4, integer(0))  # the newest chunks, always attended
    outlier_chunks: int | str = option(48, or_literal(integer(0), "auto"), attr="outlier_option")
    align_chunks_to_8: bool = option(False, flag)
    landmark_scale: str = option("official", one_of(*LANDMARK_SCALES))
    offload_values: bool = option(True, flag)  # values live on the host and are fetched per step

    def check_budget(self, budget):
        if self.budget_mode == "paper" and budget % self.chunk_size:
            raise ConfigError(f"budget must be a multiple of method.chunk_size={self.chunk_size} in budget_mode=paper "
                              f"(got {budget})")


@register
class ShadowKVSelector(Selector):
    name = "shadowkv"
    display_name = "ShadowKV"
    report_order = 5
    Options = ShadowKVOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        self.scale = 1.0 / math.sqrt(128) if self.landmark_scale == "official" else 1.0 / math.sqrt(info.head_dim)
        self.prompt_len = 0
        self.hit_rates: list[float] = []

    # ------------------------------------------------------------------ prefill

    def outlier_count(self) -> int:
        """O before the cap at the number of chunks (see the module docstring)."""
        rule = (self.budget // 1024) * 24  # CPU class, kv_cache.py L398
        configured = rule if self.outlier_option == "auto" else self.outlier_option
        return configured if self.budget_mode == "paper" else min(configured, rule)

    def prefill_queries(self) -> int | None:
        return 1  # the CPU class's first selection uses the last prompt query

    def prefill_bytes(self, length: int) -> float:
        """The SVD's work: the pre-RoPE keys (the cache's dtype), the fp32 [length, H_kv d] matrix it factors and
        its thin U (tests/eval/test_memory_plan.py measures it)."""
        info = self.info
        return float(info.num_kv_heads * length * info.head_dim * (info.kv_element_bytes + 2 * 4))

    def prefill(self, ctx: PrefillContext) -> None:
        keys, values = ctx.keys, ctx.values
        B, H, Lp, d = keys.shape
        C = self.chunk_size
        self.prompt_len, self.device, self.dtype = Lp, keys.device, keys.dtype
        self.positions = ctx.positions.expand(B, Lp)
        self.rotate, self.rotation = ctx.rotate, ctx.rotation

        chunks, self.window, self.outliers = self._layout(Lp)
        self.num_chunks = chunks
        if self.budget_mode == "fair" and self.budget < self.window + C * self.outliers:
            raise ConfigError(f"budget={self.budget} is below ShadowKV's always-attended local window + outlier chunks "
                              f"({self.window} + {C * self.outliers} tokens for this prompt): use budget >= "
                              f"{self.window + C * self.outliers} or method.budget_mode=paper")

        # Low-rank pre-RoPE keys: [Lp, Hkv*d] = U S V^T, fp32 thin SVD; keep U[:, :r] and (S V^T)_r per head.
        self.r = min(self.rank, H * d, Lp)
        U, S, Vh = ctx.shared(("shadowkv.svd",), lambda: torch.linalg.svd(
            ctx.pre_rope_keys().transpose(1, 2).reshape(B, Lp, H * d).float(), full_matrices=False))
        self.U = U[:, :, : self.r].to(self.dtype).contiguous()  # [B, Lp, r]
        sv = S[:, : self.r, None] * Vh[:, : self.r]  # [B, r, Hkv*d]
        self.SV = sv.view(B, self.r, H, d).permute(0, 2, 1, 3).to(self.dtype).contiguous()  # [B, Hkv, r, d]

        # Landmarks = chunk means of post-RoPE keys; outlier score = min over the chunk of cos(k_i, landmark).
        means, min_cos = ctx.shared(("shadowkv.chunks", C, chunks), lambda: chunk_outlier_scores(keys, C, chunks))
        O = self.outliers
        outl = torch.topk(min_cos, O, dim=-1, largest=False).indices.sort(dim=-1).values  # lowest O
        is_outlier = torch.zeros(B, H, chunks, dtype=torch.bool, device=keys.device)
        is_outlier.scatter_(2, outl, True)
        # candidates in ascending chunk order (stable sort keeps the order among non-outliers)
        self.candidates = torch.argsort(is_outlier.to(torch.int8), dim=-1, stable=True)[..., : chunks - O]
        self.num_candidates = chunks - O  # (host: a stacked row's candidates are padded to the rows' most)
        self.outlier_chunks = outl
        self.landmarks = take_rows(means, self.candidates).to(self.dtype)  # [B, H, chunks - O, d] (k_landmark)
        self.outlier_tokens = self._tokens(outl)

        self.hit_rates = []
        self.static_hits = (0.0, 0)  # (sum of per-step hit rates, steps) of static steps, folded by finish_static
        self.prefill_h2d_bytes = 0.0
        self.buf_chunks = keys.new_zeros(B, H, 0, dtype=torch.long)
        if self.offload_values:
            host = values[:, :, : chunks * C].reshape(B, H, chunks, C * d).to("cpu", copy=True)
            self.host_values = host.pin_memory() if torch.cuda.is_available() else host
            self.buf_k = keys.new_zeros(B, H, 0, C, d)
            self.buf_v = values.new_zeros(B, H, 0, C, d)
        # CPU class: one selection with the last prompt query at prefill (sized for the first decode step, g = 1).
        _, n_sel = self._plan(1)
        chosen = self._choose(ctx.queries[:, :, -1], n_sel)
        if self.offload_values:
            self._fetch(chosen, values)
            self.prefill_h2d_bytes = float(chosen.shape[-1] * C * d * self.info.kv_element_bytes * H)
        self.buf_chunks = chosen

    def _layout(self, Lp: int) -> tuple[int, int, int]:
        """(sparse chunks, exact local window in tokens, outlier chunks) of a prompt of Lp tokens."""
        C = self.chunk_size
        chunks = max(Lp // C - self.local_chunks, 0)
        if self.align_chunks_to_8:
            chunks = chunks // 8 * 8
        return chunks, Lp - chunks * C, min(self.outlier_count(), chunks)

    def memory_bytes(self, length: int) -> dict[str, float]:
        """ShadowKV's design after a prompt of `length` tokens (docs/memory.md): on the device the exact K/V of the
        local window and the outlier chunks, and the buffer of the selected chunks' rebuilt keys and fetched
        values; as state U [L, r] (one per layer), (S V^T) [Hkv, r, d] and the landmarks; the sparse chunks'
        values in host memory (on the device with offload_values=false). Their keys exist only as U (S V^T)."""
        info, C = self.info, self.chunk_size
        s, d, H = info.kv_element_bytes, info.head_dim, info.num_kv_heads
        chunks, window, outliers = self._layout(length)
        r = min(self.rank, H * d, length)
        n_sel = self._selected_chunks(length)
        values = chunks * C * d * s * H
        kv = (window + C * outliers + C * n_sel) * info.token_kv_bytes
        state = (length * r + H * r * d + H * (chunks - outliers) * d) * s
        return {"kv": float(kv + (0 if self.offload_values else values)), "state": float(state),
                "host": float(values if self.offload_values else 0)}

    def harness_bytes(self, length: int) -> float:
        """The selected chunks' buffer: rebuilt keys and fetched values (the design's device "kv" beyond the window
        and outliers; a copy of rows the harness's whole cache also holds)."""
        return float(self._selected_chunks(length) * self.chunk_size * self.info.token_kv_bytes)

    def static_bytes(self, length: int) -> float:
        """With offloaded values, the static step's two slots of fetched values (start_static)."""
        return self.harness_bytes(length) if self.offload_values else 0.0

    def _selected_chunks(self, length: int) -> int:
        """The first step's selected chunks after a prompt of `length` tokens (the most any step selects)."""
        chunks, window, outliers = self._layout(length)
        return self._plan_for(length, window, outliers, chunks - outliers, 1)[1]

    def _tokens(self, chunk_ids: Tensor) -> Tensor:
        """[B, H, m] chunk ids -> [B, H, m*C] token indices."""
        C = self.chunk_size
        return (chunk_ids.unsqueeze(-1) * C + torch.arange(C, device=chunk_ids.device)).flatten(-2)

    # ------------------------------------------------------------------ decode

    def _plan(self, generated: int) -> tuple[int, int]:
        """-> (first token of the exact local+generated tail, n_sel) for a step with `generated` tokens after Lp."""
        return self._plan_for(self.prompt_len, self.window, self.outliers, self.num_candidates, generated)

    def _plan_for(self, prompt_len: int, W: int, outliers: int, ncand: int, generated: int) -> tuple[int, int]:
        """`_plan` of a prompt of `prompt_len` tokens with local window W, `outliers` outlier chunks and `ncand`
        candidate chunks (also what memory_bytes sizes the buffer by, before any prefill)."""
        C = self.chunk_size
        start = prompt_len - W
        if self.budget_mode == "paper":
            return start, min(self.budget // C, ncand)
        room = self.budget - C * outliers
        if W + generated > room:  # keep only the most recent `room` tokens of the tail
            return prompt_len + generated - room, 0
        return start, min((room - W - generated) // C, ncand)

    def _scores(self, query: Tensor, ncand: Tensor | None = None) -> Tensor:
        """[B, Hkv, NC] fp32 landmark scores: a softmax over the candidates per query head, the max over the group;
        with `ncand` ([B], stacked rows) -inf past each row's candidates (the softmax over its own)."""
        B, Hq, d = query.shape
        H, NC = self.candidates.shape[1:]
        q = query.view(B, H, Hq // H, d).float()
        logits = torch.einsum("bhgd,bhcd->bhgc", q, self.landmarks.float()) * self.scale
        if ncand is None:
            return torch.softmax(logits, dim=-1).amax(dim=2)  # softmax per query head, max over the group
        live = torch.arange(NC, device=q.device) < ncand.view(-1, 1, 1, 1)
        score = torch.softmax(logits.masked_fill(~live, float("-inf")), dim=-1).amax(dim=2)
        return score.masked_fill(~live[:, :, 0], float("-inf"))

    def _ranked(self, query: Tensor, n: int) -> Tensor:
        """-> [B, Hkv, n] chunk ids of the n best-scored candidates, best first (through k_landmark_idx)."""
        return torch.gather(self.candidates, 2, torch.topk(self._scores(query), n, dim=-1).indices)

    def _choose(self, query: Tensor, n_sel: int) -> Tensor:
        """-> [B, Hkv, n_sel] selected chunk ids, ascending."""
        if n_sel >= self.num_candidates:
            return self.candidates
        return self._ranked(query, n_sel).sort(dim=-1).values

    def _host_cost(self, length: int) -> tuple[int, int, int, float]:
        """(first tail token, n_sel, forced tokens, landmark metadata bytes) of the step at `length` tokens: what
        does not depend on the hits."""
        info, C = self.info, self.chunk_size
        ncand = self.num_candidates
        start, n_sel = self._plan(length - self.prompt_len)
        landmarks = 0.0
        if 0 < n_sel < ncand:  # landmark read + scores, only when top-k scoring runs
            landmarks = float(info.num_kv_heads * (info.kv_element_bytes * info.head_dim + 4 * info.group_size) * ncand)
        return start, n_sel, (length - start) + C * self.outliers, landmarks

    def _rebuild_bytes(self, rebuilt: Tensor, rank) -> Tensor:
        """[B, 3] float64 (metadata, K/V, host-to-device) bytes of rebuilding `rebuilt` [B, Hkv] tokens per head (and,
        offloading, fetching their values) at effective rank `rank` (an int, or [B]): U rows + S V_h per rebuilding
        head, the rebuilt keys' write, the values over PCIe."""
        s, d = self.info.kv_element_bytes, self.info.head_dim
        rebuilt = rebuilt.to(torch.float64)
        total = rebuilt.sum(-1)  # [B] summed over KV heads
        heads = (rebuilt > 0).sum(-1).to(torch.float64)
        keys = s * d * total
        return torch.stack([s * rank * total + s * d * rank * heads, keys,
                            keys if self.offload_values else torch.zeros_like(keys)], dim=-1)

    def _reconstruct(self, chunk_ids: Tensor) -> Tensor:
        """[B, H, m] chunk ids -> post-RoPE keys [B, H, m, C, d]:  RoPE(U[p] (S V_h), pos(p))."""
        B, H, m = chunk_ids.shape
        C, d, r = self.chunk_size, self.SV.shape[-1], self.U.shape[-1]  # (stacked rows: the largest rank, zero-padded)
        tok = self._tokens(chunk_ids)  # [B, H, m*C]
        u = take_rows(self.U.unsqueeze(1), tok.view(B, 1, H * m * C)).view(B, H, m * C, r)  # U rows [B, H, m*C, r]
        pre = torch.matmul(u.float(), self.SV.float()).to(self.dtype)  # [B, H, m*C, d]
        if self.rotate is None:
            return pre.view(B, H, m, C, d)
        pos = torch.gather(self.positions.unsqueeze(1).expand(B, H, -1), 2, tok)
        post = self.rotate(pre.reshape(B * H, 1, m * C, d), pos.reshape(B * H, m * C))
        return post.reshape(B, H, m, C, d)

    def _fetch(self, chosen: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Temporal cache: hits from the device buffer, misses rebuilt (keys) / copied host->device (values).

        -> (keys [B, H, n, C, d], values [B, H, n, C, d], hit [B, H, n] bool); the buffer becomes this selection.
        """
        B, H, n = chosen.shape
        C, d = self.chunk_size, values.shape[-1]
        prev = self.buf_chunks
        if prev.shape[-1] and n:
            eq = chosen.unsqueeze(-1) == prev.unsqueeze(-2)  # [B, H, n, m]
            hit = eq.any(-1)
            src = eq.int().argmax(-1)
            m = prev.shape[-1]
            k_hit, v_hit = (take_rows(buf.view(B, H, m, C * d), src).view(B, H, n, C, d)
                            for buf in (self.buf_k, self.buf_v))
        else:
            hit = torch.zeros(B, H, n, dtype=torch.bool, device=chosen.device)
            k_hit = v_hit = None
        miss = ~hit
        new_k = values.new_zeros(B, H, n, C, d, dtype=self.dtype)
        max_miss = int(miss.sum(-1).max()) if n else 0
        if max_miss:
            # misses first (as reorder_keys_and_compute_offsets does); only the first max_miss slots are rebuilt
            order = torch.argsort(hit.to(torch.int8), dim=-1, stable=True)[..., :max_miss]
            rec = self._reconstruct(torch.gather(chosen, 2, order))
            new_k.scatter_(2, order[..., None, None].expand(B, H, max_miss, C, d), rec)
        new_v = values.new_zeros(B, H, n, C, d)
        bi, hi, ji = miss.nonzero(as_tuple=True)
        if len(bi):
            lin = ((bi * H + hi) * self.num_chunks + chosen[bi, hi, ji]).cpu()
            rows = self.host_values.view(-1, C * d).index_select(0, lin)  # host-side gather of the missed chunks
            new_v[bi, hi, ji] = rows.to(values.device, non_blocking=True).view(-1, C, d)  # H2D: misses only
        if k_hit is not None:
            new_k = torch.where(hit[..., None, None], k_hit, new_k)
            new_v = torch.where(hit[..., None, None], v_hit, new_v)
        self.buf_chunks, self.buf_k, self.buf_v = chosen, new_k, new_v
        return new_k, new_v, hit

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        B, H, L, d = keys.shape
        C, s = self.chunk_size, self.info.kv_element_bytes
        start, n_sel, forced, landmarks = self._host_cost(L)
        chosen = self._choose(query, n_sel)

        prev = self.buf_chunks
        if n_sel:
            overlap = (chosen.unsqueeze(-1) == prev.unsqueeze(-2)).any(-1)  # |S_t ∩ S_{t-1}| per chunk
            self.hit_rates.append(float(overlap.float().mean()))
        if self.offload_values:
            k_sel, v_sel, hit = self._fetch(chosen, values)
            misses = (~hit).sum(-1).float() * C  # [B, H] rebuilt / fetched tokens
        else:
            self.buf_chunks = chosen
            k_sel = self._reconstruct(chosen)
            v_sel = take_rows(values, self._tokens(chosen)).view(B, H, n_sel, C, d)
            misses = torch.full((B, H), float(n_sel * C), device=keys.device)

        tail = torch.arange(start, L, device=keys.device).expand(B, H, L - start)
        idx = torch.cat([self.outlier_tokens, self._tokens(chosen), tail], dim=-1)
        k = torch.cat([take_rows(keys, self.outlier_tokens), k_sel.view(B, H, -1, d), keys[:, :, start:]], dim=2)
        v = torch.cat([take_rows(values, self.outlier_tokens), v_sel.view(B, H, -1, d), values[:, :, start:]], dim=2)
        idx, order = idx.sort(dim=-1, stable=True)
        k, v = take_rows(k, order), take_rows(v, order)
        valid = torch.ones_like(idx, dtype=torch.bool)
        if self.budget_mode == "fair":  # fixed size min(budget, L): pad with token 0, masked out
            pad = min(self.budget, L) - idx.shape[-1]
            if pad > 0:
                idx = torch.cat([idx, idx.new_zeros(B, H, pad)], -1)
                valid = torch.cat([valid, valid.new_zeros(B, H, pad)], -1)
                k = torch.cat([k, k.new_zeros(B, H, pad, d)], 2)
                v = torch.cat([v, v.new_zeros(B, H, pad, d)], 2)

        rebuild_metadata, rebuilt_keys, h2d = self._rebuild_bytes(misses, self.r).mean(0).tolist()
        return Selection(indices=idx.unsqueeze(2), valid=valid.unsqueeze(2), keys=k.unsqueeze(2),
                         values=v.unsqueeze(2), forced_tokens=float(forced), metadata_bytes=landmarks + rebuild_metadata,
                         kv_bytes=2.0 * d * s * H * (forced + C * n_sel) + rebuilt_keys, h2d_bytes=h2d)

    # ----- static decode: a fixed number of chunks rebuilt and attended, the step's plan only on the device --------
    # Each row's layout is device state (static_params, baselines/shadowkv/kernels.py PARAMS) and the temporal buffer
    # has two slots per row (read (L + 1) % 2, write L % 2), so rows of different lengths and layouts stack in one
    # step. The step's keys and values are compacted: the outlier chunks' tokens, the selected chunks (best first),
    # the exact tail; row b attends its first count_b slots.

    row_state = ("candidates", "landmarks", "outlier_tokens", "positions", "U", "SV", "SV_rot", "rope_cos", "rope_sin",
                 "host_values", "s_chunks", "s_values", "s_hit_sum", "s_step_bytes", "static_params", "out_slots",
                 "n_top", "tail_slots", "static_ranked")

    def static_decode_error(self):
        return None

    def start_static(self, capacity):
        """Fixed shapes for every step up to `capacity` tokens: the first step's n_sel chunks (the most any step
        selects: n_sel only shrinks as tokens are generated), the longest exact tail, the temporal buffer's two
        slots (both holding the previous selection), and the row's layout on the device."""
        B, H = self.candidates.shape[:2]
        C, d = self.chunk_size, self.SV.shape[-1]
        ncand = self.num_candidates
        self.n_top = self._plan(1)[1]
        tail = self.window + capacity - self.prompt_len
        self.tail_slots = tail if self.budget_mode == "paper" else min(tail, self.budget - C * self.outliers)
        self.out_slots = C * self.outliers
        # paper mode selects min(budget // C, #candidates) chunks at every step: no ranking is needed when that is
        # every candidate; fair mode's n_sel shrinks, so it always ranks
        self.static_ranked = self.n_top < ncand or self.budget_mode == "fair"
        prev = self.buf_chunks
        n_prev = prev.shape[-1]
        self.s_chunks = prev.new_full((B, 2, H, self.n_top), -1)
        self.s_chunks[..., :n_prev] = prev.unsqueeze(1)
        if self.offload_values:
            self.s_values = self.buf_v.new_zeros(B, 2, H, self.n_top, C * d)
            self.s_values[:, :, :, :n_prev] = self.buf_v.reshape(B, 1, H, n_prev, C * d)
        else:
            self.s_values = self.host_values = None
        self.s_hit_sum = torch.zeros(B, dtype=torch.float64, device=prev.device)
        self.s_step_bytes = torch.zeros(B, 3, dtype=torch.float64, device=prev.device)
        self.s_hit_steps = 0
        self.static_params = torch.tensor([[self.prompt_len, self.window, self.outliers, ncand, self.r,
                                            self.num_chunks]], device=prev.device).repeat(B, 1)
        self.SV_rot = self.rope_cos = self.rope_sin = None
        # the kernel rotates with rot(S V) and cos/sin from the cache's KeyRotation; a context with a bare rotate
        # callable (bench/decode.py's own RoPE) runs the PyTorch step
        self.fused = self.info.backend == "triton" and (self.rotate is None or self.rotation is not None)
        if self.rotate is not None and self.fused:
            self.SV_rot = self.rotation.quarter_turn(self.SV, self.info.layer_idx)
            self.rope_cos, self.rope_sin = self.rotation.tables(self.positions, self.info.layer_idx, self.SV)
        self._host_view = self._host_of = None

    def _host_store(self) -> Tensor | None:
        """The host store as the step reads it (`device_view`), made again when the store is replaced (stacked)."""
        if not self.offload_values:
            return None
        if self._host_of is not self.host_values:
            self._host_view, self._host_of = device_view(self.host_values, self.device), self.host_values
        return self._host_view

    def _static_plan(self, length: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """`_plan` of each row at its device length: (first token of the exact tail, n_sel), [1 or B, 1, 1] each."""
        L = length.view(-1, 1, 1)
        P, W, O, ncand = (x.view(-1, 1, 1)[: L.shape[0]] for x in params[:, :4].unbind(-1))
        C = self.chunk_size
        if self.budget_mode == "paper":
            return P - W, ncand.clamp(max=self.budget // C)
        room = self.budget - C * O
        over = W + L - P > room
        n_sel = torch.div(room - W - (L - P), C, rounding_mode="floor").clamp(max=ncand)
        return torch.where(over, L - room, P - W), torch.where(over, torch.zeros_like(n_sel), n_sel)

    def select_static(self, query, keys, values, length):
        """The eager step in fixed shapes: the top n_top candidates by score (best first), the first n_sel(L) of
        them selected; every selected chunk's keys rebuilt from the factors, values of hits from the temporal buffer
        and of misses from the host store; the outlier chunks and the exact tail from the cache; all compacted
        (row b attends its first count_b slots). Rebuilt / fetched bytes, which depend on the hits, are counted on
        the device (Selection.device_bytes)."""
        C = self.chunk_size
        top = None
        if self.fused:
            from baselines.shadowkv.kernels import shadow_gather, shadow_scores
        if self.static_ranked:
            scores = (self._scores(query, self.static_params[:, 3]) if not self.fused else
                      shadow_scores(query, self.landmarks, self.static_params, self.scale))
            top = torch.topk(scores, self.n_top, dim=-1).indices
        slots = self.out_slots + C * self.n_top + self.tail_slots
        if self.fused:
            k, v, count = shadow_gather(
                keys, values, top, self.candidates, self.outlier_tokens, self.U, self.SV, self.SV_rot, self.rope_cos,
                self.rope_sin, self.s_chunks, self.s_values, self._host_store(), self.static_params, length,
                slots=slots, chunk_size=C, budget=self.budget, paper=self.budget_mode == "paper",
                elem_bytes=self.info.kv_element_bytes, step_bytes=self.s_step_bytes, hit_sum=self.s_hit_sum)
            return Selection(keys=k.unsqueeze(2), values=v.unsqueeze(2), key_count=count, attended_on_host=True,
                             device_bytes=self.s_step_bytes)
        return self._select_static_reference(top, keys, values, length, slots)

    def _select_static_reference(self, top, keys, values, length, slots):
        """`shadow_gather` in PyTorch (its oracle)."""
        B, H, cap, d = keys.shape
        C, NT = self.chunk_size, self.n_top
        L = length.view(-1, 1, 1)
        start, n_sel = self._static_plan(length, self.static_params)
        P, W, O, NC, R, _ = (x.view(-1, 1, 1)[: L.shape[0]] for x in self.static_params.unbind(-1))
        rank = top if top is not None else torch.arange(NT, device=keys.device).expand(B, H, NT)
        chunk = self.candidates.gather(-1, rank)  # [B, H, NT]
        chosen = torch.arange(NT, device=keys.device) < n_sel
        rows = torch.arange(B, device=keys.device)
        rd, wr = ((L + 1) % 2).view(-1).expand(B), (L % 2).view(-1).expand(B)
        prev = self.s_chunks[rows, rd]  # [B, H, NT]
        eq = (chunk.unsqueeze(-1) == prev.unsqueeze(-2)) & (prev >= 0).unsqueeze(-2)
        hit = eq.any(-1) & chosen
        hits = hit.sum((1, 2)).to(torch.float64)
        self.s_hit_sum.add_(torch.where(n_sel.view(-1) > 0, hits / (H * n_sel.view(-1)).clamp(min=1), 0.0))
        k_sel = self._reconstruct(chunk).view(B, H, NT * C, d)
        if not NT:  # nothing is ever selected: one zero row keeps the slot gathers below in range
            k_sel = k_sel.new_zeros(B, H, 1, d)
        if self.offload_values:
            v_hit = take_rows(self.s_values[rows, rd], eq.int().argmax(-1))
            v_miss = gather_missed_rows(self._host_store(), chunk, chosen & ~hit).to(values.device)
            v_sel = torch.where(hit[..., None], v_hit, v_miss)  # [B, H, NT, C*d]
            self.s_values[rows, wr] = v_sel
            rebuilt = (chosen & ~hit).sum(-1) * C
            v_sel = v_sel.view(B, H, NT * C, d)
        else:
            v_sel = take_rows(values, self._tokens(chunk))
            rebuilt = chosen.sum(-1).expand(B, H) * C
        self.s_chunks[rows, wr] = torch.where(chosen, chunk, -1)
        self.s_step_bytes.copy_(self._rebuild_bytes(rebuilt, R.view(-1)))

        if not NT:
            v_sel = v_sel.new_zeros(B, H, 1, d)
        s = torch.arange(slots, device=keys.device)
        n_out, n_chosen = C * O, C * n_sel
        count = n_out + n_chosen + L - start
        is_sel = (s >= n_out) & (s < n_out + n_chosen)
        exact = (s < n_out) | ((s >= n_out + n_chosen) & (s < count))
        tail = start + s - n_out - n_chosen
        if self.outlier_tokens.shape[-1]:
            out_tok = self.outlier_tokens.gather(-1, s.clamp(max=self.outlier_tokens.shape[-1] - 1).expand(B, H, -1))
            tail = torch.where(s < n_out, out_tok, tail)
        tok = tail.clamp(0, cap - 1).expand(B, H, slots)
        j = (s - n_out).clamp(0, max(NT * C - 1, 0)).expand(B, H, slots)  # slot -> rank j // C, token j % C
        k = torch.where(is_sel[..., None], take_rows(k_sel, j),
                        torch.where(exact[..., None], take_rows(keys, tok), 0))
        v = torch.where(is_sel[..., None], take_rows(v_sel, j),
                        torch.where(exact[..., None], take_rows(values, tok), 0))
        valid = (is_sel | exact).expand(B, H, slots)
        indices = torch.where(is_sel, self._tokens(chunk).gather(-1, j), torch.where(exact, tok, 0))
        return Selection(indices=indices.unsqueeze(2), valid=valid.unsqueeze(2), keys=k.unsqueeze(2),
                         values=v.unsqueeze(2), attended_on_host=True, device_bytes=self.s_step_bytes)

    def static_state(self):
        return [self.s_chunks, self.s_hit_sum, self.s_step_bytes] + ([self.s_values] if self.offload_values else [])

    def finish_static(self):
        if self.s_hit_steps:  # one entry for the static steps: their mean, weighted by their count in extra_metrics
            self.static_hits = (self.static_hits[0] + float(self.s_hit_sum.mean()),
                                self.static_hits[1] + self.s_hit_steps)
        self.s_hit_sum.zero_()
        self.s_hit_steps = 0

    def after_static_step(self, keys, values, length):
        if self._plan(length - self.prompt_len)[1]:
            self.s_hit_steps += 1

    def static_step_cost(self, length):
        """(forced, metadata, attended) of `select`'s accounting at `length`, without the parts that depend on the
        hits (select_static's device_bytes)."""
        _, n_sel, forced, landmarks = self._host_cost(length)
        return float(forced), landmarks, float(forced + self.chunk_size * n_sel)

    def extra_metrics(self) -> dict:
        if not self.prompt_len:
            return {}
        static_hits, static_steps = self.static_hits
        hits, steps = sum(self.hit_rates) + static_hits, len(self.hit_rates) + static_steps
        return {
            "chunk_hit_rate": hits / steps if steps else None,
            "effective_rank": float(self.r),
            "outlier_chunks": float(self.outliers),
            "local_window": float(self.window),
            "prefill_h2d_bytes": self.prefill_h2d_bytes,
        }
