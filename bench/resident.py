"""The process's resident memory, as the memory benchmarks measure it (scripts/rehearse_scale.py,
tests/eval/prefill_peak.py): what it holds now and the most it has held (Linux)."""
from __future__ import annotations

import resource


def resident_bytes() -> int:
    """Resident memory now (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes() -> int:
    """The most resident memory this process has held (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
