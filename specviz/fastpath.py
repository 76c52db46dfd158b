"""The fast paths' fixed-shape steps: how a CachedLM's passes (lm.py) run on a static cache.

A step is one forward of the model after its cache (step). On the "compiled" path it goes through
torch.compile, and on CUDA each shape is captured once as a CUDA graph (GraphedStep) and replayed;
the "graphed" path captures the uncompiled step (ZeroGPU, which has no torch.compile). Graphs stay
valid only while the cache keeps its addresses, so a model's cache and step live in slots (_Slot)
that runs lease in turn. resolve_fast picks a path for a model; the switches below choose how the
compiled path captures, packs and tunes (graphprobe times them side by side on a GPU).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import weakref

import torch

from . import arch, kvcache, packing

FAST_PATHS = ("auto", "eager", "static", "compiled", "graphed")
# torch.compile settings of the compiled steps; the CPU tests swap in the "aot_eager" backend
# (same graph capture, no C++ code generation: about 100 s a shape on 2 cores otherwise).
COMPILE = {"dynamic": False}
# How the "compiled" path's steps become CUDA graphs on CUDA (docs/benchmarks.md, "Direct capture
# of the compiled step"). "direct": torch.compile without graphs (inductor's fused kernels), each
# shape then captured once with torch.cuda.CUDAGraph by GraphedStep and replayed with no host
# work beyond copying the inputs in. "trees": torch.compile(mode="reduce-overhead"), whose graph
# trees check dynamo's guards and the inputs' addresses on the host around every replay (on the
# H200: the same kernels, 0.9 ms more a target pass). "graphs": GraphedStep over the uncompiled
# step, what the "graphed" path runs (no compiler: 0.1-0.5 s a shape instead of 18-28 s; eager's
# unfused kernels). Elsewhere (CPU) a compiled step runs as torch.compile makes it.
CAPTURE = "direct"
CAPTURES = ("direct", "trees", "graphs")
# Whether the compiled path on a graph device packs each layer's q/k/v and gate/up into one matrix
# product each, with grouped attention (packing.pack, in place, when the model's first compiled
# slot is made). Off until a GPU has measured it against the unpacked step side by side
# (`graphprobe --modes direct,direct+packed`, docs/benchmarks.md): built and checked on this CPU,
# not yet timed. Never the graphed path: ZeroGPU's weights must be the ones placed at start-up,
# not new tensors made inside a GPU call.
PACK = False
# Whether the compiled path compiles one decoder layer and reuses its code for the others
# (packing.nest), which cuts a shape's first-use compile; off until a GPU has timed its passes
# and its captures side by side (`graphprobe --modes direct,direct+nested`).
NESTED = False
# Whether the compiled path on a graph device compiles with inductor's coordinate-descent tuning, as
# gpt-fast does: inductor then writes a one-token pass's bias-free matrix products (gate, up, down,
# o) as fused Triton reductions instead of cuBLAS calls, which torch's own source says is how its
# matrix-vector products reach peak bandwidth, and tunes every Triton kernel's launch settings (a
# longer first compile). On the H200 cuBLAS read gate, up and down at about 2.7 TB/s and the small
# ones at a launch's latency (docs/benchmarks.md); off until a GPU has timed it side by side
# (`graphprobe --modes direct+shared,direct+tuned+shared`). Elsewhere (CPU) it changes nothing.
TUNED = False
# Whether a compiled step's passes of 2 or more tokens share one graph, compiled once for any width
# (dynamic in the width: SharedWidths), where each width compiled a graph of its own. On the H200
# each compile took 18-32 s (docs/benchmarks.md), so every new k a visitor picked, and every tree
# size, stalled a run that long; shared, a new width costs a capture (0.1-0.5 s there). A
# one-token pass, the draft's every step and the target alone's, keeps a static graph of its own.
SHARED = True
GRAPH_DEVICES = {"cuda"}  # devices GraphedStep captures on (the CPU tests add a stand-in)
def step(model, cache, input_ids: torch.Tensor, last: int, refine: bool, kv: str = "cache",
         **tree) -> torch.Tensor:
    """The model over input_ids [1, n] after the cache: the last hidden states [last, d] (refine)
    or the logits [last, vocab+], in the model's dtype (last 0: every row). tree: attention_mask
    and position_ids of a tree pass (tree.mask), and sliding_mask where the model's sliding layers
    take a mask of their own (tree_windows "split")."""
    # kv: the forward argument that takes the cache (cache_argument), decided outside any graph
    if "sliding_mask" in tree:  # a tree pass on a model with full and sliding layers (tree_windows
        # "split"): each layer type its own mask, as the model's forward takes them
        tree = dict(tree)
        tree["attention_mask"] = {"full_attention": tree["attention_mask"],
                                  "sliding_attention": tree.pop("sliding_mask")}
    if refine:
        out = model.base_model(input_ids=input_ids, use_cache=True, **{kv: cache}, **tree)
        return out.last_hidden_state[0, -last:]
    return model(input_ids=input_ids, use_cache=True, logits_to_keep=last, **{kv: cache},
                 **tree).logits[0, -last:]


@functools.cache
def _cache_argument(forward_class: type) -> str:
    params = inspect.signature(forward_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_argument(model) -> str:
    """The forward argument that takes the KV cache: `cache` (transformers 5.24 and later) or
    `past_key_values` (earlier releases, e.g. 5.17, which silently ignore `cache=`)."""
    return _cache_argument(type(model))


class GraphedStep:
    """`fn` (step, or a compiled step) captured as one CUDA graph per shape of its arguments, on
    first use, and replayed after copying the call's tensors into the graph's own input buffers.
    `capture_seconds` sums the captures' time (their warm-ups, a compiled fn's compiling, the
    recording; not the replay that then gives the call's output): one-off costs, which the
    engine leaves out of a round's times as it does a caller's pauses.

    The cache is the slot's: its tensors, and the length each layer's next write starts at, stay
    on the device at fixed addresses, so a replay reads where the cache stands now (no position
    is baked into a graph). The output is the graph's buffer, overwritten by the next replay of
    any graph (they share one memory pool): callers copy it. Before a capture, two warm-up calls
    (which compile a compiled fn) each write one pass and are rolled back."""

    def __init__(self, fn=step):
        self.fn = fn
        self.graphs: dict[tuple, tuple] = {}  # shape key -> (replay, input buffers, output)
        self.pool = None  # graph memory pool shared by this step's graphs
        self.capture_seconds = 0.0

    def __call__(self, model, cache, input_ids: torch.Tensor, last: int, refine: bool,
                 kv: str = "cache", **tree) -> torch.Tensor:
        key = (id(model), id(cache), tuple(input_ids.shape), last, refine, kv,
               tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(tree.items())))
        # capture and replay on the model's GPU (cuda:1 too), whichever is current
        with torch.cuda.device(input_ids.device) if input_ids.is_cuda else contextlib.nullcontext():
            if key not in self.graphs:
                start = self._synced(input_ids.device)
                try:
                    self.graphs[key] = self._capture(model, cache, input_ids, last, refine, kv, tree)
                finally:  # after a failed capture, its own error is the one to raise
                    with contextlib.suppress(RuntimeError):
                        self._synced(input_ids.device)
                    self.capture_seconds += time.perf_counter() - start
            replay, inputs, out = self.graphs[key]
            inputs["input_ids"].copy_(input_ids)
            for name, t in tree.items():
                inputs[name].copy_(t)
            replay()
        return out

    @staticmethod
    def _synced(device: torch.device) -> float:
        """The clock, once the device has done what was queued (its time is a capture's or not)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def _capture(self, model, cache, input_ids, last, refine, kv, tree) -> tuple:
        inputs = {"input_ids": input_ids.clone(), **{name: t.clone() for name, t in tree.items()}}
        others = {name: inputs[name] for name in tree}

        def run() -> torch.Tensor:
            return self.fn(model, cache, inputs["input_ids"], last, refine, kv, **others)

        width = input_ids.shape[1]
        with self.warm_stream():
            for _ in range(2):
                like = run()
                kvcache.crop(cache, -width)
        replay, out = self.record(run, like)
        return replay, inputs, out

    @contextlib.contextmanager
    def warm_stream(self):
        """Warm-up calls run off the default stream, as torch.cuda.graph asks. The default stream
        waits for them even when one raises: the eager fallback then crops the cache they wrote."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                yield
        finally:
            torch.cuda.current_stream().wait_stream(side)

    def record(self, run, like: torch.Tensor) -> tuple:
        """(replay, output buffer) of one capture of run(); nothing runs until a replay. like: a
        warm-up call's output (a stand-in recorder, which reruns run, allocates its buffer so)."""
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                out = run()
        finally:  # a capture whose end raises leaves its own stream current (torch/cuda/graphs.py)
            torch.cuda.set_stream(stream)
        return graph.replay, out


class _Slot:
    """A reusable StaticCache and compiled or graphed step of a model's: compiled graphs (and
    CUDA graphs) stay valid only while the cache keeps its addresses, so runs take turns on a
    model's slots, one run a slot at a time. A model keeps as many slots as it ever had leased at
    once (one; two while the target drafts for itself), each a cache and its graphs' memory."""

    def __init__(self, model, max_len: int, steps: str):
        # one graph per (model, width): the app's k from 1 to 16 needs more than dynamo's default 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        if PACK and steps == "compiled" and model.device.type in GRAPH_DEVICES:
            packing.pack(model)  # before the cache and any capture: from now on every pass is packed
        if NESTED and steps == "compiled":
            packing.nest(model)  # eager passes are unchanged: only torch.compile reads the regions
        self.cache = kvcache.static_cache(model, max_len)
        self.step = fixed_step(model.device.type, steps)
        self.capacity, self.steps, self.in_use = max_len, steps, False
        # the step's shapes that compiled (CachedLM._step_shape), each with the times it compiled again
        self.shapes: dict[tuple, int] = {}

    @classmethod
    def lease(cls, owner, model, max_len: int, steps: str) -> _Slot:
        """A free slot of the model's with these steps and room for max_len, its cache emptied,
        for owner until it is collected. A run holds a slot a model (two where the target drafts
        for itself), and the next run gets them back; free slots that are too small or have other
        steps give way to a new one (which compiles or captures anew). A slot whose step failed
        keeps step None: its later runs go eager without trying again."""
        slots = _SLOTS.setdefault(model, [])
        slot = next((s for s in slots if not s.in_use and s.capacity >= max_len and s.steps == steps), None)
        if slot is None:
            slots[:] = [s for s in slots if s.in_use]
            slot = cls(model, max(max_len, 1024), steps)
            slots.append(slot)
        slot.in_use = True
        # empty: each layer's length moved to 0 by what it holds (a pass that raised part-way through
        # the model, as one out of memory, wrote some layers and not others)
        kvcache.truncate(slot.cache, 0)
        weakref.finalize(owner, setattr, slot, "in_use", False)
        return slot


UNSHARED: weakref.WeakSet = weakref.WeakSet()  # models whose shared graph failed: a graph a width

def graphs_compiled() -> int:
    """The graphs dynamo has made in this process (a step call that made one compiled)."""
    from torch._dynamo.utils import counters  # dynamo loads only where steps compile

    return counters["stats"]["unique_graphs"]


class SharedWidths:
    """A torch.compile'd step whose passes of 2 or more tokens share one graph: their width is
    marked dynamic and the step asks for every row (last 0, which the step reads as all), cut to
    the last `last` outside the graph, so that no size the graph is specialized on moves with
    the width. A pass of one token goes through its own static graph. Should a model's code fix
    the width after all, dynamo compiles that width on its own (maybe_mark_dynamic: no error),
    as without sharing; should the compiler refuse the shared graph, CachedLM puts the model in
    UNSHARED and compiles it a graph a width, before it would give up on compiled steps."""

    # a tree pass's tensors: [1, 1, w, kv], [1, w], [1, 1, w, kv]
    WIDTH_DIMS = {"attention_mask": 2, "position_ids": 1, "sliding_mask": 2}

    def __init__(self, fn):
        self.fn = fn

    def shares(self, model, width: int) -> bool:
        return width >= 2 and model not in UNSHARED

    def __call__(self, model, cache, input_ids: torch.Tensor, last: int, refine: bool,
                 kv: str = "cache", **tree) -> torch.Tensor:
        width = input_ids.shape[1]
        if not self.shares(model, width):
            return self.fn(model, cache, input_ids, last, refine, kv, **tree)
        assert 0 < last <= width, (last, width)
        torch._dynamo.maybe_mark_dynamic(input_ids, 1)
        for name, t in tree.items():
            torch._dynamo.maybe_mark_dynamic(t, self.WIDTH_DIMS[name])
        return self.fn(model, cache, input_ids, 0, refine, kv, **tree)[width - last:]


def compile_settings(device: str, graphs: bool = False) -> dict:
    """torch.compile's arguments for a step on device: COMPILE's, inductor's CUDA graph trees where
    graphs (mode "reduce-overhead"), and TUNED's coordinate-descent tuning on a graph device. The
    last two are inductor's options, which torch.compile takes as a mode or as options, not both,
    and only for inductor (the CPU tests' "aot_eager" backend takes neither)."""
    options = {"triton.cudagraphs": True} if graphs else {}  # what mode="reduce-overhead" sets
    if TUNED and device in GRAPH_DEVICES:
        options["coordinate_descent_tuning"] = True
    if not options or COMPILE.get("backend", "inductor") != "inductor":
        return dict(COMPILE)
    if options.keys() == {"triton.cudagraphs"}:
        return {**COMPILE, "mode": "reduce-overhead"}
    return {**COMPILE, "options": options}


def compiled_step(device: str, graphs: bool = False):
    """torch.compile(step) as compile_settings says, its wide passes sharing one graph
    (SharedWidths) when SHARED says so."""
    fn = torch.compile(step, **compile_settings(device, graphs))
    return SharedWidths(fn) if SHARED else fn


def fixed_step(device: str, steps: str):
    """The step a slot runs its fixed shapes through. steps "graphs": step captured directly
    (GraphedStep, graph devices only). "compiled": on CUDA captured as CAPTURE says, elsewhere
    as torch.compile makes it."""
    how = "graphs" if steps == "graphs" else CAPTURE if device in GRAPH_DEVICES else "compile"
    if how == "graphs":
        return GraphedStep(step)
    if how == "direct":
        return GraphedStep(compiled_step(device))
    if how == "trees":
        return compiled_step(device, graphs=True)
    return compiled_step(device)


def forget_graphs() -> None:
    """Drop every slot, its cache and its captured graphs: the next run leases and captures anew
    (on ZeroGPU at the start of each GPU call: a graph captured in an earlier call may point at
    device memory that call gave back)."""
    _SLOTS.clear()


_SLOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its _Slots


def resolve_fast(mode: str, model) -> tuple[str, str | None]:
    """(cache kind, steps) for a fast-path mode on this model.

    eager: DynamicCache, eager forwards (any model). static: preallocated StaticCache, rollback
    moves a length, eager forwards. compiled: static, and the fixed-shape steps through
    torch.compile (on CUDA captured as CUDA graphs, CAPTURE). graphed: static, and the fixed-shape
    steps captured as CUDA graphs without a compiler (for ZeroGPU, which has no torch.compile;
    on a device without graphs the same as static). auto: compiled on CUDA, eager elsewhere (on
    this CPU neither static nor compiled steps pay, see docs/benchmarks.md). Models whose cache
    cannot be static (ALiBi in Falcon and MPT: static_ready) stay eager; sliding-window models run
    on every path, their caches' layers all full ones (full_layers). steps:
    None (eager forwards), "compiled" or "graphs" (CachedLM's steps)."""
    if mode not in FAST_PATHS:
        raise ValueError(f"fast path must be one of {', '.join(FAST_PATHS)}, got {mode!r}")
    if mode == "auto":
        mode = "compiled" if model.device.type == "cuda" else "eager"
    if mode == "eager" or not arch.static_ready(model):
        return "dynamic", None
    if mode == "graphed":
        return "static", "graphs" if model.device.type in GRAPH_DEVICES else None
    return "static", "compiled" if mode == "compiled" else None
