"""The model store: one loaded pair at a time, loaded under a lock within a share of the server's
time (ModelStore), the target-alone and chain runs kept for reuse (Baselines), the warm-up a load
ends with, and what names a loaded pair in a trace (pair_models, made_here).

service.py's views run on what it holds; the app makes one for the process (app.main).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import replace

from . import presets, zerogpu
from .engine import RoundEvent, generate, warm_steps
from .fastpath import resolve_fast
from .loading import (
    Pair,
    check_download,
    check_source,
    default_device,
    fetch_apart,
    load_pair,
    needs_fetch,
    parse_dtype,
)
from .settings import CUSTOM, RunSettings, clip, public_message
from .trace import Trace

RELOAD_SHARE = 0.2  # a public server's time, at most, spent switching to another pair or dtype
SWITCH_WINDOW = 600.0  # seconds over which that share is counted
LOAD_POLL_SECONDS = 1.0  # a job waiting on a load yields this often, so that Stop acts at once


class ModelStore:
    """Holds one loaded pair at a time (memory), keyed by what was asked; loads under a lock.

    Every visitor waits while it loads (12 s for the embedded pair in bf16, 22 s in float32 on a
    2-core CPU), so with switch_share set (the app: RELOAD_SHARE, off ZeroGPU) the server switches to another
    pair only while its load attempts of the last SWITCH_WINDOW seconds, failed ones included,
    took at most that share of them: two sessions alternating dtypes made every job pay a reload.
    Until then, asking for another pair is a ValueError that names the loaded one and the wait.
    With nothing loaded (a load failed) the next one loads at once, and counts. So does a switch
    back to `home` (the key of the deployment's own pair, where the app sets it): one visitor
    spending the budget on a pair of theirs left everyone else refused the page's pair for up to
    the whole window."""

    def __init__(self, extra_pairs: dict[str, tuple[str, str | None]] | None = None,
                 device: str | None = None, fast: str | None = None, warm: bool = True,
                 switch_share: float | None = None, keep_home: bool = False,
                 max_download: float | None = None):
        self.extra_pairs = dict(extra_pairs or {})  # operator pairs from the command line
        self.device = device
        self.fast = fast  # the engine's fast path for every pair (None: the pair's own "auto")
        self.warm = warm  # warm a loaded pair up with a short run (not where no GPU is attached yet)
        self._lock = threading.Lock()
        self._loaders: set[threading.Thread] = set()  # load threads started (a forked child's: not alive)
        zerogpu.renew_lock_after_fork(self)  # a ZeroGPU worker forked while a request held it
        self._key: tuple | None = None
        self._pair: Pair | None = None
        self._loads: deque[tuple[float, float]] = deque()  # load attempts: (ended, seconds)
        self.switch_share = switch_share
        self.max_download = max_download  # bytes a model typed in may download (None: no bound)
        self.home: tuple | None = None  # key() of the deployment's own pair: never refused
        # ZeroGPU: the pair placed at start-up stays on the GPU in every worker whatever the store
        # drops (spaces' tensor packs hold its tensors), so a switch back to it needs no load
        self.keep_home, self._home_pair = keep_home, None
        self.baselines = Baselines()
        self.chains = Baselines()  # a tree run's comparison: the chain drafter at the same k
        self._fetches: dict[str, tuple[threading.Thread, dict]] = {}  # hub id: (its download, out)
        self._failed: dict[str, tuple[float, str]] = {}  # hub id: (when its download failed, why)
        self._fetch_lock = threading.Lock()
        zerogpu.renew_lock_after_fork(self, "_fetch_lock")

    @property
    def known_pairs(self) -> set[str]:
        return set(presets.BY_KEY) | set(self.extra_pairs)

    def key(self, s: RunSettings) -> tuple:
        """What decides the loaded models: the pair and the dtype they load in ("auto" resolved:
        asking for bfloat16 where auto means it must not reload the same pair)."""
        names = (s.target.strip(), s.draft.strip() or None) if s.pair == CUSTOM else (s.pair,)
        dtype = parse_dtype(None if s.dtype == "auto" else s.dtype, self.device or default_device())
        return (s.pair, *names, str(dtype).removeprefix("torch."))

    def load_under_way(self) -> bool:
        """A load holds the store's lock (a stopped job's goes on to its end: loading), or a job's
        load thread has started and not yet ended (before it takes the lock)."""
        return self._lock.locked() or any(t.is_alive() for t in list(self._loaders))

    def is_loaded(self, s: RunSettings) -> bool:
        return self._key == self.key(s)

    def current(self) -> Pair | None:
        """The pair loaded now, if any."""
        return self._pair

    def loading_seconds(self) -> float:
        """Seconds the load attempts of the last SWITCH_WINDOW took."""
        while self._loads and self._loads[0][0] <= time.monotonic() - SWITCH_WINDOW:
            self._loads.popleft()
        return sum(seconds for _, seconds in self._loads)

    def switch_wait(self, s: RunSettings) -> float:
        """Seconds until a pair other than the loaded one may load (0: now, or s is loaded)."""
        if self._key is None or not self.switch_share or self.key(s) in (self._key, self.home):
            return 0.0
        used, allowed, wait = self.loading_seconds(), self.switch_share * SWITCH_WINDOW, 0.0
        for ended, seconds in self._loads:  # oldest first: they leave the window in turn
            if used <= allowed:
                break
            used, wait = used - seconds, ended + SWITCH_WINDOW - time.monotonic()
        return max(0.0, wait)

    def get(self, s: RunSettings, stopped: threading.Event | None = None) -> Pair | None:
        """The pair s asks for, loaded first where another is (under the store's lock: one load
        at a time). stopped: the job that asked was stopped (loading); set before the lock came
        to this call, nothing loads, and the pair loaded now (if any) is returned."""
        with self._lock:
            if stopped is not None and stopped.is_set():
                return self._pair
            wait = self.switch_wait(s)
            if wait > 0:
                loaded = " ".join(str(part) for part in self._key[1:] if part)
                raise ValueError(
                    f"the server spent {self.loading_seconds():.0f} s of the last "
                    f"{SWITCH_WINDOW / 60:.0f} minutes loading models, and spends at most "
                    f"{self.switch_share:.0%} of its time switching pairs or dtypes (every visitor "
                    f"waits while one loads): run on the loaded pair ({clip(loaded)}), or try again "
                    f"in {math.ceil(wait)} s")
            if self._key != self.key(s) and self.key(s) == self.home and self._home_pair is not None:
                self._pair, self._key = self._home_pair, self.home  # kept (keep_home): no load
            if self._key != self.key(s):
                if s.pair == CUSTOM:  # a mistyped name or path fails here, the loaded pair kept
                    for name in filter(None, (s.target.strip(), s.draft.strip())):
                        check_source(name)
                        check_download(name, self.max_download)  # and one too large to download
                self._pair = self._key = None  # free the old pair before loading the next
                started = time.monotonic()
                try:
                    self._load(s)
                finally:  # a load that failed took the old pair out too: it counts
                    self._loads.append((time.monotonic(), time.monotonic() - started))
            return self._pair

    def model_names(self, s: RunSettings) -> tuple[str, ...]:
        """What s's pair loads from: its target's and draft's names (hub ids, folders or .gguf
        files); none for the embedded pair."""
        if s.pair == CUSTOM:
            return tuple(filter(None, (s.target.strip(), s.draft.strip())))
        if s.pair in self.extra_pairs:
            return tuple(filter(None, self.extra_pairs[s.pair]))
        return presets.get(s.pair).models

    def fetching(self, s: RunSettings, waiting, poll: float = LOAD_POLL_SECONDS):
        """Download what s's pair loads from the hub and is not cached (loading.fetch_apart), from a
        job's generator, yielding waiting(text) at once and every `poll` seconds until done; a
        download's error raised. One download at a time in this process, in a thread of its own:
        a job asking for a model under way joins it, and one asking for another model waits for
        it to end. ZeroGPU: the app fetches before a job asks for GPU time, which a download
        inside it spent (60 s asked for a load, and a large preset's first download outlasted
        that). Stop lets go at once; a download under way goes on to its end, and holds the next
        one back meanwhile (Stop, then Run on another pair, started a download each)."""
        begun = time.monotonic()
        for name in self.model_names(s):
            if s.pair == CUSTOM:
                check_download(name, self.max_download)
            while (under_way := self._fetch_of(name)) is not None:
                ahead, thread, out = under_way  # ahead: the model downloading before this one
                text = FETCHING if ahead is None else FETCH_WAIT
                while thread.is_alive():
                    yield waiting(text.format(name=clip(name), seconds=time.monotonic() - begun))
                    thread.join(poll)
                if ahead is None:
                    if "error" in out:  # a fresh error a job: one object raised in each grew its traceback
                        raise ValueError(str(out["error"]))
                    break

    def _fetch_of(self, name: str) -> tuple[str | None, threading.Thread, dict] | None:
        """(None, the download of name, its out), started where none is under way and no other
        is; (the other model, its download, out) where another is under way; None where name
        needs no download. ValueError, its message, within FETCH_RETRY_SECONDS of a failed one."""
        with self._fetch_lock:
            for n, (thread, out) in list(self._fetches.items()):
                if not thread.is_alive():  # ended: a failure is kept a while (each try is a process)
                    del self._fetches[n]
                    if "error" in out:
                        self._failed[n] = (time.monotonic(), str(out["error"]))
            now = time.monotonic()  # failures past their minute are let go (custom names: any number)
            self._failed = {n: f for n, f in self._failed.items() if now - f[0] < FETCH_RETRY_SECONDS}
            if name in self._fetches:
                return None, *self._fetches[name]
            if name in self._failed:
                raise ValueError(self._failed[name][1])
            if not needs_fetch(name):
                return None
            if self._fetches:
                other, (thread, out) = next(iter(self._fetches.items()))
                return other, thread, out
            out: dict = {}
            thread = threading.Thread(target=_fetch, args=(name, out), daemon=True, name="specviz-fetch")
            self._fetches[name] = (thread, out)
            thread.start()
            return None, thread, out

    def _load(self, s: RunSettings) -> None:
        """Load the pair s asks for into self._pair (its key in self._key)."""
        dtype = None if s.dtype == "auto" else s.dtype
        if s.pair == CUSTOM:
            pair = load_pair(s.target.strip(), s.draft.strip() or None, device=self.device,
                             dtype=dtype)
        elif s.pair in self.extra_pairs:
            target, draft = self.extra_pairs[s.pair]
            pair = load_pair(target, draft, device=self.device, dtype=dtype)
        else:
            pair = presets.load(s.pair, device=self.device, dtype=dtype)
        if self.fast:
            pair = replace(pair, fast=self.fast)
        if self.warm:  # at the k of the run that asked for the pair (the preload: the page's default)
            warm_up(pair, s.k)
        self._pair, self._key = pair, self.key(s)
        if self.keep_home and self._key == self.home:
            self._home_pair = pair

    def loading(self, s: RunSettings, waiting, poll: float = LOAD_POLL_SECONDS):
        """get(s) from a job's generator: where s is not loaded, the load starts in a thread and
        `waiting` is yielded at once, then every `poll` seconds until the load ends (then the pair
        is returned, or its error raised); a loaded pair is returned at once. A Stop
        pressed during a load closed the job only when the load ended, and Gradio held every other
        visitor's Stop meanwhile (its cancel waits on a generator that is inside a step, under one
        app-wide lock, up to 60 s). Stopped, the job lets go at once; a load under way goes on to
        its end under the store's lock, which the next job to load waits for in its own polls. A
        load still waiting for the lock (behind the start-up's, or a stopped job's) is dropped:
        it would have unloaded the pair the next job asks for, to load one nobody wants."""
        if self._lock.acquire(blocking=False):  # no load under way: a loaded pair at once
            try:
                if self.is_loaded(s):
                    return self._pair
            finally:
                self._lock.release()
        out: dict = {}
        stopped = threading.Event()

        def load() -> None:
            try:
                out["pair"] = self.get(s, stopped)
            except BaseException as e:  # noqa: BLE001 - raised in the job, below
                out["error"] = e
            finally:
                self._loaders.discard(threading.current_thread())

        thread = threading.Thread(target=load, daemon=True, name="specviz-load")
        self._loaders.add(thread)  # under way from here, not from when the thread takes the lock
        thread.start()
        try:
            yield waiting  # the page says so at once (each caller showed it before this wait)
            thread.join(poll)
            while thread.is_alive():
                yield waiting
                thread.join(poll)
        finally:  # Stop closes the job here: a load that has not begun does not
            stopped.set()
        if "error" in out:
            raise out["error"]
        return out["pair"]

    def settled(self, waiting, poll: float = LOAD_POLL_SECONDS):
        """current() from a job's generator, once no load is under way: a stopped job's load goes
        on to its end (loading), and meanwhile no pair is loaded; `waiting` is yielded every `poll`
        seconds until it ends. The lab read current() at once there, and told a visitor whose run
        had just been made "no pair is loaded: run something first"."""
        while not self._lock.acquire(timeout=poll):
            yield waiting
        try:
            return self.current()
        finally:
            self._lock.release()

    def baseline_key(self, pair: Pair, s: RunSettings, prompt_ids: list[int]) -> tuple:
        """What decides a target-alone run: the pair, its dtype and device, the prompt's ids and
        every sampling setting (temperature, top-k, top-p, seed) and the length."""
        return (self.key(s), pair.target_name, str(pair.dtype), str(pair.device), tuple(prompt_ids),
                s.temperature, s.top_k, s.top_p, s.seed, s.max_new_tokens)

    def chain_key(self, pair: Pair, s: RunSettings, prompt_ids: list[int]) -> tuple:
        """What decides the chain drafter's run beside a tree run: the baseline's key, the draft
        and k (the tree's depth)."""
        return (*self.baseline_key(pair, s, prompt_ids), pair.draft_name, s.k)


FETCHING = ("Downloading {name}, its first use on this server (no GPU time is spent on it): "
            "waited {seconds:.0f} s…")
FETCH_WAIT = ("Waiting for another download to end before {name}'s (one at a time; no GPU time "
              "is spent on it): waited {seconds:.0f} s…")  # not its name: another visitor's pick
FETCH_RETRY_SECONDS = 60.0  # a failed download is said again, not tried again, for this long


def _fetch(name: str, out: dict) -> None:
    """loading.fetch_apart(name) in a thread: its error kept in out["error"]."""
    try:
        fetch_apart(name)
    except Exception as e:  # noqa: BLE001 - raised in each job that waits on it
        out["error"] = e


class Baselines:
    """Target-alone runs kept for reuse, keyed by ModelStore.baseline_key: a small LRU.

    Re-running a prompt with another k or drafter then skips the baseline (the same settings give
    the same tokens); its times are those measured then, and the page says when.
    """

    def __init__(self, size: int = 16):
        self.size = size
        self._lock = threading.Lock()
        zerogpu.renew_lock_after_fork(self)
        self._runs: OrderedDict[tuple, tuple[tuple[RoundEvent, ...], float]] = OrderedDict()

    def get(self, key: tuple) -> tuple[tuple[RoundEvent, ...], float] | None:
        """(events, measured at: seconds since the epoch), or None."""
        with self._lock:
            if key not in self._runs:
                return None
            self._runs.move_to_end(key)
            return self._runs[key]

    def put(self, key: tuple, events: tuple[RoundEvent, ...], measured_at: float) -> None:
        with self._lock:
            self._runs[key] = (tuple(events), measured_at)
            self._runs.move_to_end(key)
            while len(self._runs) > self.size:
                self._runs.popitem(last=False)

    def drop(self, key: tuple) -> None:
        """Forget key's run (its times: one timed under another load than the run beside it)."""
        with self._lock:
            self._runs.pop(key, None)

    def __len__(self) -> int:
        return len(self._runs)


def pair_models(pair: Pair) -> dict:
    """A trace's "models": the pair's names (a local folder shortened to its last part, so a
    saved trace shows no server path), dtype, device, and what the greedy verdict compared. Where
    a name was shortened, "source" tells its folder from another of the same last name (…/final
    of two checkpoints): 12 hex digits of the full names' SHA-256, which show no path."""
    names = f"{pair.target_name}\n{pair.draft_name}"
    models = {"target": public_message(pair.target_name),
              "draft": None if pair.draft_name is None else public_message(pair.draft_name),
              "dtype": str(pair.dtype).removeprefix("torch."), "device": str(pair.device),
              "numerics": pair.numerics}
    if public_message(names) != names:
        models["source"] = hashlib.sha256(names.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return models


SAME_PAIR = ("target", "draft", "dtype", "source")  # what a trace's pair must share with the loaded one


def made_here(trace: Trace, pair: Pair | None) -> bool:
    """Whether the loaded pair made this trace's run as far as its tokens and probabilities go:
    the same target, draft and dtype. Not the device or the numerics line (a trace from a GPU, or
    one from before numerics were written, reads the same on a CPU)."""
    made = trace.models if isinstance(trace.models, dict) else {}
    here = pair_models(pair) if pair is not None else None
    return here is not None and all(str(made.get(name)) == str(here.get(name)) for name in SAME_PAIR)


def warm_up(pair: Pair, k: int = RunSettings.k) -> None:
    """One short run so the first timed round does not pay for lazy initialisation. On a compiled
    path (a dedicated GPU) it first captures every step a chain run at k feeds after
    its first round (engine.warm_steps: the target's 1 and k + 1, the draft's 1 and 2), whatever
    the drafter and the text. Each model compiles one graph for its one-token passes and one that
    every wider pass shares (fastpath.SHARED), 18-32 s each on the H200 (docs/benchmarks.md); another
    width is then a capture (0.1-0.5 s). The first visitor would otherwise wait through them.
    The time counts as the load's (ModelStore's switch budget): every visitor waits through it."""
    compiled = any(resolve_fast(pair.fast, m)[1] for m in (pair.target, pair.draft) if m is not None)
    if compiled:
        warm_steps(pair, k)
    list(generate(pair, [0, 1, 2], proposer="draft" if pair.draft is not None else "ngram",
                  k=k if compiled else 2, max_new_tokens=3))
