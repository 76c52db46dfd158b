"""ZeroGPU Spaces: the app's model work runs inside `@spaces.GPU`; elsewhere nothing changes.

On ZeroGPU (the `SPACES_ZERO_GPU` variable is set) a GPU is attached only while a decorated
function runs, for at most its `duration` seconds, and torch.compile is not available (only
ahead-of-time compilation). So there the engine runs the static-cache path with eager forwards
(FAST), models are loaded and moved to "cuda" at start-up in the main process (the way ZeroGPU
requires), and each job asks for a duration derived from the tokens it will generate. Off
ZeroGPU, and on CPU, `gpu(...)` returns the function unchanged.
"""

from __future__ import annotations

import os

FAST = "static"  # no torch.compile on ZeroGPU: static caches, eager forwards
SETUP_SECONDS = 20  # first-call CUDA set-up and the speculative run's prefill
SECONDS_PER_TOKEN = 0.1  # eager 1.5B target on a ZeroGPU slice: ~40 tok/s alone, with margin
MAX_SECONDS = 300  # = the default job time limit (SPECVIZ_MAX_JOB_SECONDS)


def active() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def duration(tokens: int, runs: int = 2) -> int:
    """Seconds of GPU to ask for: `runs` generations of `tokens` tokens (a run and its baseline)."""
    return int(min(MAX_SECONDS, SETUP_SECONDS + SECONDS_PER_TOKEN * tokens * runs))


def gpu(seconds: int):
    """Decorator: run the function on a ZeroGPU GPU for up to `seconds`; a no-op elsewhere."""
    if not active():
        return lambda fn: fn
    import spaces  # only on Spaces: the package is a no-op elsewhere, but not needed there

    return spaces.GPU(duration=seconds)
