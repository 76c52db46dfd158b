"""ZeroGPU Spaces: the app's model work runs inside `@spaces.GPU`; elsewhere nothing changes.

On ZeroGPU (the `SPACES_ZERO_GPU` variable is set) a GPU is attached only while a decorated
function runs, for at most its `duration` seconds, and torch.compile is not available (only
ahead-of-time compilation). So there the engine runs the "graphed" path (FAST): static caches,
and each fixed-shape step (the target's 1 and k + 1 tokens, the draft's 1 and 2) captured as a
CUDA graph directly, without a compiler, on its first use in the call (0.1-0.5 s a shape on the
H200 run; a target pass 5.2 ms against eager's 16-24 ms, docs/benchmarks.md). Graphs and caches
are dropped at the start of every call (lm.forget_graphs): spaces keeps a worker process per
decorated function and GPU, so a worker can serve call after call, and a graph captured in an
earlier one may point at memory that call gave back. The app decorates each of its GPU jobs
once, at start-up (a function decorated per call would fork a worker per call, and spaces keeps
every one), passes a job's settings as arguments and derives its duration from them. app.py
imports spaces before anything else when `SPACES_ZERO_GPU` is set: spaces refuses to load after
CUDA is initialised, and patches torch so that models can be loaded and moved to "cuda" at
start-up in the main process (the way ZeroGPU requires). Off ZeroGPU, and on CPU, `gpu(...)`
returns the function unchanged.
"""

from __future__ import annotations

import functools
import inspect
import math
import os

FAST = "graphed"  # no torch.compile on ZeroGPU: static caches, steps captured as CUDA graphs directly
SETUP_SECONDS = 20  # first-call CUDA set-up, the speculative run's prefill and its captures
SECONDS_PER_TOKEN = 0.1  # eager 1.5B target on a ZeroGPU slice: ~40 tok/s alone, with margin
MAX_SECONDS = 300  # = the default job time limit (SPECVIZ_MAX_JOB_SECONDS)


def active() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def duration(tokens: int, runs: int = 2) -> int:
    """Seconds of GPU to ask for: `runs` generations of `tokens` tokens (a run and its baseline),
    from SETUP_SECONDS to MAX_SECONDS whatever the counts (clamped before any float arithmetic)."""
    tokens = max(0, min(tokens, math.ceil(MAX_SECONDS / SECONDS_PER_TOKEN)))
    return int(min(MAX_SECONDS, SETUP_SECONDS + SECONDS_PER_TOKEN * tokens * runs))


def gpu(seconds):
    """Decorator: run the function on a ZeroGPU GPU for up to `seconds` (a number, or a function
    of the call's arguments that gives it, as spaces.GPU takes); a no-op elsewhere. Decorate once:
    spaces keeps a worker process per decorated function."""
    if not active():
        return lambda fn: fn
    import spaces  # only on Spaces: the package is a no-op elsewhere, but not needed there

    return lambda fn: spaces.GPU(duration=seconds)(fresh_graphs(fn))


def fresh_graphs(fn):
    """fn, dropping every captured graph and static cache first (lm.forget_graphs); a generator
    function stays one (spaces.GPU streams those)."""
    from .lm import forget_graphs

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            forget_graphs()
            yield from fn(*args, **kwargs)
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        forget_graphs()
        return fn(*args, **kwargs)
    return call
