"""python -m specviz gpucheck: what the embedded pair's passes cost here, eager against the fast path.

One command, no downloads, torch + transformers only (no gradio, plotly or psutil on its import
path), so it runs on a bare GPU machine with older packages. It builds the embedded pair's two
architectures (assets/configs/) with seeded random weights, and, when the embedded cache is
present, also times the real pair. It reports:

- the copy bandwidth (a large device tensor copy, bytes read plus written, median);
- C_D (draft, 1 token) and C_T(w) (target, w tokens verified) on the eager path (DynamicCache,
  eager forwards) and the fast path (StaticCache; on CUDA its fixed-shape steps compiled with
  torch.compile(mode="reduce-overhead"), i.e. CUDA graphs);
- the target alone's tokens per second against the bandwidth limit (weight bytes a pass reads over
  the measured copy bandwidth);
- fast-path greedy output against eager on the same weights in float32 (a width-1 greedy decode,
  and speculative-style verify rounds of width k+1 with some drafts corrupted, so the static
  cache is rolled back past rejected tokens), and eager against a cache-free forward;
- the projected speedup per k and drafter (profiles.projection, acceptance measured on CPU);
- the engine's own rounds end to end (enginecheck): how much of a round is neither the draft's
  passes nor the verify pass, against what the profile projects for the same passes;
- each goal of the GPU issue as met / not met.

It writes the pass costs as a cost profile (specviz.profiles) that the k explorer and the bench
replay recorded runs onto. Pass times are host wall-clock between device synchronizations (what
a round waits for, launch overhead included); medians of repeats. Sections run in priority
order under a time budget, and whatever would overrun it is reported as skipped.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from . import enginecheck, profiles
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
    real: bool = True  # also the real pair, when its cache is present

    @classmethod
    def for_device(cls, device: str, quick: bool = False, **overrides) -> Settings:
        s = cls(device, quick, compile=device == "cuda")
        if device != "cuda":
            s = replace(s, repeats=3, context=64, eager_widths=(1, 2, 3, 5, 9, 17),
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
    """(all weight bytes, bytes one pass reads): a pass reads one row of the input embedding."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    return total, total - embed.numel() * embed.element_size()


def real_models(device: str, dtype: torch.dtype, roles=("target", "draft")) -> dict | None:
    """The embedded pair from its cache ({role: model}), or None when it is not built here."""
    from . import embedded

    models = {"target": embedded.TARGET, "draft": embedded.DRAFT}
    if not all(embedded.is_cached(m) for m in models.values()):
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


def cached_lm(model, vocab: int, path: str, s: Settings, max_len: int, widths=(1,), refine: bool = True):
    if path == "eager":
        return CachedLM(model, vocab, refine=refine)
    lm = CachedLM(model, vocab, refine=refine, cache="static", compiled=s.compile, max_len=max_len)
    if hasattr(lm, "compiled_widths"):
        lm.compiled_widths = set(widths)
    return lm


def pass_ms(lm, ctx: list[int], width: int, repeats: int, warmup: int, device: str, vocab: int) -> float:
    """Median ms of one pass feeding `width` new tokens after the cached ctx (rolled back each time)."""
    times = []
    for r in range(warmup + repeats):
        new = [(7 * r + 3 * t + 1) % vocab for t in range(width)]
        sync(device)
        start = time.perf_counter()
        lm.forward(ctx + new, last=width)
        sync(device)
        if r >= warmup:
            times.append(time.perf_counter() - start)
        lm.rollback(ctx + [0])
    return 1e3 * statistics.median(times)


def time_path(models: dict, path: str, s: Settings, clock: Clock, widths, skipped: list, label: str,
              into: dict | None = None, margin: float = 1.0) -> dict:
    """{cache, compiled, draft_ms, target_ms: {width: ms}, seconds: {width: wall s}, compiled_ok} for
    one path; `into` extends an earlier result with more widths. A width is skipped when the time
    left is under `margin` times the costliest width so far (on CUDA a width's first use compiles
    its step)."""
    vocab = models["target"].config.vocab_size
    ctx = [(11 * i + 5) % vocab for i in range(s.context)]
    all_widths = s.eager_widths if path == "eager" else s.fast_widths
    max_len = s.context + max(all_widths) + 2
    warmup = 3 if path == "fast" and s.compile else 1  # capture, then graph warm-up, then replay
    out = into or {"cache": "dynamic" if path == "eager" else "static",
                   "compiled": path == "fast" and s.compile, "dtype": s.dtype, "max_len": max_len,
                   "target_ms": {}, "seconds": {}}
    alive = []
    if "draft" in models and "draft_ms" not in out:
        lm = cached_lm(models["draft"], vocab, path, s, max_len, refine=False)
        lm.forward(ctx)
        start = time.perf_counter()
        out["draft_ms"] = pass_ms(lm, ctx, 1, s.repeats, warmup, s.device, vocab)
        out["draft_seconds"] = round(time.perf_counter() - start, 2)  # its capture included
        alive.append(getattr(lm, "_step", None) is not None)
    lm = cached_lm(models["target"], vocab, path, s, max_len, widths)
    lm.forward(ctx)
    for w in widths:
        if out["target_ms"] and clock.left() < margin * max(out["seconds"].values()):
            skipped.append(f"{label} {path}: target width {w} (time budget)")
            continue
        start = time.perf_counter()
        out["target_ms"][w] = pass_ms(lm, ctx, w, s.repeats, warmup, s.device, vocab)
        out["seconds"][w] = round(time.perf_counter() - start, 2)
    alive.append(getattr(lm, "_step", None) is not None)
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
    del fast  # frees the model's compiled slot (specviz.lm reuses one cache and graph per model)
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


# ---- the check -----------------------------------------------------------------------------

def hardware(device: str, bandwidth: float) -> dict:
    cpus = os.cpu_count() or 0
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"device": "cuda", "name": props.name[:100],
                "memory_gib": round(props.total_memory / 2**30, 1),
                "cpus": cpus, "copy_gbs": round(bandwidth, 1)}
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    name = f"{platform.machine() or 'cpu'}, {cpus} CPUs, torch {torch.get_num_threads()} threads"
    return {"device": device, "name": name, "memory_gib": round(memory, 1), "cpus": cpus,
            "copy_gbs": round(bandwidth, 2)}


def packages() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "cuda": torch.version.cuda}


def loadavg() -> float | None:
    """The 1-minute load average (other processes sharing the CPU slow its timings)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def load_note(load: list) -> str:
    if None in load:
        return ""
    return (f"; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end, on "
            f"{os.cpu_count()} CPUs (above the CPU count, other work shared them)")


def slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    return "-".join(p for p in out.split("-") if p)[:50]


def run(s: Settings, log=print) -> dict:
    """The whole check: a report dict (with the profile under "profile")."""
    if s.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device here: run with --device cpu")
    if s.compile:
        for name in ("cache_size_limit", "recompile_limit"):  # one graph per shape and model
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    clock, skipped, load = Clock(s.budget), [], [loadavg()]
    preflight(s.device)
    dtype = getattr(torch, s.dtype)
    bandwidth = copy_bandwidth(s.device, s.copy_mib)
    log(f"copy bandwidth: {bandwidth:.1f} GB/s (read + write, {s.copy_mib} MiB)")
    cfgs = {role: config(role, s.quick) for role in ROLES}
    models = {role: random_model(cfg, s.device, dtype, seed=i) for i, (role, cfg) in enumerate(cfgs.items())}
    sizes = {role: (sum(p.numel() for p in m.parameters()), *weight_bytes(m)) for role, m in models.items()}
    paths_ok = ["eager"] + (["fast"] if fast_available() else [])
    if not fast_available():
        skipped.append("fast path: this specviz's CachedLM has no cache= option")

    def logged(path: str) -> dict:
        c = paths[path]
        log(f"{path}: draft {c['draft_ms']:.3f} ms, target " + ", ".join(
            f"{w}: {ms:.3f}" for w, ms in sorted(c["target_ms"].items())) + " ms")
        return c

    # priority: every eager width, the fast widths the goals read (1 and k+1), the identity check,
    # then the other fast widths while the budget lasts
    paths = {"eager": time_path(models, "eager", s, clock, s.eager_widths, skipped, "random")}
    logged("eager")
    first = tuple(w for w in s.fast_widths if w in (1, s.k + 1))
    if "fast" in paths_ok:
        paths["fast"] = time_path(models, "fast", s, clock, first, skipped, "random")
        logged("fast")
    result = {"identity": None, "real": None, "real_identity": None, "engine": {}}
    if clock.left() > 0.2 * s.budget or s.quick:
        model32 = random_model(cfgs["target"], s.device, torch.float32, seed=0)
        result["identity"] = identity(model32, s)
        del model32
        log(f"identity (float32): {json.dumps(result['identity'])}")
    else:
        skipped.append("float32 identity check (time budget)")
    rest = tuple(w for w in s.fast_widths if w not in first)

    def engine(models: dict, kind: str, captures: int) -> None:
        """The engine's own rounds (enginecheck) while the budget lasts: `captures` new shapes,
        each priced at the costliest fast width so far (its capture included)."""
        capture = max(paths["fast"]["seconds"].values(), default=0.0)
        if clock.left() < 0.4 * s.budget + captures * capture and not s.quick:
            skipped.append(f"engine rounds, {kind} (time budget)")
            return
        try:
            result["engine"][kind] = enginecheck.engine_run(
                models, "compiled" if s.compile else "static", kind, s.k, s.context, s.engine_tokens)
            log(f"engine rounds, {kind}: {json.dumps(result['engine'][kind])}")
        except Exception as e:  # noqa: BLE001 - a measurement: say what failed, keep the rest
            first_line = (str(e).splitlines() or [""])[0][:200]
            skipped.append(f"engine rounds, {kind}: {type(e).__name__}: {first_line}")

    if "fast" in paths_ok:  # the chain feeds the widths just captured (1 and k + 1): seconds
        engine(models, "chain", 0)
    if "fast" in paths_ok and rest:
        time_path(models, "fast", s, clock, rest, skipped, "random", into=paths["fast"], margin=2.0)
        logged("fast")
    if "fast" in paths_ok:  # a tree captures three masked passes anew (draft 4 wide, target 17 and 5)
        engine(models, "tree", 3)
    del models
    if s.real and clock.left() > 0.4 * s.budget:
        real = real_models(s.device, dtype)
        if real is None:
            skipped.append("real pair: the embedded cache is not built here")
        else:
            quick = replace(s, fast_widths=(1, s.k + 1), eager_widths=(1, s.k + 1))
            result["real"] = {p: time_path(real, p, quick, clock, quick.fast_widths, skipped, "real")
                              for p in paths_ok}
            log(f"real pair: {json.dumps(result['real'])}")
            del real
            if clock.left() > 0.25 * s.budget:
                target32 = real_models(s.device, torch.float32, roles=("target",))["target"]
                result["real_identity"] = identity(target32, s)
                log(f"real target identity (float32): {json.dumps(result['real_identity'])}")
                del target32
            else:
                skipped.append("real pair: float32 identity check (time budget)")
    elif s.real:
        skipped.append("real pair (time budget)")
    load.append(loadavg())
    hw = hardware(s.device, bandwidth)
    name = slug(("" if s.device == "cuda" else "cpu-") + hw["name"].split(",")[0]
                + f"-{s.dtype}" + ("-quick" if s.quick else ""))
    costs = {p: profiles.PathCosts(
        c["cache"], c["compiled"], c.get("draft_ms"),
        tuple(sorted((int(w), float(ms)) for w, ms in c["target_ms"].items())), s.dtype, c["max_len"],
        "" if c.get("compiled_ok", True) else "compiled capture failed: eager steps")
        for p, c in paths.items()}
    tiny = " (quick: tiny widths)" if s.quick else ""
    described = {role: {"name": f"{ROLES[role]} architecture, random weights{tiny}", "params": sizes[role][0],
                        "weight_bytes": sizes[role][1], "dtype": s.dtype,
                        "config": f"assets/configs/{ROLES[role]}/config.json"} for role in ROLES}
    command = "python -m specviz gpucheck --device " + s.device + (" --quick" if s.quick else "")
    profile = profiles.Profile(name, hw, packages(), costs, described, datetime.date.today().isoformat(),
                               s.quick, f"measured by `{command}`" + load_note(load))
    report = {"format": "specviz-gpucheck", "version": 1, "settings": dict(vars(s)),
              "seconds": round(clock.elapsed, 1), "skipped": skipped, "bandwidth_gbs": bandwidth,
              "weights": {r: {"params": n, "bytes": t, "read_per_pass": p} for r, (n, t, p) in sizes.items()},
              "paths": paths, **result, "profile": profile.to_dict(), "load_average": load}
    both = [r for r in (result["identity"], result["real_identity"]) if r]
    ident = None if not both else {k: all(r.get(k) for r in both) for k in IDENTITY_KEYS if k in both[0]}
    return report | summary(profile, sizes["target"][2], bandwidth, ident, s.k)


def summary(profile: profiles.Profile, read_bytes: int, bandwidth: float, ident: dict | None, k: int) -> dict:
    """The target alone against the bandwidth limit, the projection per k and drafter, the goals."""
    limit_ms = read_bytes / (bandwidth * 1e9) * 1e3
    alone = {p: {"ms": c.target_seconds(1) * 1e3, "tokens_per_second": 1 / c.target_seconds(1),
                 "over_limit": c.target_seconds(1) * 1e3 / limit_ms} for p, c in profile.paths.items()}
    projection = {p: profiles.projection(profile, p) for p in profile.paths}
    fast = profile.paths.get("fast")
    eager = profile.paths["eager"]
    at_k = next((r for r in projection.get("fast", []) if r["drafter"] == f"draft-{k}"), None)
    if fast is not None and k + 1 not in dict(fast.target_ms):
        at_k = None  # C_T(k+1) not measured (time budget): an extrapolation is no verdict

    def goal(text: str, value, met) -> dict:
        return {"goal": text, "value": value, "met": None if value is None else bool(met)}

    speedup = None if fast is None else eager.target_seconds(1) / fast.target_seconds(1)
    ratio = None if fast is None or fast.draft_seconds is None else \
        fast.draft_seconds / fast.target_seconds(1)
    same = None
    if ident and "fast_greedy_equals_eager" in ident:
        same = all(ident[key] for key in IDENTITY_KEYS)
    goals = [goal("target alone: fast path >= 4x faster than eager", speedup,
                  speedup is not None and speedup >= 4),
             goal("target alone on the fast path within 3x of the bandwidth limit",
                  alone.get("fast", {}).get("over_limit"), alone.get("fast", {}).get("over_limit", 99) <= 3),
             goal("C_D/C_T <= 0.5 on the fast path", ratio, ratio is not None and ratio <= 0.5),
             goal(f"projected draft speedup at k={k} >= 2x (fast path)", at_k and at_k["speedup"],
                  at_k is not None and at_k["speedup"] >= 2),
             goal("fast-path greedy identical to eager (float32)", same, same)]
    return {"bandwidth_limit_ms": limit_ms, "bandwidth_limit_tokens_per_second": 1e3 / limit_ms,
            "target_alone": alone, "projection": projection, "goals": goals}


def text(report: dict) -> str:
    """The report for a terminal: pass costs, the target alone, the projection, the goals."""
    prof, lines = report["profile"], []
    hw, pk = prof["hardware"], prof["packages"]
    lines.append(f"specviz gpucheck on {hw['name']} ({hw['device']}): torch {pk['torch']}, transformers "
                 f"{pk['transformers']}, python {pk['python']}, CUDA {pk['cuda']}; {report['seconds']} s"
                 + (" (quick: tiny widths, the real depths)" if prof["quick"] else ""))
    lines.append(f"copy bandwidth {report['bandwidth_gbs']:.1f} GB/s; target reads "
                 f"{report['weights']['target']['read_per_pass'] / 1e9:.3f} GB a pass: limit "
                 f"{report['bandwidth_limit_ms']:.3f} ms, "
                 f"{report['bandwidth_limit_tokens_per_second']:.0f} tok/s")
    for name, path in prof["paths"].items():
        how = f"{path['cache']} cache" + (", compiled" if path["compiled"] else "")
        lines.append(f"{name} ({how}): C_D {path['draft_ms']:.3f} ms; C_T by width: "
                     + ", ".join(f"{w}: {ms:.3f}" for w, ms in path["target_ms"].items()) + " ms")
        if path["compiled"]:  # what each width's first use (its capture) cost, with its timing
            measured = report["paths"][name]
            lines.append(f"  {name}: seconds per width, capture included: {measured['seconds']}, "
                         f"draft {measured.get('draft_seconds')}; "
                         f"captures ok: {measured.get('compiled_ok')}")
    for name, a in report["target_alone"].items():
        lines.append(f"target alone, {name}: {a['ms']:.3f} ms/token, {a['tokens_per_second']:.1f} tok/s, "
                     f"{a['over_limit']:.1f}x the bandwidth limit")
    lines.append("projected (acceptance measured on CPU, docs/bench-cpu-2026-11-30.json):")
    lines.append(f"  {'drafter':10}" + "".join(f"{p + ' ms/tok':>14}{p + ' speedup':>16}"
                                               for p in report["projection"]))
    rows = zip(*report["projection"].values(), strict=True)
    for row in rows:
        lines.append(f"  {row[0]['drafter']:10}" + "".join(
            f"{r['ms_per_token']:14.3f}{r['speedup']:15.2f}x" for r in row))
    if report.get("identity"):
        lines.append(f"identity (float32, random weights): {json.dumps(report['identity'])}")
    if report.get("real_identity"):
        lines.append(f"identity (float32, the real target): {json.dumps(report['real_identity'])}")
    if report.get("real"):
        for name, path in report["real"].items():
            lines.append(f"real pair, {name}: C_D {path.get('draft_ms', 0):.3f} ms; C_T "
                         + ", ".join(f"{w}: {ms:.3f}" for w, ms in path["target_ms"].items()) + " ms")
    if report.get("engine"):
        lines += enginecheck.lines(report["engine"], profiles.from_dict(prof))
    for item in report["skipped"]:
        lines.append(f"skipped: {item}")
    lines.append("goals (set for an H200):")
    for g in report["goals"]:
        value = g["value"] if isinstance(g["value"], bool) or g["value"] is None else f"{g['value']:.2f}"
        state = "not measured" if g["met"] is None else "met" if g["met"] else "NOT MET"
        lines.append(f"  {state:12} {g['goal']}: {value}")
    return "\n".join(lines)


def add_gpucheck_args(p) -> None:
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    p.add_argument("--quick", action="store_true", help="tiny widths (real depths), fewer repeats")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="timing dtype (default bfloat16)")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="fast path through torch.compile (auto: on CUDA only)")
    p.add_argument("--repeats", type=int, help="timed passes per measurement (median)")
    p.add_argument("--budget", type=float, help="seconds for the whole check (default 270 on CUDA)")
    p.add_argument("--no-real", action="store_true", help="skip the real pair even when it is cached")
    p.add_argument("--out", help="folder for gpucheck.json and the cost profile <name>.json")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal is not met")


def cmd_gpucheck(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.repeats is not None and not 1 <= args.repeats <= 1000:
        raise ValueError("--repeats must be in 1..1000")
    if args.budget is not None and not 10 <= args.budget <= 3600:
        raise ValueError("--budget must be in 10..3600 seconds")
    compile_ = {"auto": None, "on": True, "off": False}[args.compile]
    s = Settings.for_device(device, args.quick, dtype=args.dtype, compile=compile_, repeats=args.repeats,
                            budget=args.budget, real=False if args.no_real else None)
    report = run(s, log=(lambda line: None) if args.json else (lambda line: print(line, flush=True)))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpucheck.json").write_text(json.dumps(report, indent=1) + "\n")
        profiles.save(profiles.load(report["profile"]), out / f"{report['profile']['name']}.json")
    print(json.dumps(report) if args.json else text(report))
    if args.out and not args.json:
        print(f"wrote {Path(args.out) / 'gpucheck.json'} and "
              f"{Path(args.out) / (report['profile']['name'] + '.json')}")
    return 1 if args.strict and any(g["met"] is False for g in report["goals"]) else 0
