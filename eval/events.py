"""A machine-readable log of what a run does (model loads, sample generation, prefills, jobs), for the sweep
benchmark (scripts/bench_sweep.py): one JSON line per event appended to the file named by $LOCKS_EVENTS; nothing
when it is unset."""
from __future__ import annotations

import contextlib
import json
import os
import time

ENV = "LOCKS_EVENTS"


def record(event: str, **fields) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), "time": time.time(), **fields}) + "\n")


@contextlib.contextmanager
def timed(event: str, **fields):
    """Record `event` with its wall time in seconds when the block ends."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record(event, seconds=round(time.perf_counter() - start, 4), **fields)


_STARTED = []


def record_startup() -> None:
    """Once per process: the wall seconds from the process's start to here (the interpreter and the imports)."""
    if not _STARTED:
        _STARTED.append(True)
        record("startup", seconds=seconds_since_process_start())


def seconds_since_process_start() -> float | None:
    """Wall seconds since this process started (psutil, a wandb dependency; None without it)."""
    try:
        import psutil
    except ImportError:
        return None
    return round(time.time() - psutil.Process(os.getpid()).create_time(), 3)
