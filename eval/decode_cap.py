"""`benchmark.decode_cap`, one rule for every benchmark: stop greedy decoding after that many generated tokens. The
prompt is the benchmark's own, unchanged (still sized for the task's tokens to generate), so a capped prediction is
the first tokens of the uncapped one and a cap never raises a score (docs/benchmarks/README.md, decode_cap)."""
from __future__ import annotations

from locks.errors import ConfigError


def read_decode_cap(cfg) -> int | None:
    """The cap of the benchmark's config group: a positive number of tokens, or None (each task's own budget)."""
    cap = cfg.get("decode_cap")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
        raise ConfigError(f"benchmark.decode_cap must be a positive number of tokens or null (got {cap!r})")
    return cap


def capped(sample: dict, cap: int | None) -> dict:
    """The sample with max_new_tokens = min(its own, cap); the sample itself when there is no cap."""
    if cap is None:
        return sample
    return {**sample, "max_new_tokens": min(int(sample["max_new_tokens"]), cap)}
