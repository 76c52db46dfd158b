"""python -m specviz.graphprobe: how the static-cache step is best made into CUDA graphs.

Issue 12 asks for torch.compile(mode="reduce-overhead") or a direct CUDA graph, whichever measures
better (on the H200 a compiled step captured directly: fastpath.CAPTURE, docs/benchmarks.md). This probe
times, on the random-weight pair (gpumeasure.random_model, assets/configs/):

- the step itself (fastpath.step over a StaticCache) captured with torch.cuda.CUDAGraph directly
  (fastpath.GraphedStep, no compiler), against the eager static step: per model and width, the median
  of `repeats` passes after a context of `context` tokens, rolled back after each pass (the
  length the next write starts at lives on the device: crop is one kernel, no sync); whether the
  replay's logits equal the eager step's, and a greedy decode through replays against the eager
  static decode in float32, logits compared, so that a graph that baked a position in is caught;
- with --modes, the engine's own compiled path (CachedLM through gpumeasure.time_path, as
  gpucheck times it) under each way fastpath.CAPTURE names: "direct" (torch.compile without graphs,
  captured by GraphedStep), "trees" (torch.compile mode="reduce-overhead"), "graphs" (GraphedStep
  over the uncompiled step), each as it is or with any of "+packed" (packing.pack: fastpath.PACK),
  "+nested" (packing.nest: fastpath.NESTED), "+shared" (one graph for every width of 2 or more:
  fastpath.SHARED) and "+tuned" (inductor's coordinate-descent tuning: fastpath.TUNED), e.g.
  "direct+packed+shared"; a mode names every setting it has (plain "direct": unpacked, every
  layer traced, a graph a width, untuned); per mode the time of each shape's first use, the
  kernels' time a target pass against its wall time (torch.profiler: host work around a replay
  shows as the gap), the last profiled pass's kernels in order with the device's idle time
  between them, and, with --identity, float32 greedy and verify identity against eager
  (gpumeasure.identity).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

from . import fastpath, kvcache
from .fastpath import GraphedStep, cache_argument, step
from .gpucheck import STEP_FLAGS
from .gpumeasure import ROLES, config, random_model, random_pair, sync
from .kvcache import crop


def static_cache(model, max_len: int):
    return kvcache.static_cache(model, max_len)  # every layer a full one, as the engine's


def captured(model, cache, width: int):
    """ids [1, width] -> logits [width, vocab] after the cache, which then holds them: fastpath.step
    through a GraphedStep of its own (captured on the first call, replayed from then on)."""
    graphed, kv = GraphedStep(), cache_argument(model)
    return lambda ids: graphed(model, cache, ids, width, False, kv)


@torch.inference_mode()
def time_width(model, width: int, context: int, repeats: int, max_len: int = 0) -> dict:
    vocab = model.config.vocab_size
    ctx = torch.tensor([[(11 * i + 5) % vocab for i in range(context)]], device=model.device)
    ids = torch.tensor([[(7 * i + 3) % vocab for i in range(width)]], device=model.device)
    cache = static_cache(model, max(max_len, context + width + 8))
    kv = cache_argument(model)
    step(model, cache, ctx, 1, False, kv)

    def median(run) -> float:
        times = []
        for _ in range(repeats):
            sync("cuda")
            start = time.perf_counter()
            run()
            sync("cuda")
            times.append(time.perf_counter() - start)
            crop(cache, -width)
        return statistics.median(times) * 1e3

    eager = step(model, cache, ids, width, False, kv).float()  # [width, vocab]
    crop(cache, -width)
    eager_ms = median(lambda: step(model, cache, ids, width, False, kv))
    start = time.perf_counter()
    graph = captured(model, cache, width)
    replayed = graph(ids).float()  # the capture (two warm-up passes), then a replay
    sync("cuda")
    capture_s = time.perf_counter() - start
    crop(cache, -width)
    graph_ms = median(lambda: graph(ids))
    return {"eager_static_ms": round(eager_ms, 4), "graph_ms": round(graph_ms, 4),
            "speedup": round(eager_ms / graph_ms, 2), "capture_s": round(capture_s, 2),
            "max_logit_difference": float((replayed - eager).abs().max()),
            "argmax_equal": bool(torch.equal(replayed.argmax(-1), eager.argmax(-1)))}


@torch.inference_mode()
def greedy_identity(model, tokens: int, context: int) -> dict:
    """Width-1 greedy decode, eager static steps against graph replays (model in float32)."""
    vocab = model.config.vocab_size
    ctx = torch.tensor([[(13 * i + 1) % vocab for i in range(context)]], device=model.device)
    kv = cache_argument(model)
    outs, rows = [], []
    for graphed in (False, True):
        cache = static_cache(model, context + tokens + 8)
        first = step(model, cache, ctx, 1, False, kv)[-1]  # [vocab]
        graph = captured(model, cache, 1) if graphed else None
        out, nxt, seen = [], int(first.argmax()), []
        for _ in range(tokens):
            out.append(nxt)
            ids = torch.tensor([[nxt]], device=model.device)
            row = graph(ids) if graph else step(model, cache, ids, 1, False, kv)  # [1, vocab]
            seen.append(row[0].float().clone())
            nxt = int(row[0].argmax())
        outs.append(out)
        rows.append(torch.stack(seen))  # [tokens, vocab]
    first = next((i for i, (a, b) in enumerate(zip(*outs, strict=True)) if a != b), None)
    # the logits too: random weights can keep the argmax where a replay read the wrong context
    return {"tokens": tokens, "graph_greedy_equals_eager": outs[0] == outs[1], "first_difference": first,
            "max_logit_difference": float((rows[0] - rows[1]).abs().max())}


ATTENTION = ("sdpa", "sdpa-efficient", "sdpa-math", "sdpa-cudnn", "eager")


@contextlib.contextmanager
def attention(model, variant: str):
    """The model's attention for a variant: transformers' sdpa under torch's own backend choice,
    sdpa held to one backend (torch.nn.attention.sdpa_kernel), or transformers' eager
    attention (plain matmul and softmax)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    before = model.config._attn_implementation
    model.set_attn_implementation("eager" if variant == "eager" else "sdpa")
    backend = {"sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa-math": SDPBackend.MATH,
               "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}.get(variant)
    try:
        with sdpa_kernel([backend]) if backend else contextlib.nullcontext():
            yield
    finally:
        model.set_attn_implementation(before)


def kernels(model, width: int, context: int, max_len: int, rows: int = 15) -> str:
    """torch.profiler's table of the CUDA kernels of 5 replays, costliest first."""
    from torch.profiler import ProfilerActivity, profile

    vocab = model.config.vocab_size
    with torch.inference_mode():
        cache = static_cache(model, max(max_len, context + width + 8))
        step(model, cache, torch.tensor([[(11 * i + 5) % vocab for i in range(context)]], device="cuda"),
             1, False, cache_argument(model))
        graph = captured(model, cache, width)
        ids = torch.ones(1, width, dtype=torch.long, device="cuda")
        graph(ids)  # the capture
        crop(cache, -width)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                graph(ids)
                crop(cache, -width)
            sync("cuda")
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)


def kernel_share(model, s, passes: int = 10, width: int = 1, refine: bool = True) -> tuple[dict, str]:
    """torch.profiler over `passes` passes of `width` tokens of model on the fast path (CachedLM, as
    timed; refine False: as a drafter runs it): the CUDA kernels a pass launches and their time (the
    rest of a pass's wall time is the host's work around them), and the kernel table."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from .gpumeasure import cached_lm

    vocab = model.config.vocab_size
    ctx = [(11 * i + 5) % vocab for i in range(s.context)]
    fast = cached_lm(model, vocab, "fast", s, s.context + s.k + 3, widths=(1, width),  # time_path's slot
                     refine=refine)

    def new(r: int) -> list[int]:
        return [(7 * r + 3 * t + 1) % vocab for t in range(width)]

    fast.forward(ctx)
    for r in range(3):
        fast.forward(ctx + new(r), last=width)
        fast.rollback(ctx + [0])
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for r in range(passes):
            fast.forward(ctx + new(r), last=width)  # waits for the device (CachedLM.forward)
            fast.rollback(ctx + [0])
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    share = {"kernels_a_pass": round(len(kernels) / passes, 1),
             "kernel_ms_a_pass": round(sum(e.time_range.elapsed_us() for e in kernels) / passes / 1e3, 4),
             "profiled_wall_ms_a_pass": round(wall / passes * 1e3, 4),
             "compiled_passes": fast.compiled_passes}
    last, order = last_pass(kernels, passes)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=110)
    return share | last, table + order


HOST_GAP_US = 10.0  # a gap this long is the device waiting for the host, not a launch in a graph


def last_pass(kernels: list, passes: int) -> tuple[dict, str]:
    """The last of `passes` equal passes' kernels (profiler events: name, time_range in us), in the
    order they ran: from its first kernel's start to its last one's end (span), the kernels' own
    time (busy), the device idle between them (gaps), and a line a kernel. Gaps of HOST_GAP_US or
    more are counted apart: the device waiting for the host (before a replay, between it and the
    head's refinement; the profiler slows the host too), where the short ones inside a CUDA graph
    are each kernel's launch latency. An H200 target pass ran 643 kernels, 2.43 ms of them in a
    2.93 ms pass; which kernels a layer runs, and how long the device waits between them, is what
    says where the rest of a pass goes."""
    n = round(len(kernels) / passes) if passes else 0
    if not n:
        return {}, ""
    pass_ = sorted(kernels, key=lambda e: e.time_range.start)[-n:]
    begin = pass_[0].time_range.start
    span = max(e.time_range.end for e in pass_) - begin
    busy = sum(e.time_range.elapsed_us() for e in pass_)
    gaps, end = [], pass_[0].time_range.end  # before each kernel after the first: the device idle
    for e in pass_[1:]:  # since every earlier kernel ended (overlapping ones count once)
        gaps.append(max(0.0, e.time_range.start - end))
        end = max(end, e.time_range.end)
    host = [g for g in gaps if g >= HOST_GAP_US]
    lines = [f"{i:4d} {e.time_range.start - begin:9.2f} {e.time_range.elapsed_us():8.2f}  {e.name[:110]}"
             for i, e in enumerate(pass_)]
    summary = {"last_pass_span_ms": round(span / 1e3, 4), "last_pass_busy_ms": round(busy / 1e3, 4),
               "last_pass_gaps_ms": round(sum(gaps) / 1e3, 4),  # idle: overlapping kernels count once
               "last_pass_host_gaps": len(host), "last_pass_host_gaps_ms": round(sum(host) / 1e3, 4)}
    return summary, ("\n\nthe last pass's kernels in order (start and length in us):\n" + "\n".join(lines))


# what a --modes name may add to its capture mode, after "+": each is a gpucheck step flag (STEP_FLAGS)
FLAG_EXTRAS = {"pack": "packed", "nested": "nested", "shared": "shared", "tuned": "tuned"}
EXTRAS = set(FLAG_EXTRAS.values())
COMPILER_ONLY = {"nested", "shared", "tuned"}  # extras only torch.compile reads (not the graphs mode)


def mode_parts(mode: str) -> tuple[str, set[str]]:
    """"direct+packed" -> ("direct", {"packed"}): a --modes name's capture mode and extras."""
    capture, *extras = mode.split("+")
    return capture, set(extras)


def round_ms(r: dict) -> float | None:
    """A probed mode's cost of a chain round at the widest width it timed, w = k + 1: k draft
    passes and one target pass of w tokens (ms); None where it failed or fell back to eager."""
    widths = {int(w): ms for w, ms in (r.get("target_ms") or {}).items()}
    if "error" in r or r.get("compiled_ok") is False or r.get("draft_ms") is None or len(widths) < 2:
        return None
    w = max(widths)
    return (w - 1) * r["draft_ms"] + widths[w]


def fastest(report: dict, margin: float = 0.02) -> tuple[str | None, list[str]]:
    """The probed mode (of fastpath.CAPTURE's capture, which gpucheck runs) whose chain round costs
    least, and the gpucheck flags that set it up: the defaults' own mode stays unless another is
    faster by more than `margin` (timings move by about 1% from run to run). (None, []) when no
    such mode was timed."""
    costs = {m: c for m, r in report.get("modes", {}).items()
             if mode_parts(m)[0] == fastpath.CAPTURE and (c := round_ms(r)) is not None}
    if not costs:
        return None, []
    extras = {FLAG_EXTRAS[f] for f, name, _ in STEP_FLAGS if getattr(fastpath, name)}
    default = next((m for m in costs if mode_parts(m)[1] == extras), None)
    best = min(costs, key=costs.get)
    if default is not None and costs[best] > (1 - margin) * costs[default]:
        best = default
    extras = mode_parts(best)[1]
    return best, [word for flag, _, _ in STEP_FLAGS
                  for word in (f"--{flag}", "on" if FLAG_EXTRAS[flag] in extras else "off")]


def modes(names: list[str], identity: list[str], out: dict, tables: list[str], save, repeats: int = 20,
          device: str = "cuda", quick: bool = False) -> dict:
    """The engine's compiled path (gpumeasure.time_path: draft 1 token, target 1 and k + 1) under
    each fastpath.CAPTURE mode, each on fresh slots, into out[mode]; its kernels' share of a target
    pass; float32 identity against eager for the modes in `identity`. save() after each mode.
    (device and quick: the CPU tests' small form, with a stand-in for the graphs.)"""
    from .gpumeasure import Clock, Settings, time_path
    from .gpumeasure import identity as check_identity

    s = Settings.for_device(device, quick, repeats=repeats, compile=True)
    before = {name: getattr(fastpath, name) for name in ["CAPTURE"] + [name for _, name, _ in STEP_FLAGS]}
    try:
        for mode in names:
            capture, extras = mode_parts(mode)
            fastpath.CAPTURE, r = capture, out.setdefault(mode, {})
            for flag, name, _ in STEP_FLAGS:
                setattr(fastpath, name, FLAG_EXTRAS[flag] in extras)
            fastpath.forget_graphs()  # a slot's step is made as fastpath.CAPTURE says when the slot is
            models = random_pair(device, torch.bfloat16, quick)
            try:
                skipped: list = []
                t = time_path(models, "fast", s, Clock(600), (1, s.k + 1), skipped, "random")
                r.update({key: t.get(key) for key in ("draft_ms", "target_ms", "draft_seconds", "seconds",
                                                      "compiled_ok")})
                if device == "cuda":  # the pair's weights, caches and every captured graph's buffers
                    r["allocated_gb"] = round(torch.cuda.memory_allocated() / 1e9, 3)
            except Exception as e:  # noqa: BLE001 - a probe: say what failed, keep the rest
                r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            if "error" not in r:  # the profiler's tables apart: a failure there leaves the timings
                save()  # to --fastest, and so does the probe's timeout during the tables
                try:
                    r["kernels"], table = kernel_share(models["target"], s)
                    tables.append(f"{mode}: the target's width-1 pass through CachedLM\n{table}")
                    r["kernels_wide"], table = kernel_share(models["target"], s, width=s.k + 1)
                    tables.append(f"{mode}: the target's width-{s.k + 1} pass through CachedLM\n{table}")
                    r["kernels_draft"], table = kernel_share(models["draft"], s, refine=False)  # C_D/C_T
                    tables.append(f"{mode}: the draft's width-1 pass through CachedLM\n{table}")
                except Exception as e:  # noqa: BLE001
                    r["kernels_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            del models
            print(mode, json.dumps(r), flush=True)
            save()  # the timings and kernel tables, before the identity check (a cut there loses it alone)
            if mode in identity:
                try:
                    model32 = random_model(config("target", quick), device, torch.float32, seed=0)
                    r["identity_float32"] = check_identity(model32, s)
                except Exception as e:  # noqa: BLE001
                    r["identity_float32"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(mode, "identity", json.dumps(r["identity_float32"]), flush=True)
                save()
    finally:
        for name, value in before.items():
            setattr(fastpath, name, value)
        fastpath.forget_graphs()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specviz.graphprobe", description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="1,2,5,9,17",
                   help="target widths of the direct-capture section (the draft: 1 and 2); '' skips it")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--attention", default="sdpa",
                   help=f"comma list of attention variants to time ({', '.join(ATTENTION)})")
    p.add_argument("--max-len", type=int, default=0,
                   help="static cache positions (0: just the context and the pass; the engine's "
                        "compiled slots hold at least 1024)")
    p.add_argument("--profile", help="write torch.profiler's kernel tables here: each model's width-1 "
                                     "replay (first attention variant), and each --modes target "
                                     "pass (1 and k+1 tokens) and draft pass")
    p.add_argument("--modes", default="",
                   help=f"comma list of capture modes ({', '.join(fastpath.CAPTURES)}), each alone or "
                        "with any of '+packed' (packing.pack), '+nested' (packing.nest), '+shared' "
                        "(one graph for every width of 2 or more) and '+tuned' (coordinate-descent "
                        "tuning), to time the "
                        "engine's compiled path under (draft 1, target 1 and 5)")
    p.add_argument("--identity", default="",
                   help="comma list of those modes to check float32 identity against eager under")
    p.add_argument("--out", help="write the report here as JSON (after each section)")
    p.add_argument("--fastest", metavar="REPORT",
                   help="print the gpucheck flags of the fastest mode in a report this probe wrote "
                        "(see fastest()), and nothing else; nothing when it timed none")
    args = p.parse_args(argv)
    if args.fastest:
        try:
            with open(args.fastest) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:  # a probe that never wrote it: the defaults stand
            print(f"graphprobe --fastest: cannot read {args.fastest} ({e}): no flags, the defaults "
                  "stand", file=sys.stderr)
            return 2
        if not isinstance(report, dict):
            print(f"graphprobe --fastest: {args.fastest} is no report of this probe (a JSON object): "
                  "no flags, the defaults stand", file=sys.stderr)
            return 2
        try:
            best, flags = fastest(report)
        except (AttributeError, TypeError, ValueError, KeyError) as e:  # a hand-edited or foreign report
            print(f"graphprobe --fastest: {args.fastest} is no report of this probe ({type(e).__name__}: "
                  f"{e}): no flags, the defaults stand", file=sys.stderr)
            return 2
        print(" ".join(flags))
        return 0
    variants = args.attention.split(",")
    if unknown := set(variants) - set(ATTENTION):
        raise SystemExit(f"unknown attention variants {sorted(unknown)}: pick from {', '.join(ATTENTION)}")
    names = [m for m in args.modes.split(",") if m]
    captures = fastpath.CAPTURES
    if unknown := {m for m in names if mode_parts(m)[0] not in captures or not mode_parts(m)[1] <= EXTRAS}:
        raise SystemExit(f"unknown capture modes {sorted(unknown)}: pick from {', '.join(captures)}, "
                         "each optionally +packed, +nested, +shared, +tuned")
    if idle := {m for m in names if mode_parts(m)[0] == "graphs" and mode_parts(m)[1] & COMPILER_ONLY}:
        raise SystemExit(f"{', '.join(sorted(idle))}: the graphs mode compiles nothing, so "
                         f"{' and '.join('+' + e for e in sorted(COMPILER_ONLY))} change nothing there")
    if not torch.cuda.is_available():
        raise SystemExit("graphprobe needs a CUDA device (it captures CUDA graphs)")
    import transformers

    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "models": {}}
    tables: list[str] = []

    def save() -> None:
        """The report and the tables, each written whole or not at all (a timeout's kill mid-write
        left a cut report, which --fastest could not read)."""
        from pathlib import Path

        from .gpucheck import atomically

        if args.out:
            atomically(Path(args.out), lambda f: f.write_text(json.dumps(report, indent=1)))
        if args.profile:
            atomically(Path(args.profile), lambda f: f.write_text("\n\n".join(tables) + "\n"))

    if args.widths:
        widths = {"draft": (1, 2), "target": tuple(int(w) for w in args.widths.split(","))}
        for seed, role in enumerate(ROLES):
            model = random_model(config(role, False), "cuda", torch.bfloat16, seed=seed)
            report["models"][role] = {}
            for variant in variants:
                for w in widths[role]:
                    key = f"{variant} {w}" if len(variants) > 1 else w
                    try:
                        with attention(model, variant):
                            report["models"][role][key] = time_width(model, w, args.context, args.repeats,
                                                                     args.max_len)
                    except Exception as e:  # noqa: BLE001 - a probe: say what failed, keep the rest
                        report["models"][role][key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                    print(role, key, json.dumps(report["models"][role][key]), flush=True)
            if args.profile:
                try:
                    with attention(model, variants[0]):
                        tables.append(f"{role}, width 1, {variants[0]}, max_len {args.max_len}\n"
                                      + kernels(model, 1, args.context, args.max_len))
                except Exception as e:  # noqa: BLE001
                    tables.append(f"{role}: profile failed: {type(e).__name__}: {str(e)[:300]}")
            del model
        model32 = random_model(config("target", False), "cuda", torch.float32, seed=0)
        try:
            report["identity_float32"] = greedy_identity(model32, 24, args.context)
        except Exception as e:  # noqa: BLE001
            report["identity_float32"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print("identity", json.dumps(report["identity_float32"]), flush=True)
        del model32
        save()
    if names:
        modes(names, [m for m in args.identity.split(",") if m], report.setdefault("modes", {}), tables,
              save, args.repeats)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
