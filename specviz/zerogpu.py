"""ZeroGPU Spaces: the app's model work runs inside `@spaces.GPU`; elsewhere nothing changes.

On ZeroGPU (the `SPACES_ZERO_GPU` variable is set) a GPU is attached only while a decorated
function runs, for at most its `duration` seconds, and torch.compile is not available (only
ahead-of-time compilation). So there the engine runs the "graphed" path (FAST): static caches,
and each fixed-shape step (the target's 1 and k + 1 tokens, the draft's 1 and 2) captured as a
CUDA graph directly, without a compiler, on its first use in the call (0.1-0.5 s a shape on the
H200 run; a target pass 5.2 ms against eager's 16-24 ms, docs/benchmarks.md). Graphs and caches
are dropped at the start of every call (fastpath.forget_graphs): spaces keeps a worker process per
decorated function and GPU, so a worker can serve call after call, and a graph captured in an
earlier one may point at memory that call gave back. The app decorates one function for all of its
GPU jobs, once, at start-up (a function decorated per call would fork a worker per call, and
spaces keeps every one; a function per job kind would give each kind a worker and a model store
of its own), passes a job's settings as arguments and derives its duration from them. app.py
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
import threading
import weakref

FAST = "graphed"  # no torch.compile on ZeroGPU: static caches, steps captured as CUDA graphs directly
SETUP_SECONDS = 20  # first-call CUDA set-up, the speculative run's prefill and its captures
SECONDS_PER_TOKEN = 0.1  # eager 1.5B target on a ZeroGPU slice: ~40 tok/s alone, with margin
MAX_SECONDS = 300  # = the default job time limit (SPECVIZ_MAX_JOB_SECONDS)
LOAD_SECONDS = 60  # a job that may load another pair or dtype in its worker first (from the disk:
# the app's process downloads a pair's files before the job asks for GPU time, app.fetched)
LAB_SECONDS = 30  # the Exactness lab: a round's context read (a pass a model) and its sampling
GRACE_SECONDS = 10  # of a call's GPU time, left to the worker's CUDA set-up before a job's clock
# The default bound on new tokens here: a tree run (and its baseline and chain) of 192 tokens asks
# int(20 + 0.1 * 192 * 3) = 77 s, which spaces scales by the GPU's duration factor (1.5 on the RTX
# Pro 6000 entry of spaces 0.51) to 116 s: within the 120 s a day ZeroGPU grants a visitor who is
# not signed in (a call asking more than the visitor has left is refused, whatever it would use).
# A job that may load another pair or dtype first asks LOAD_SECONDS more, and the end-to-end
# check (samples of min(k, 4) + 1 tokens) at its default 50 samples and k = 4 70 s (105 s scaled),
# at 200 samples 220 s: those need a visitor who is signed in.
MAX_NEW_TOKENS = 192


def active() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def duration(tokens: int, runs: int = 2, load: bool = False) -> int:
    """Seconds of GPU to ask for: `runs` generations of `tokens` tokens (a run and its baseline),
    LOAD_SECONDS more where the job may load its pair first (load), from SETUP_SECONDS to
    MAX_SECONDS whatever the counts (clamped before any float arithmetic)."""
    tokens = max(0, min(tokens, math.ceil(MAX_SECONDS / SECONDS_PER_TOKEN)))
    return int(min(MAX_SECONDS, SETUP_SECONDS + SECONDS_PER_TOKEN * tokens * runs + LOAD_SECONDS * load))


def job_seconds(asked: int) -> float:
    """How long a job may run inside a call that asked for `asked` seconds of GPU: a call past its
    duration is aborted with all it made, while a job past its own deadline stops with a status
    and what it made (service.run_views, continuations)."""
    return max(5.0, asked - GRACE_SECONDS)


def gpu(seconds):
    """Decorator: run the function on a ZeroGPU GPU for up to `seconds` (a number, or a function
    of the call's arguments that gives it, as spaces.GPU takes); a no-op elsewhere. Decorate once:
    spaces keeps a worker process per decorated function."""
    if not active():
        return lambda fn: fn
    import spaces  # only on Spaces: the package is a no-op elsewhere, but not needed there

    return lambda fn: spaces.GPU(duration=seconds)(fresh_graphs(fn))


def renew_lock_after_fork(owner, name: str = "_lock") -> None:
    """Give a forked child a fresh lock in owner.<name> (an object, or a module's globals() dict):
    spaces forks its GPU workers from the app's process while other threads run, and a lock one
    of them held at that moment stays held in the child for ever (its next load or hub probe
    waits until the job's GPU time runs out). The owner is held weakly."""
    if not hasattr(os, "register_at_fork"):
        return
    if isinstance(owner, dict):
        os.register_at_fork(after_in_child=lambda: owner.__setitem__(name, threading.Lock()))
        return
    ref = weakref.ref(owner)

    def renew() -> None:
        if (held := ref()) is not None:
            setattr(held, name, threading.Lock())

    os.register_at_fork(after_in_child=renew)


def fresh_graphs(fn):
    """fn, dropping every captured graph and static cache first (fastpath.forget_graphs); a generator
    function stays one (spaces.GPU streams those)."""
    from .fastpath import forget_graphs

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
