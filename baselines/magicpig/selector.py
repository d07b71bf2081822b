"""MagicPIG (Chen et al. 2024, `docs/methods/magicpig.md`): attention over a random sample of the context, drawn by
locality-sensitive hashing and reweighted by each token's probability of being drawn.

After the dense prefill, each layer splits the prompt of n tokens into sink S = [0, s), local W = [n - w, n) and
middle M = [s, n - w). Per KV head j: the middle keys' mean a_j, centred keys k~ = k - a_j, and for every middle
token the codes of L SimHash tables of K bits each (R_j ~ N(0, 1), d x L x K):

    c_{j,i,t} = sum_{b<K} 2^b [k~_i . R_j[:, t, b] > 0]

At a decode step query head h (KV head j) hashes q / |q| alike and samples C_h = {i in M : c_{h,t} = c_{j,i,t} for at
least 2 of the L tables}. A sampled token is drawn with probability

    w_i = 1 - (1 - u_i)^L - L u_i (1 - u_i)^(L - 1),   u_i = (1 - theta_i / pi)^K,   cos theta_i = q . k~_i / (|q| |k~_i|)

and enters the softmax with logit q . k_i / sqrt(d) - ln(w_i + 1e-4): a self-normalised importance-sampling estimate
of the attention over M, next to the exact attention over S, W and every generated token (never hashed). Centring
shifts every logit of a head by q . a_j, which the softmax cancels, so the cached keys serve the logits. Layers 0 and
N/2 attend densely. It is an estimator, not a top-k: |C_h| varies by head and step. budget_mode=paper keeps the
paper's (K, L) = (10, 150); fair maps the budget to (K, L) on the prompt's own keys (`_hash_shape`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from locks.core.chunks import by_chunks
from locks.core.options import Options, integer, option
from locks.core.reference import grouped_logits
from locks.core.registry import register
from locks.core.selector import LayerInfo, Selection, Selector
from locks.errors import ConfigError

MAX_BITS = 15  # K at most: a code fits int16, as the official reference stores it
WEIGHT_FLOOR = 1e-4  # -ln(w + 1e-4): the official cap on a sampled token's up-weighting
HASH_CHUNK = 2048  # prompt tokens hashed per product at the prefill
HITS_CHUNK_BYTES = 64 << 20  # the most code comparisons (bytes) a decode step holds at once (`_hits`)


def layer_list(key, value):
    """A comma-separated list of layer indices, each an integer or N/2 (half the model's layers); "" or none: none."""
    items = [] if value in (None, "", "none") else [v.strip() for v in str(value).split(",")]
    for item in items:
        if item != "N/2" and not item.isdigit():
            raise ConfigError(f"{key} must list layer indices or N/2, separated by commas, e.g. '0,N/2' (got {value!r})")
    return ",".join(items)


@dataclass(frozen=True)
class MagicPIGOptions(Options):
    bits: int = option(10, integer(1))  # K: bits per hash table (budget_mode=paper; fair chooses K itself)
    tables: int = option(150, integer(2))  # L: hash tables (budget_mode=paper; fair chooses L <= this)
    sink: int = option(4, integer(0))  # first prompt tokens always attended
    local: int = option(64, integer(0))  # last prompt tokens always attended
    dense_layers: str = option("0,N/2", layer_list)  # layers attended densely (the official reference's 0 and N/2)
    seed: int = option(0, integer(0))  # the hash projections' seed

    def check(self) -> None:
        if self.bits > MAX_BITS:
            raise ConfigError(f"method.bits must be <= {MAX_BITS} (a code is stored in 16 bits; got {self.bits})")

    def check_budget(self, budget: int) -> None:
        if self.budget_mode == "fair" and budget <= self.sink + self.local:
            raise ConfigError(f"budget must exceed method.sink + method.local = {self.sink + self.local} tokens, which "
                              f"MagicPIG always attends (got {budget}; or budget_mode=paper)")

    def dense_layer(self, layer_idx: int, num_layers: int) -> bool:
        dense = {num_layers // 2 if item == "N/2" else int(item) for item in self.dense_layers.split(",") if item}
        return layer_idx in dense


def collision_probability(u: Tensor, tables) -> Tensor:
    """P[at least 2 of L tables collide] when one collides with probability u: 1 - (1-u)^L - L u (1-u)^(L-1)."""
    return 1 - (1 - u) ** tables - tables * u * (1 - u) ** (tables - 1)


def hash_projection(seed: int, layer_idx: int, kv_heads: int, head_dim: int, tables: int, device) -> Tensor:
    """R [Hkv, d, L, MAX_BITS] fp32: one N(0, 1) draw per block of 16 layers and KV head, from a generator seeded
    with (seed, block, head) and drawn table by table, so a run with fewer tables or bits sees a prefix of it."""
    block = layer_idx // 16
    heads = []
    for j in range(kv_heads):
        generator = torch.Generator().manual_seed(hash((seed, block, j)) % 2**63)
        heads.append(torch.randn(tables, MAX_BITS, head_dim, generator=generator).permute(2, 0, 1))
    return torch.stack(heads).to(device)


@register
class MagicPIGSelector(Selector):
    name = "magicpig"
    display_name = "MagicPIG"
    report_order = 10
    plot_style = {"marker": "h"}
    row_state = ("codes", "norms", "mean", "middle", "hash_shape", "sampled")
    Options = MagicPIGOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        self.R: Tensor | None = None  # [Hkv, d, L, MAX_BITS], built at the prefill unless given
        self.codes: Tensor | None = None  # [B, Hkv, n, L] int16 middle tokens' codes (-1: a table past the row's L)
        self.norms: Tensor | None = None  # [B, Hkv, n] fp32 |k~_i|
        self.mean: Tensor | None = None  # [B, Hkv, d] fp32 a_j
        self.middle: Tensor | None = None  # [B, 2] int64: the middle [start, end) (empty: every token exact)
        self.hash_shape: Tensor | None = None  # [B, 2] fp32: the row's (K, L)
        self.sampled: Tensor | None = None  # [B, 3] fp64: sampled tokens summed over steps and query heads, heads, most
        self.folded: list[float] | None = None
        self.middle_tokens = 0
        self.shape_used = (self.bits, self.tables)
        self.fused = info.backend == "triton"  # the static step in three launches (kernels.py), imported only then
        self.count_dtype = torch.uint8 if self.tables < 256 else torch.int16  # tables that collide, counted

    # ----- the prefill: codes of the middle, (K, L) of the budget -------------------------------------------------

    def prefill_queries(self) -> int | None:
        return 1 if self.budget_mode == "fair" else 0

    def prefill(self, ctx) -> None:
        keys = ctx.keys.float()
        B, Hkv, n, d = keys.shape
        start, end = self.sink, max(self.sink, n - self.local)
        if self.R is None:
            self.R = hash_projection(self.seed, self.info.layer_idx, Hkv, d, self.tables, keys.device)
        self.mean = keys[:, :, start:end].mean(2) if end > start else keys.new_zeros(B, Hkv, d)
        centred = keys - self.mean.unsqueeze(2)
        self.norms = centred.norm(dim=-1)
        shapes = [self._hash_shape(centred[b], ctx.queries[b, :, -1] if ctx.queries.shape[2] else None, start, end)
                  for b in range(B)]
        self.shape_used = shapes[0][:2]
        self.middle = torch.tensor([[start, end if keep else start] for _, _, keep in shapes], device=keys.device)
        self.hash_shape = torch.tensor([s[:2] for s in shapes], dtype=torch.float32, device=keys.device)
        # every bit of every table, once per sample for the runs of a group (the same R: seed, tables)
        pattern = ctx.shared(("magicpig.pattern", self.seed, self.tables), lambda: torch.cat(
            [self._pattern(centred[:, :, i : i + HASH_CHUNK]) for i in range(0, n, HASH_CHUNK)], dim=2))
        self.codes = self._codes(pattern, self.hash_shape, -1)
        self.sampled = torch.zeros(B, 3, dtype=torch.float64, device=keys.device)
        self.middle_tokens = int(self.middle[0, 1] - self.middle[0, 0])

    def _pattern(self, x: Tensor) -> Tensor:
        """x [B, H, n, d] (centred keys of KV head h, or unit queries grouped by KV head) -> [B, H, n, L] int16: the
        MAX_BITS bits of each table, bit b = [x . R[:, t, b] > 0], summed in fp64 from exact fp32 products (as the
        fused kernel): a code of K bits is its low K bits."""
        B, H, n, d = x.shape
        T = self.R.shape[2]
        proj = torch.einsum("bhnd,hdc->bhnc", x.double(), self.R.flatten(2).double()).view(B, H, n, T, MAX_BITS)
        powers = 2.0 ** torch.arange(MAX_BITS, device=x.device)
        return ((proj > 0).to(torch.float32) @ powers).to(torch.int16)

    @staticmethod
    def _codes(pattern: Tensor, hash_shape: Tensor, unused: int) -> Tensor:
        """Each row's codes under its (K, L): the low K bits of each table, `unused` for the tables past L (the keys'
        -1, the queries' -2: they never collide)."""
        B, T = pattern.shape[0], pattern.shape[-1]
        K, L = hash_shape[:, 0].view(B, 1, 1, 1), hash_shape[:, 1].view(B, 1, 1, 1)
        low = (2 ** K.to(torch.int32) - 1).to(torch.int16)
        return (pattern & low).masked_fill(torch.arange(T, device=pattern.device) >= L, unused)

    def _hash_shape(self, centred: Tensor, query: Tensor | None, start: int, end: int) -> tuple[int, int, bool]:
        """One row's (K, L, whether the middle is sampled). paper: the options' (K, L). fair: m = budget - sink -
        local middle tokens are the target; with E(K, L) = mean over query heads of sum_{i in M} P[>= 2 of L] for
        the prompt's last query, K is the largest K <= MAX_BITS with E(K, L_max) >= m (1 if none), then L the
        smallest L <= L_max with E(K, L) >= m. A middle of at most m tokens is attended whole."""
        if self.budget_mode == "paper":
            return self.bits, self.tables, end > start
        target = self.budget - self.sink - self.local
        if end - start <= target:
            return self.bits, self.tables, False
        G = self.info.group_size
        k = centred[:, start:end].double().repeat_interleave(G, dim=0)  # [Hq, |M|, d]
        q = query.double().unsqueeze(1)
        cos = ((q * k).sum(-1) / (q.norm(dim=-1) * k.norm(dim=-1))).clamp(-1, 1)
        log_angle = torch.log1p(-torch.arccos(cos) / math.pi)  # ln(1 - theta / pi)

        def expected(bits: int, tables: int) -> float:
            return float(collision_probability(torch.exp(bits * log_angle), tables).sum(-1).mean())

        bits = next((b for b in range(MAX_BITS, 0, -1) if expected(b, self.tables) >= target), 1)
        low, high = 2, self.tables  # the smallest L with E >= target (high when none)
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if expected(bits, mid) >= target else (mid + 1, high)
        return bits, high, True

    # ----- one rule for eager and static steps ----------------------------------------------------------------------

    def _rule(self, query: Tensor, keys: Tensor, length: Tensor, slots: int) -> tuple[Tensor, Tensor]:
        """-> (valid, logit bias), [B, Hkv, G, slots]: every slot below the row's length but the unsampled middle,
        the sampled tokens' -ln(w + 1e-4); the sampled counts added to `sampled`."""
        B, Hq, d = query.shape
        Hkv, G = self.info.num_kv_heads, self.info.group_size
        n = self.codes.shape[2]
        q = query.float().view(B, Hkv, G, d)
        q_norm = q.norm(dim=-1, keepdim=True)
        query_codes = self._codes(self._pattern(q / q_norm), self.hash_shape, -2).unsqueeze(3)
        hits = self._hits(query_codes)
        slot = torch.arange(n, device=q.device)
        start, end = self.middle[:, :1].view(B, 1, 1, 1), self.middle[:, 1:].view(B, 1, 1, 1)
        middle = (slot >= start) & (slot < end)
        sampled = middle & (hits >= 2)
        centred_logit = grouped_logits(query, keys[:, :, :n]) - (q * self.mean.unsqueeze(2)).sum(-1, keepdim=True)
        cos = (centred_logit / (q_norm * self.norms.unsqueeze(2))).clamp(-1, 1)
        K, L = self.hash_shape[:, 0].view(B, 1, 1, 1), self.hash_shape[:, 1].view(B, 1, 1, 1)
        w = collision_probability((1 - torch.arccos(cos) / math.pi) ** K, L)
        bias = torch.where(sampled, -torch.log(w + WEIGHT_FLOOR), 0.0)
        valid = torch.cat([~middle | sampled, middle.new_ones(B, Hkv, G, slots - n)], dim=-1)
        valid = valid & (torch.arange(slots, device=q.device) < length.view(-1, 1, 1, 1))
        bias = torch.cat([bias, bias.new_zeros(B, Hkv, G, slots - n)], dim=-1)
        counts = sampled.sum(-1).flatten(1).to(torch.float64)  # [B, Hq]
        self.sampled[:, 0] += counts.sum(-1)
        self.sampled[:, 1] += Hq
        self.sampled[:, 2] = torch.maximum(self.sampled[:, 2], counts.amax(-1))
        return valid, bias

    def _hits(self, query_codes: Tensor) -> Tensor:
        """Per query head and prompt token, the tables whose code equals the query's, [B, Hkv, G, n]: the code
        comparisons (one byte per token, head and table; 300 MiB a step at 64K tokens at once) made HITS_CHUNK_BYTES
        at a time."""
        B, Hkv, G = query_codes.shape[:3]
        n, tables = self.codes.shape[2], self.codes.shape[-1]
        step = max(1, HITS_CHUNK_BYTES // (B * Hkv * G * tables))
        return by_chunks(n, step, lambda chunk: (self.codes[:, :, chunk].unsqueeze(2) == query_codes)
                         .view(torch.uint8).sum(-1, dtype=self.count_dtype))

    def _selection(self, query: Tensor, keys: Tensor, length: Tensor, slots: int) -> Selection:
        B, Hkv, G = query.shape[0], self.info.num_kv_heads, self.info.group_size
        valid, bias = self._rule(query, keys, length, slots)
        tokens = torch.arange(slots, device=keys.device).expand(B, Hkv, G, slots)
        return Selection(indices=tokens, valid=valid, logit_bias=bias, all_slots=True)

    def _forced(self, length: int) -> float:
        """The tokens attended exactly: sink, local window and every generated token."""
        return float(length - self.middle_tokens)

    def _metadata_bytes(self) -> float:
        """Per KV head: every middle token's L int16 codes and fp32 |k~| (the masked form the harness runs), and the
        query's projection R (d K L, bf16 as the official code holds it)."""
        if not self.middle_tokens:
            return 0.0
        K, L = self.shape_used
        return float(self.info.num_kv_heads * (self.middle_tokens * (2 * L + 4) + 2 * self.info.head_dim * K * L))

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        L = keys.shape[2]
        if not self.middle_tokens:
            return Selection.all_tokens()
        sel = self._selection(query, keys, torch.tensor([L], device=keys.device), L)
        sel.forced_tokens, sel.metadata_bytes = self._forced(L), self._metadata_bytes()
        return sel

    def extra_metrics(self) -> dict:
        """magicpig_sampled: middle tokens a query head sampled per step (mean); magicpig_sampled_max: the most;
        magicpig_bits / magicpig_tables: the (K, L) the budget mapped to."""
        if self.sampled is None:
            return {}
        total, heads, most = self.folded or self.sampled[0].tolist()
        out = {"magicpig_bits": float(self.shape_used[0]), "magicpig_tables": float(self.shape_used[1])}
        return {**out, "magicpig_sampled": total / heads, "magicpig_sampled_max": most} if heads else out

    # ----- memory ------------------------------------------------------------------------------------------------------

    def _middle(self, length: int) -> int:
        return max(0, length - self.sink - self.local)

    def memory_bytes(self, length: int) -> dict[str, float]:
        """The masked form (the official RULER evaluation's, and the harness's) after a prompt of `length` tokens, at
        the options' (K, L): the whole K/V on the device, and as state every middle token's L int16 codes and fp32
        |k~|, R (bf16, d K L per KV head) and the key means."""
        H, d, M = self.info.num_kv_heads, self.info.head_dim, self._middle(length)
        state = H * (M * (2 * self.tables + 4) + 2 * d * self.bits * self.tables + 2 * d) if M else 0.0
        return {**super().memory_bytes(length), "state": float(state)}

    def harness_bytes(self, length: int) -> float:
        """Beyond the design's state: codes and norms for every prompt slot (the sink and window's unused), R in
        fp32 at MAX_BITS bits, the means in fp32."""
        H, d, L = self.info.num_kv_heads, self.info.head_dim, self.tables
        held = H * (length * (2 * L + 4) + 4 * d * L * MAX_BITS + 4 * d)
        return float(held - self.memory_bytes(length)["state"])

    def prefill_bytes(self, length: int) -> float:
        """The centred keys (fp32) and one chunk's hashing (`_pattern`): its keys in fp64, the projections in fp64,
        their signs (bool) and the signs as fp32 bits, per token, table and bit."""
        H, d = self.info.num_kv_heads, self.info.head_dim
        chunk = min(length, HASH_CHUNK)
        return float(H * (4 * length * d + chunk * (8 * d + self.tables * MAX_BITS * (8 + 1 + 4))))

    # ----- static decode: the same rule over every preallocated slot ---------------------------------------------

    def static_decode_error(self):
        return None

    def select_static(self, query, keys, values, length):
        """The eager rule over every preallocated slot. Backend triton: sampling, weights and attention in one
        split-K pass (kernels.py), three launches, which count the attended tokens and the samples too."""
        if not self.fused:
            return self._selection(query, keys, length, keys.shape[2])
        from baselines.magicpig.kernels import magicpig_static_attention

        out, lse, attended = magicpig_static_attention(query, keys, values, self.R, self.codes, self.norms, self.mean,
                                                       self.middle, self.hash_shape, self.sampled, length,
                                                       self.info.scaling)
        return Selection(attention=(out, lse), attended_rows=attended)

    def static_state(self):
        return [self.sampled]

    def finish_static(self):
        self.folded = self.sampled[0].tolist()

    def static_step_cost(self, length):
        return self._forced(length) if self.middle_tokens else 0.0, self._metadata_bytes(), None
