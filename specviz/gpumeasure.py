"""gpucheck's measurements: the embedded pair's architectures with seeded random weights, pass
times on the eager and the fast path, the copy bandwidth, and fast-path greedy identity.

torch + transformers only (no gradio, plotly or psutil), so it runs on a bare GPU machine with
older packages; specviz.gpucheck runs these under a time budget and reports them.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from . import fastpath
from .lm import CachedLM

CONFIGS = Path(__file__).parent.parent / "assets" / "configs"
ROLES = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}
IDENTITY_KEYS = ("eager_equals_cache_free", "fast_greedy_equals_eager", "fast_verify_equals_eager")
BLOCK = 1_048_583  # a prime: random weights tile one seeded block of this many values
QUICK_SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=4096)  # --quick: tiny widths, the real depths (28 and 24 layers)


@dataclass(frozen=True)
class Settings:
    device: str
    quick: bool = False
    dtype: str = "bfloat16"  # timing dtype; the identity check is always float32
    compile: bool = True  # the fast path's steps through torch.compile (default: on CUDA only)
    repeats: int = 20
    context: int = 128  # tokens in the cache before each timed pass
    eager_widths: tuple[int, ...] = tuple(range(1, 18)) + (33, 65)
    # priority order: 1 and 5 feed the goals; 33 and 65, with 2, 3, 5, 9 and 17, are the widths a
    # compiled tree pass feeds (1 + lm.bucket(nodes))
    fast_widths: tuple[int, ...] = (1, 5, 9, 3, 2, 17, 33, 65)
    identity_tokens: int = 48
    engine_tokens: int = 48  # tokens each engine run (enginecheck) generates
    k: int = 4
    copy_mib: int = 2048
    budget: float = 270.0  # seconds for the whole check
    settle: float = 0.25  # seconds of untimed passes before each measurement (pass_ms; 0 on CPU)
    real: bool = True  # also the real pair, when its cache is present

    @classmethod
    def for_device(cls, device: str, quick: bool = False, **overrides) -> Settings:
        s = cls(device, quick, compile=device == "cuda")
        if device != "cuda":
            s = replace(s, repeats=3, context=64, eager_widths=(1, 2, 3, 5, 9, 17), settle=0.0,
                        fast_widths=(1, 5, 9, 3, 2, 17), identity_tokens=16, engine_tokens=24,
                        copy_mib=256, budget=900.0)
        if quick:
            s = replace(s, repeats=3, context=16, eager_widths=(1, 2, 5), fast_widths=(1, 5),
                        identity_tokens=12, engine_tokens=12, copy_mib=min(s.copy_mib, 64), real=False,
                        budget=120.0)
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})


class Clock:
    def __init__(self, budget: float):
        self.start, self.budget = time.perf_counter(), budget

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def keeping(self, seconds: float) -> Clock:
        """This clock with `seconds` of its budget kept back for a later section."""
        kept = Clock(self.budget - seconds)
        kept.start = self.start
        return kept

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---- models --------------------------------------------------------------------------------

def config(role: str, quick: bool):
    cfg = AutoConfig.from_pretrained(CONFIGS / ROLES[role])
    if quick:
        for key, value in QUICK_SHAPE.items():
            setattr(cfg, key, value)
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        cfg.pad_token_id = cfg.bos_token_id = cfg.eos_token_id = cfg.vocab_size - 1
    return cfg


def random_pair(device: str, dtype: torch.dtype, quick: bool) -> dict:
    """{role: random_model} for each of ROLES, the shipped configs (tiny widths with quick),
    seeded by role (target 0, draft 1): the pair every check times."""
    return {role: random_model(config(role, quick), device, dtype, seed=i) for i, role in enumerate(ROLES)}


@torch.no_grad()
def random_model(cfg, device: str, dtype: torch.dtype, seed: int):
    """The architecture of cfg with seeded random weights, built without a slow init: on the meta
    device, then allocated, weights tiled from one normal block (std initializer_range, rotated per
    tensor; BLOCK is prime, so no two rows of a matrix are equal), norms 1, biases 0."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    block = torch.randn(BLOCK, generator=gen, device=device) * getattr(cfg, "initializer_range", 0.02)
    twice = torch.cat([block, block]).to(dtype)  # twice[off:off + n] is the block rotated by off
    for i, (name, p) in enumerate(sorted(model.named_parameters())):
        if p.ndim == 1:
            p.fill_(1.0 if "norm" in name else 0.0)
            continue
        off, flat = (i * 104_729) % BLOCK, p.view(-1)
        for start in range(0, flat.numel(), BLOCK):
            n = min(BLOCK, flat.numel() - start)
            flat[start:start + n].copy_(twice[off:off + n])
    for module in model.modules():  # non-parameter buffers (rotary inv_freq) were left empty
        if module._buffers:
            with torch.device(device):
                fresh = type(module)(getattr(module, "config", cfg))
            for name, buf in fresh._buffers.items():
                module._buffers[name] = buf
    return model.eval()


def weight_bytes(model) -> tuple[int, int]:
    """(all weight bytes, bytes one pass reads): a pass reads one row of the input embedding, and
    all of the head; tied to the embedding (parameters() yields it once), the head is that matrix."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is not None and head.weight is embed:
        return total, total
    return total, total - embed.numel() * embed.element_size()


def real_cached() -> bool:
    """Whether the embedded pair's cache is built here (real_models can load it)."""
    from . import embedded

    return all(embedded.is_cached(m) for m in (embedded.TARGET, embedded.DRAFT))


def real_models(device: str, dtype: torch.dtype, roles=("target", "draft")) -> dict | None:
    """The embedded pair from its cache ({role: model}), or None when it is not built here."""
    from . import embedded

    models = {"target": embedded.TARGET, "draft": embedded.DRAFT}
    if not real_cached():
        return None
    return {role: AutoModelForCausalLM.from_pretrained(embedded.cache_dir(models[role]), dtype=dtype)
            .to(device).eval() for role in roles}


# ---- measurements --------------------------------------------------------------------------

def copy_bandwidth(device: str, mib: int, repeats: int = 10) -> float:
    """GB/s of a device-to-device tensor copy, counting bytes read and written (median)."""
    n = (mib << 20) // 4
    src = torch.rand(n, device=device)  # random data: zeros can run faster than real data
    dst = torch.empty_like(src)
    times = []
    for r in range(repeats + 2):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3
        else:
            start = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - start
        if r >= 2:
            times.append(seconds)
    assert torch.equal(dst[:: max(1, n // 1000)], src[:: max(1, n // 1000)])
    return 2 * n * 4 / statistics.median(times) / 1e9


def fast_available() -> bool:
    return "cache" in inspect.signature(CachedLM.__init__).parameters


def path_steps(path: str, s: Settings) -> str | None:
    """CachedLM's steps on a timed path: "fast" is the static cache with compiled steps (on CPU,
    by default, without), "graphed" the static cache with the uncompiled steps captured as CUDA
    graphs (ZeroGPU's path; fastpath.GRAPH_DEVICES only)."""
    return "graphs" if path == "graphed" else "compiled" if path == "fast" and s.compile else None


CAPTURE_SECONDS = 5.0  # a wide width's price where one shared graph is compiled: its capture and
# passes (0.1-0.5 s a capture on the H200), with room to spare


def width_price(seconds: dict, w: int, shared: bool) -> float:
    """Seconds a target width of `w` is expected to take, from what the widths so far took
    (seconds: {width: wall s, first use included}, in the order they ran). Each compiled shape's
    first use compiles it: the costliest width so far. But where every width of 2 or more shares
    one compiled graph (shared: fastpath.SHARED, and the compiler took it) and one such width has
    compiled it, another costs only its capture: the costliest wide width after that first one,
    else CAPTURE_SECONDS."""
    wide = [sec for x, sec in seconds.items() if int(x) >= 2]
    if shared and w >= 2 and wide:
        return max(wide[1:], default=CAPTURE_SECONDS)
    return max(seconds.values())


def cached_lm(model, vocab: int, path: str, s: Settings, max_len: int, widths=(1,), refine: bool = True):
    if path == "eager":
        return CachedLM(model, vocab, refine=refine)
    lm = CachedLM(model, vocab, refine=refine, cache="static", steps=path_steps(path, s), max_len=max_len)
    if hasattr(lm, "compiled_widths"):
        lm.compiled_widths = set(widths)
    return lm


def pass_ms(lm, ctx: list[int], width: int, repeats: int, warmup: int, device: str, vocab: int,
            settle: float = 0.0) -> float:
    """Median ms of one pass feeding `width` new tokens after the cached ctx (rolled back each time),
    after `warmup` untimed passes, and more until `settle` seconds have gone by: on the H200 run the
    eager widths timed first (1-3, each after one warm-up pass) came out at 24-28 ms where the rest
    gave about 18, the GPU or its host still settling in, which a median does not remove."""
    times, r, settled_from = [], 0, None  # settling counts from the end of the first pass (a capture)
    while len(times) < repeats:
        new = [(7 * r + 3 * t + 1) % vocab for t in range(width)]
        sync(device)
        start = time.perf_counter()
        lm.forward(ctx + new, last=width)
        sync(device)
        if settled_from is None:
            settled_from = time.perf_counter()
        elif r >= warmup and start - settled_from >= settle:
            times.append(time.perf_counter() - start)
        lm.rollback(ctx + [0])
        r += 1
    return 1e3 * statistics.median(times)


def compiled_throughout(lm) -> bool:
    """Whether every pass of lm ran its compiled step: none gave up on it (a failed capture), and
    none ran eager for want of memory while keeping it (its time would pass for the step's)."""
    return getattr(lm, "_step", None) is not None and not getattr(lm, "memory_fallbacks", 0)


def time_path(models: dict, path: str, s: Settings, clock: Clock, widths, skipped: list, label: str,
              into: dict | None = None, margin: float = 1.0) -> dict:
    """{cache, compiled, draft_ms, target_ms: {width: ms}, seconds: {width: wall s}, compiled_ok} for
    one path; `into` extends an earlier result with more widths. A width is skipped when the time
    left is under `margin` times width_price: the costliest width so far (on CUDA a width's first
    use compiles its step), or, for a wide width sharing one graph already compiled, a capture's."""
    vocab = models["target"].config.vocab_size
    ctx = [(11 * i + 5) % vocab for i in range(s.context)]
    all_widths = s.eager_widths if path == "eager" else s.fast_widths
    max_len = s.context + max(all_widths) + 2
    steps = path_steps(path, s)
    warmup = 3 if steps else 1  # capture, then graph warm-up, then replay
    # "compiled" in a profile: fixed-shape steps, so the engine pads short passes (profiles.fed)
    out = into or {"cache": "dynamic" if path == "eager" else "static", "compiled": bool(steps),
                   "dtype": s.dtype, "target_ms": {}, "seconds": {}}
    alive = []
    if "draft" in models and "draft_ms" not in out:
        lm = cached_lm(models["draft"], vocab, path, s, max_len, refine=False)
        lm.forward(ctx)
        start = time.perf_counter()
        out["draft_ms"] = pass_ms(lm, ctx, 1, s.repeats, warmup, s.device, vocab, s.settle)
        out["draft_seconds"] = round(time.perf_counter() - start, 2)  # its capture included
        alive.append(compiled_throughout(lm))
    lm = cached_lm(models["target"], vocab, path, s, max_len, widths)
    out["max_len"] = getattr(lm, "max_len", max_len)  # a compiled slot holds at least 1,024 positions
    lm.forward(ctx)
    for w in widths:
        shared = steps == "compiled" and fastpath.SHARED and models["target"] not in fastpath.UNSHARED
        if out["target_ms"] and clock.left() < margin * width_price(out["seconds"], w, shared):
            skipped.append(f"{label} {path}: target width {w} (time budget)")
            continue
        start = time.perf_counter()
        out["target_ms"][w] = pass_ms(lm, ctx, w, s.repeats, warmup, s.device, vocab, s.settle)
        out["seconds"][w] = round(time.perf_counter() - start, 2)
    alive.append(compiled_throughout(lm))
    if out["compiled"]:  # False: a capture failed and the path fell back to eager steps
        out["compiled_ok"] = out.get("compiled_ok", True) and all(alive)
    return out


@torch.inference_mode()
def greedy(lm, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens with width-1 steps, and their logits rows [n, vocab]."""
    out, rows = [], []
    for _ in range(n):
        logits = lm.forward(prompt + out, last=1)  # [1, vocab]
        rows.append(logits[0])
        out.append(int(logits[0].argmax()))
    return out, torch.stack(rows)


@torch.inference_mode()
def verify_rounds(lm, prompt: list[int], reference: list[int], k: int) -> list[int]:
    """Speculative-style rounds on lm: draft the reference's next k tokens, one of them corrupted
    every other round, verify all in one width-(k+1) pass, keep the agreeing prefix plus the
    model's own token. Rejected drafts make the cache roll back past written positions."""
    out, round_ = [], 0
    vocab = lm.vocab_size
    while len(out) < len(reference):
        draft = (reference[len(out):len(out) + k] + [0] * k)[:k]
        if round_ % 2:
            j = round_ % k
            draft[j] = (draft[j] + 1) % vocab
        preds = lm.forward(prompt + out + draft, last=k + 1).argmax(-1).tolist()  # [k+1]
        n = 0
        while n < k and draft[n] == preds[n]:
            n += 1
        out += draft[:n] + [preds[n]]
        round_ += 1
    return out[:len(reference)]


@torch.inference_mode()
def identity(model, s: Settings, seed: int = 3) -> dict:
    """Float32: eager greedy against a cache-free forward, and the fast path against eager."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (32,), generator=gen).tolist()
    n, k = s.identity_tokens, s.k
    eager_out, eager_rows = greedy(CachedLM(model, vocab), prompt, n)
    ids = torch.tensor([prompt + eager_out[:-1]], device=model.device)
    full = model(input_ids=ids).logits[0, len(prompt) - 1:].float().argmax(-1).tolist()  # [n]
    top2 = eager_rows.topk(2, dim=-1).values  # [n, 2]
    result = {"tokens": n, "k": k, "eager_equals_cache_free": full == eager_out,
              "min_top2_margin": float((top2[:, 0] - top2[:, 1]).min())}
    if not fast_available():
        return result | {"fast": None}
    max_len = len(prompt) + n + k + 2
    fast = cached_lm(model, vocab, "fast", s, max_len, (1, k + 1))
    fast_out, fast_rows = greedy(fast, prompt, n)
    compiled_ok = getattr(fast, "_step", None) is not None
    del fast  # frees the model's compiled slot (specviz.fastpath reuses one cache and graph per model)
    spec = cached_lm(model, vocab, "fast", s, max_len, (1, k + 1))
    spec_out = verify_rounds(spec, prompt, eager_out, k)
    first = next((i for i, (a, b) in enumerate(zip(fast_out, eager_out, strict=True)) if a != b), None)
    return result | {"fast_greedy_equals_eager": fast_out == eager_out, "first_difference": first,
                     "fast_verify_equals_eager": spec_out == eager_out,
                     "max_logit_difference": float((fast_rows - eager_rows).abs().max()),
                     "compiled_ok": compiled_ok and getattr(spec, "_step", None) is not None
                     if s.compile else None}


@torch.inference_mode()
def preflight(device: str) -> None:
    """Two layers through CachedLM on each cache kind, against a cache-free forward: a ValueError
    in seconds, not minutes in, when this specviz and this transformers disagree (transformers
    5.17 ignores the forward argument `cache=`, and its static layers cannot crop)."""
    import transformers

    cfg = config("target", quick=True)
    cfg.num_hidden_layers, cfg.layer_types = 2, cfg.layer_types[:2]
    model = random_model(cfg, device, torch.float32, seed=5)
    prompt, tail = list(range(1, 9)), [9, 10, 11]
    want = model(input_ids=torch.tensor([prompt + tail], device=device)).logits[0, -3:].float()  # [3, vocab]
    for kind in ("dynamic", "static") if fast_available() else ("dynamic",):
        try:
            extra = {"cache": kind, "max_len": 32} if kind == "static" else {}
            lm = CachedLM(model, cfg.vocab_size, **extra)
            lm.forward(prompt)
            lm.forward(prompt + [20, 21], last=2)  # written, then rolled back by the next call
            error = float((lm.forward(prompt + tail, last=3) - want).abs().max())
        except Exception as e:  # noqa: BLE001 - any failure here is the message
            raise ValueError(f"specviz's {kind} cache fails with transformers {transformers.__version__} "
                             f"here ({type(e).__name__}: {str(e)[:200]})") from e
        if not error < 1e-3:
            raise ValueError(f"specviz's {kind} cache gives wrong logits with transformers "
                             f"{transformers.__version__} here (max difference {error:.3g} from a forward "
                             "without cache): its cache is not being filled or rolled back")
