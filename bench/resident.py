"""The process's resident memory, as the memory benchmarks measure it (scripts/rehearse_scale.py,
tests/eval/prefill_peak.py, scripts/step_memory.py): what it holds now and the most it has held (Linux)."""
from __future__ import annotations

import resource


def resident_bytes() -> int:
    """Resident memory now (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes() -> int:
    """The most resident memory this process has held (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> None:
    """Start the peak of `peak_since_reset` anew (/proc/self/clear_refs, Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_since_reset() -> int:
    """The most resident memory since the last `reset_peak` (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
