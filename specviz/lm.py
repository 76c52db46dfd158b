"""CachedLM: the one owner of a model's KV cache, with explicit rollback.

Invariant: the cache holds exactly the key/values of `self.tokens`, then of any tree nodes fed
after them (`self.slots`, until keep() or a rollback). `forward(ids, last)` feeds
only what the cache lacks and returns logits for the last `last` positions; `rollback(ids)`
crops the cache to the longest common prefix it shares with ids, leaving at least the last id to
feed. After each engine round the target's cache holds the committed tokens minus the last.

In bfloat16 / float16 a logit is rounded to 8 / 11 significant bits, so two tokens often tie
exactly, and a 1-token and a (k+1)-token pass break such ties differently. With `refine` the
top logits of each row (every token that rounding could have put first) are recomputed in
float32 from the same hidden state and weights: the argmax is then the float32 head's. The hidden
state itself is not the same: a 1-token and a (k+1)-token pass compute it in another order, so a
near-tie there (top-2 a bf16 step apart) can still flip; the page's verdict names it a near-tie.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError, GuardOnDataDependentSymNode

from . import arch, dense, fastpath, kvcache
from .tree import depths as tree_depths
from .tree import mask as tree_mask

log = logging.getLogger(__name__)


# Top logits refine_top recomputes a row before it reads anything back: the read that tells whether
# a row had more candidates then waits for kernels already queued, not for the host to queue more.
CANDIDATES = 16


def refine_top(hidden: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor,
               m: int = CANDIDATES) -> torch.Tensor:
    """Recompute in float32 every logit that low-precision rounding could have put first.

    hidden [n, d] and weight [vocab, d] in the model's dtype; logits [n, vocab] = hidden @ weight.T
    rounded to that dtype. Returns float32 logits [n, vocab]: the candidates (within 4 units in
    the last place of the row's maximum) exact to float32, the rest as given. Each row's own
    candidates only: a row's p must not depend on the rows verified beside it (the target alone
    reads one row a pass; refining a row's next-ranked logits because a wider row shared the pass
    moved its sampled distribution by up to 1.4% in total variation).

    Every row's top m logits are recomputed, and only then is the widest row's candidate count
    read back (on a GPU the pass's one wait, after every kernel is queued); a row with more
    candidates than m (a flat one) has all of them recomputed in a second go."""
    out = logits.to(torch.float32, copy=True)  # [n, vocab]: refined in place, logits kept as given
    top = out.amax(-1, keepdim=True)  # [n, 1]
    ulp = torch.finfo(logits.dtype).eps * torch.exp2(torch.floor(torch.log2(top.abs().clamp_min(1e-30))))
    own = out >= top - 4 * ulp  # [n, vocab]: each row's candidates
    idx = out.topk(min(m, out.shape[-1]), dim=-1).indices  # [n, m]: each row's candidates, and more
    exact = torch.einsum("nd,nmd->nm", hidden.float(), weight[idx].float())  # [n, m]
    out.scatter_(-1, idx, torch.where(own.gather(-1, idx), exact, out.gather(-1, idx)))
    counts = own.sum(-1)  # [n]: each row's candidates
    widest = int(counts.max())
    if widest > idx.shape[-1]:  # those rows again, over all of their candidates (rare)
        wide = (counts > idx.shape[-1]).nonzero().flatten()  # [w]
        out[wide] = refine_top(hidden[wide], weight, logits[wide], widest)
    return out


PAD_TOKEN = 0  # what fills a padded pass (a tree's, a chain's): a token no real one sees, never kept
PENDING = -1  # in CachedLM.tokens: a token fed from the device, not read back yet (equals no id)
# CachedLM.prefill reads a longer prompt in passes of this many tokens, so that a run can be
# stopped, and its time limit checked, between them (the engine's progress=True yields after
# each). On the embedded target in bf16 here, a 2,047-token prompt read in one pass took 22.3 s,
# in 256-token passes 21.3-25.6 s (the longest 3.3-7.7 s), in 128-token passes 22.6 s
# (docs/load-test.md, seventeenth stop): 256 keeps the longest prompt to 8 passes.
PREFILL_CHUNK = 256
# Routed bfloat16 layers (dense.reads_prompts_apart) copy their weights to float32 for each prompt
# pass (about 3 s on the embedded target): they read in passes of 4 chunks.
WIDE_CHUNKS = 4


def common_prefix(a: list[int], b: list[int], limit: int | None = None) -> int:
    """How many leading items a and b share (at most limit). Compared a slice at a time, the
    span where they first differ halved each step: a token-by-token loop in Python cost a run of
    4,000 tokens about half its host time a round (docs/benchmarks.md, "Host time a round")."""
    a, b = (x if type(x) is list else list(x) for x in (a, b))  # a list never equals a tuple
    lo, hi = 0, max(0, min(len(a), len(b), len(a) if limit is None else limit))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[lo:hi] != b[lo:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def bucket(nodes: int) -> int:
    """Tree nodes a compiled pass feeds: the next power of two (1, 2, 4, ... 64), so a run whose
    trees vary in size needs a handful of captured shapes, not one per size."""
    return 1 << max(0, nodes - 1).bit_length()


def first_line(e: BaseException) -> str:
    """An error's first line that says something (its fix, if any, is often on a later one), or its
    type's name where none does: for a one-line message."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def failure(e: BaseException) -> str:
    """One line for a log: the exception's type, and its root cause's first line (dynamo's
    BackendCompilerFailed holds the compiler's own exception, and names it on a later line)."""
    def first(x: BaseException) -> str:
        return next((line for line in str(x).splitlines() if line.strip()), "")

    root, handling = e, False
    for _ in range(8):  # a chain of causes, not a cycle
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None and not root.__suppress_context__ and root.__context__ is not None:
            inner, handling = root.__context__, True  # raised while handling another
        if inner is None or inner is root:
            break
        root = inner
    if handling:  # the outer error may say something the one it handled does not: both
        return f"{type(e).__name__}: {first(e)}; while handling {type(root).__name__}: {first(root)}"
    return type(e).__name__ + (f" from {type(root).__name__}" if root is not e else "") + f": {first(root)}"


def out_of_memory(e: BaseException) -> BaseException | None:
    """The error that ran out of memory, e itself or one it was raised from or while handling
    (the compiler wraps what it ran), or None: Python's MemoryError, or torch's
    (torch.OutOfMemoryError and any RuntimeError saying so). A message quotes that error, not e:
    another error raised while handling one (a cleanup's) names what it is, not the cause."""
    for _ in range(8):
        if isinstance(e, MemoryError) or isinstance(e, RuntimeError) and "out of memory" in str(e).lower():
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
        if e is None:
            return None
    return None


def compile_error(e: BaseException) -> bool:
    """Whether e is what a compiler raises when it cannot make a graph (before it runs)."""
    from torch._dynamo.exc import TorchDynamoException  # dynamo loads only where steps compile

    return isinstance(e, (TorchDynamoException, ConstraintViolationError, GuardOnDataDependentSymNode))


AGAIN = 3  # the times a step's shape may compile again before its model's passes go eager


class CachedLM:
    def __init__(self, model, vocab_size: int, refine: bool = True, cache: str = "dynamic",
                 steps: str | None = None, max_len: int | None = None):
        if cache not in ("dynamic", "static"):
            raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
        self.model = model
        self.vocab_size = vocab_size  # ids >= vocab_size are never produced (masked)
        self.device = model.device
        self.static = cache == "static"
        self.refine = refine and arch.refinable(model)
        self.kv = fastpath.cache_argument(model.base_model if self.refine else model)
        self.compiled_widths: set[int] = {1}  # token counts a step may feed through the compiled step
        self.positions = arch.positions(model)  # a learned position table's end: no pad goes past it
        self.wide_prompts = dense.reads_prompts_apart(model)
        if steps not in (None, "compiled", "graphs"):
            raise ValueError(f"steps must be None, 'compiled' or 'graphs', got {steps!r}")
        if steps == "graphs" and model.device.type not in fastpath.GRAPH_DEVICES:
            steps = None  # nothing captures graphs here: eager static steps
        self._step, self._slot = None, None
        if self.static:
            self.max_len = max_len or min(model.config.max_position_embeddings, 4096)
            if steps:  # a slot's cache and compiled or graphed step, reused run after run
                self._slot = fastpath._Slot.lease(self, model, self.max_len, steps)
                self.cache, self._step, self.max_len = self._slot.cache, self._slot.step, self._slot.capacity
            else:
                self.cache = kvcache.static_cache(model, self.max_len)
        else:
            self.cache = kvcache.dynamic_cache(model)
        self.tree_windows = arch.tree_windows(model)
        self.tokens: list[int] = []
        self.slots: list[tuple[int, int]] = []  # tree nodes cached after tokens: (token, parent slot)
        self.passes = 0
        self.compiled_passes = 0  # passes that ran through the compiled step
        self.memory_fallbacks = 0  # passes a capture's lack of memory sent eager (the step kept)
        self.first_uses = 0  # compiled passes whose shape was new to the slot: they compiled or captured it
        self.capture_seconds = 0.0  # what this model's CUDA graph captures took (GraphedStep)
        self.seconds = 0.0

    @property
    def cache_length(self) -> int:
        """Positions the cache holds, read from the cache itself: on a static cache a device
        tensor, so on a GPU a host sync (the engine reads it once a run, checked_length)."""
        return int(self.cache.get_seq_length())

    def checked_length(self) -> int:
        """cache_length, checked against what the host counts: the committed tokens and the tree
        nodes cached after them. A mismatch is a bug of the rollback (KV invariant), not a user's."""
        held, counted = self.cache_length, len(self.tokens) + len(self.slots)
        if held != counted:
            raise AssertionError(f"the cache holds {held} positions where {counted} were committed")
        return held

    def rollback(self, ids: list[int]) -> None:
        """Crop the cache to the longest common prefix of its tokens and ids[:-1]."""
        self.drop_slots()
        keep = common_prefix(self.tokens, ids, len(ids) - 1)
        if keep < len(self.tokens):
            kvcache.crop(self.cache, keep - len(self.tokens))  # static: moves the length, no copy
            self.tokens = self.tokens[:keep]
        if not self.static:  # a static length lives on the device: reading it would sync
            self.checked_length()

    def drop_slots(self) -> None:
        """Forget the tree nodes cached after the committed tokens."""
        if self.slots:
            kvcache.crop(self.cache, -len(self.slots))
            self.slots = []

    def _check_room(self, positions: int) -> None:
        if self.static and positions > self.max_len:
            raise ValueError(f"the static cache holds {self.max_len} positions, not {positions}")

    def _read(self, tokens: list[int]) -> None:
        """Feed tokens after the cache in a pass whose logits are not needed (a prompt's), on the
        float32 kernel of routed bfloat16 layers (dense.reading_prompt). Not a pass of its own in
        the counts, but timed with them: it is round 1's prefill."""
        start = time.perf_counter()
        hidden = self.model.base_model is not self.model  # no head: its logits are not needed
        kv = fastpath.cache_argument(self.model.base_model if hidden else self.model)
        with dense.reading_prompt() if self.wide_prompts else contextlib.nullcontext():
            fastpath.step(self.model, self.cache, torch.tensor([tokens], device=self.device), 1, hidden, kv)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.tokens = self.tokens + list(tokens)
        self.seconds += time.perf_counter() - start

    def _read_prompt(self, ids: list[int], keep: int) -> None:
        """Feed what the cache lacks of ids[:-keep] in a pass of its own (_read) when it is a
        head of dense.PROMPT_ROWS tokens or more and routed bfloat16 layers read prompts on the
        float32 kernel. The last `keep` ids are then read on torch's kernel, as every later round
        reads its drafts and the target alone its steps: round 1's drafts are judged by the
        logits the target alone computes at those positions. (Read with the prompt, they
        differed at token 3 of a bench prompt here.)"""
        head = ids[len(self.tokens):len(ids) - keep]
        if self.wide_prompts and len(head) >= dense.PROMPT_ROWS:
            self._read(head)

    @torch.inference_mode()
    def prefill(self, ids: list[int], chunk: int | None = None) -> Iterator[int]:
        """Read a long prompt before round 1: all of ids but the last, in passes of `chunk` tokens
        (unset: PREFILL_CHUNK; WIDE_CHUNKS of them where prompts are read on the float32 kernel),
        yielding after each the tokens cached. Round 1 then reads the last id with its drafts, as
        it does after any prompt read apart (_read_prompt), and the target alone reads it alone.
        A prompt of at most `chunk` tokens, or one holding an id the model cannot read (a draft
        with a smaller vocabulary: it then drafts nothing), is left to round 1, as before."""
        chunk = chunk or PREFILL_CHUNK
        self.rollback(ids)
        end = len(ids) - 1
        if end - len(self.tokens) < chunk or max(ids) >= arch.input_rows(self.model):
            return
        self._check_room(end)
        chunk *= WIDE_CHUNKS if self.wide_prompts else 1
        while len(self.tokens) < end:
            self._read(ids[len(self.tokens):min(end, len(self.tokens) + chunk)])
            yield len(self.tokens)

    @torch.inference_mode()
    def keep(self, path: list[int]) -> None:
        """Commit the tree slots `path` (a chain from the root, in order): the cache then holds
        tokens + their tokens, gathered into place, and no other node."""
        base, n = len(self.tokens), len(path)
        if n:
            idx = torch.tensor(path, device=self.device) + base
            for layer in self.cache.layers:
                for kv in (layer.keys, layer.values):  # [batch, kv_heads, seq, head_dim]
                    kv[:, :, base:base + n] = kv.index_select(2, idx)
        kvcache.crop(self.cache, n - len(self.slots))
        self.tokens = self.tokens + [self.slots[j][0] for j in path]
        self.slots = []
        if not self.static:
            self.checked_length()

    @torch.inference_mode()
    def forward_tree(self, ids: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Feed what the cache lacks of ids, then tree nodes in one pass.

        tokens[i] is drafted after slot parents[i] (-1: after ids[-1]; j: slot j, cached earlier
        or fed in this call). Slots number the nodes cached after ids, in order, so this call's
        nodes become slots len(self.slots).. . Each node attends to ids and its own ancestors, at
        position len(ids) - 1 + depth. Returns logits [r + len(tokens), vocab_size] (float32):
        when ids had an uncached tail (r = 1), first the row after ids[-1], then a row per node.
        Call keep(path) or rollback afterwards.

        With a compiled step and at most one uncached token, the nodes are padded to bucket(n)
        with PAD_TOKEN nodes that only see the context: the pass then has one of a few fixed
        shapes and runs through the compiled step (a captured graph on CUDA). No real node sees
        a pad, so every real row is what the unpadded pass gives; the pads are dropped with the
        other unkept slots. ValueError for a model that cannot verify a tree (check_tree_model)."""
        arch.check_tree_model(self.model)
        if ids != self.tokens:  # a new round: earlier nodes go, the uncached tail is fed
            self.rollback(ids)
        real, held = len(tokens), len(ids) + len(self.slots)  # held: after the nodes cached earlier
        self._check_room(held + real)  # each node takes a slot of the cache
        self._read_prompt(ids, 1)
        tail = ids[len(self.tokens):]
        fixed = self._step is not None and len(tail) <= 1 and not (self.static and held + bucket(real)
                                                                   > self.max_len)  # pads need room too
        pad = bucket(real) - real if fixed else 0
        tokens, parents = list(tokens) + [PAD_TOKEN] * pad, list(parents) + [-1] * pad
        first = len(self.slots)
        every = [parent for _, parent in self.slots] + parents
        depth = tree_depths(every)
        kv_length = self.max_len if self.static else len(ids) + len(every)
        dtype = self.model.dtype
        how, window = self.tree_windows
        if how == "below" and len(ids) - 1 + max(depth[first:], default=0) >= window:
            raise ValueError(arch.tree_refusal(self.model, window))
        masks = {"attention_mask": tree_mask(every, first, len(ids), kv_length, dtype, self.device, len(tail),
                                             window if how == "all" else None)}
        if how == "split":  # the sliding layers' own mask, beside the full layers'
            masks["sliding_mask"] = tree_mask(every, first, len(ids), kv_length, dtype, self.device,
                                              len(tail), window)
        positions = list(range(len(self.tokens), len(ids))) + [len(ids) - 1 + d for d in depth[first:]]
        self._check_room(len(ids) + len(every))
        start = time.perf_counter()
        r = min(len(tail), 1)
        logits = self._logits(torch.tensor([tail + tokens], device=self.device), r + len(tokens), fixed,
                              position_ids=torch.tensor([positions], device=self.device), **masks)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - start
        self.passes += 1
        self.tokens = list(ids)
        self.slots += list(zip(tokens, parents, strict=True))
        return logits[: r + real]

    def _forward(self, input_ids: torch.Tensor, last: int, fixed: bool, **tree) -> torch.Tensor:
        """The step over input_ids [1, n]: through the compiled step when its shape is one of the
        fixed ones (fixed), else eager."""
        if fixed and self._step is not None:
            try:
                # inductor's graph trees (CAPTURE "trees") ask for it; a GraphedStep does not, and
                # the call's first use imports inductor (3 s on this CPU) into a timed round
                if not isinstance(self._step, fastpath.GraphedStep) and hasattr(
                        torch.compiler, "cudagraph_mark_step_begin"):
                    torch.compiler.cudagraph_mark_step_begin()
                made, captured = fastpath.graphs_compiled(), getattr(self._step, "capture_seconds", 0.0)
                try:
                    out = self._step(self.model, self.cache, input_ids, last, self.refine, self.kv, **tree)
                finally:
                    self.capture_seconds += getattr(self._step, "capture_seconds", 0.0) - captured
                self.compiled_passes += 1
                recompiled = fastpath.graphs_compiled() > made
                self._count_compiles(self._step_shape(input_ids, last, tree), recompiled)
                return out.clone()  # graph outputs are buffers the next replay overwrites
            except Exception as e:  # noqa: BLE001 - any capture failure: eager from now on
                if self.device.type == "cuda":  # what the failed step queued has written
                    with contextlib.suppress(RuntimeError):
                        torch.cuda.synchronize(self.device)
                # undo a partial write: the cache held the committed tokens and any tree slots
                kvcache.truncate(self.cache, len(self.tokens) + len(self.slots))
                if out_of_memory(e):  # a capture's memory (its warm-ups, the graph's pool): this
                    # pass goes eager (and fails if that runs out too: the app names the fix); the
                    # model's graphs stay on, and this shape is tried again on its next use
                    self.memory_fallbacks += 1
                    return fastpath.step(self.model, self.cache, input_ids, last, self.refine, self.kv,
                                         **tree)
                why = failure(e)
                compiled = self._step.fn if isinstance(self._step, fastpath.GraphedStep) else self._step
                if (compile_error(e) and isinstance(compiled, fastpath.SharedWidths)
                        and compiled.shares(self.model, input_ids.shape[1])):
                    log.warning("specviz: the compiler refused the step shared by every width (%s); "
                                "compiling a graph a width from now on", why)
                    fastpath.UNSHARED.add(self.model)  # every slot's step of the model's, its later runs too
                    # this pass again, on fresh tensors (the failed call marked these dynamic)
                    return self._forward(input_ids.clone(), last, fixed,
                                         **{name: t.clone() for name, t in tree.items()})
                log.warning("specviz: compiled step failed (%s); running eager from now on", why)
                self._eager_from_now()
        return fastpath.step(self.model, self.cache, input_ids, last, self.refine, self.kv, **tree)

    def _eager_from_now(self):
        self._step = None
        if self._slot is not None:  # the slot's later runs go eager too, without trying again
            self._slot.step = None

    def _count_compiles(self, shape: tuple, compiled: bool):
        """After a step call of this shape that compiled or not: a shape may compile again AGAIN
        times (a state dynamo guards on changed: a torch function mode, grad mode). Past that its
        graph holds something that moves pass by pass, such as a position the model's forward
        reads from the cache on the host (OPT's `torch.ones(past + n)`): it would compile at
        every position until dynamo's recompile limit (64: about 17 s of a tiny model's compiling
        on CPU, minutes of a real one's on CUDA), so the model's passes go eager from now on.
        Graphs are counted process-wide (graphs_compiled): one another thread compiles during the
        call counts too, which the app never does (the gate runs one model job at a time)."""
        shapes = self._slot.shapes if self._slot is not None else {}
        if shape not in shapes:
            shapes[shape] = 0
            self.first_uses += 1
        elif compiled:
            shapes[shape] += 1
            if shapes[shape] > AGAIN:
                log.warning("specviz: the compiled step compiled %d times for one shape (its graph "
                            "holds something that moves pass by pass, such as a position the model's "
                            "forward reads on the host); running eager from now on", shapes[shape] + 1)
                self._eager_from_now()

    def _step_shape(self, input_ids: torch.Tensor, last: int, tree: dict) -> tuple:
        """What a call of the step compiles a graph for: its width, rows and tree arguments, and
        whether the model's wide passes share one graph (a model put in UNSHARED compiles each
        width again, rightly)."""
        return input_ids.shape[1], last, self.refine, tuple(sorted(tree)), self.model in fastpath.UNSHARED

    def _logits(self, input_ids: torch.Tensor, last: int, fixed: bool, pad: int = 0,
                **tree) -> torch.Tensor:
        """Logits [last, vocab_size] (float32) for input_ids [1, n] after the cache; the last `pad`
        of input_ids are pad tokens, whose rows are dropped. A padded pass asks the step for every
        row, so that its graph is the one of its width whatever `last` is (round 1 over a short
        prompt wants fewer rows than it feeds: with `last + pad` each prompt length compiled anew)."""
        ask = input_ids.shape[1] if pad else last
        out = self._forward(input_ids, ask, fixed, **tree)[ask - pad - last: ask - pad]
        if not self.refine:
            return out[:, : self.vocab_size].float()
        weight = self.model.get_output_embeddings().weight[: self.vocab_size]  # [vocab, d]
        return refine_top(out, weight, nn.functional.linear(out, weight))

    @torch.inference_mode()
    def forward_next(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token that is still on the device (token [1]: the last pass's pick) after the
        cached tokens; logits [1, vocab_size] (float32). Nothing is read back to the host and
        nothing waits for the device: the token joins self.tokens as PENDING until settle()
        names it, so a draft loop reads its k tokens back once, not once a token. Not timed
        (timing would wait for the device): the caller times the loop."""
        self._check_room(len(self.tokens) + 1)
        logits = self._logits(token.view(1, 1), 1, 1 in self.compiled_widths)  # [1, vocab]
        self.passes += 1
        self.tokens = self.tokens + [PENDING]
        return logits

    def settle(self, tokens: list[int]) -> None:
        """Name the PENDING tokens in self.tokens, oldest first, from tokens (read back after the
        loop; any left over at the end were drafted but never fed)."""
        start = len(self.tokens)  # forward_next appends: the PENDING tokens are the last ones
        while start and self.tokens[start - 1] == PENDING:
            start -= 1
        assert len(tokens) >= len(self.tokens) - start, (len(tokens), len(self.tokens) - start)
        self.tokens = self.tokens[:start] + list(tokens[: len(self.tokens) - start])

    def _chain_pad(self, n: int, end: int) -> int:
        """PAD_TOKENs that bring a pass of n tokens, ending at position `end`, to the narrowest
        compiled width above n (0: none is, the step is not compiled, or the cache lacks room)."""
        wider = [w for w in self.compiled_widths if w > n]
        if self._step is None or n in self.compiled_widths or not wider:
            return 0
        if end + min(wider) - n > min(self.max_len, self.positions or self.max_len):
            return 0
        return min(wider) - n

    @torch.inference_mode()
    def forward(self, ids: list[int], last: int = 1) -> torch.Tensor:
        """Feed what the cache lacks of ids; return logits [last, vocab_size] (float32).

        With a compiled step, a pass narrower than a compiled width (a short n-gram match, an
        adaptive or budget-cut round, a draft's catch-up) is padded to the narrowest one above it
        with PAD_TOKENs after its tokens, and runs through the compiled step: under the causal
        mask no real token sees a pad, so every real row is what the unpadded pass gives. The
        pads' positions are cropped off again."""
        self.rollback(ids[: len(ids) - last + 1])
        self._check_room(len(ids))
        self._read_prompt(ids, last)
        new = ids[len(self.tokens):]
        pad = self._chain_pad(len(new), len(ids))
        start = time.perf_counter()
        input_ids = torch.tensor([new + [PAD_TOKEN] * pad], device=self.device)  # [1, n + pad]
        logits = self._logits(input_ids, last, bool(pad) or len(new) in self.compiled_widths, pad)
        if pad:  # logits: [last, vocab]
            kvcache.crop(self.cache, -pad)  # static: moves the length back over the pads
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - start
        self.passes += 1
        self.tokens = list(ids)
        if not self.static:
            self.checked_length()
        return logits


def draft_lm(model, vocab_size: int, **cache) -> CachedLM:
    """A drafter's CachedLM: over the rows its head has, without the float32 head refinement
    (which only the target's p needs). After round 1 a draft reads 1 token a round before drafting
    (the target's correction) or 2 (its last draft, never fed, and the bonus after a fully
    accepted round): both widths run through a compiled step."""
    lm = CachedLM(model, min(vocab_size, arch.output_rows(model)), refine=False, **cache)
    lm.compiled_widths = {1, 2}
    return lm
