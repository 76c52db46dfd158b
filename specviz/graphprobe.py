"""python -m specviz.graphprobe: the static-cache step captured with torch.cuda.CUDAGraph directly.

Issue 12 asks for torch.compile(mode="reduce-overhead") or a direct CUDA graph, whichever measures
better; the engine's compiled path is the former (lm.COMPILE), and gpucheck times it. This probe
times the latter on the same random-weight pair (gpumeasure.random_model, assets/configs/) and the
same step function (lm.step over a StaticCache), so the two can be read side by side:

- per model and width: the eager static step, and the captured graph's replay, each the median
  of `repeats` passes after a context of `context` tokens, rolled back after each pass (the
  length the next write starts at lives on the device: crop is one kernel, no sync);
- whether the replay's logits equal the eager step's at the same position (max difference and
  argmax agreement), and a greedy decode through replays against the eager static decode, in
  float32 (the identity claim), so a graph that baked a position in would be caught;
- the capture's wall time.

ZeroGPU allows no torch.compile; a direct capture inside the @spaces.GPU call is what a Space could
run instead. A probe, not the engine's path: nothing here changes how specviz runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch

from .gpumeasure import ROLES, config, random_model, sync
from .lm import cache_argument, crop, step


def static_cache(model, max_len: int):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


class Captured:
    """One model's StaticCache and a CUDA graph of lm.step over `width` tokens after it."""

    def __init__(self, model, cache, width: int):
        self.model, self.cache, self.width = model, cache, width
        self.kv = cache_argument(model)
        self.ids = torch.zeros(1, width, dtype=torch.long, device=model.device)  # [1, width]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
            for _ in range(3):
                step(model, cache, self.ids, width, False, self.kv)
                crop(cache, -width)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step(model, cache, self.ids, width, False, self.kv)  # [width, vocab]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [width, vocab] of ids [1, width] after the cache, which then holds them."""
        self.ids.copy_(ids)
        self.graph.replay()
        return self.out


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
    graph = Captured(model, cache, width)
    capture_s = time.perf_counter() - start
    replayed = graph(ids).float()
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
    for captured in (False, True):
        cache = static_cache(model, context + tokens + 8)
        first = step(model, cache, ctx, 1, False, kv)[-1]  # [vocab]
        graph = Captured(model, cache, 1) if captured else None
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
        graph = Captured(model, cache, width)
        ids = torch.ones(1, width, dtype=torch.long, device="cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                graph(ids)
                crop(cache, -width)
            sync("cuda")
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)


def compiled(report: dict, variants: list[str]) -> dict:
    """gpumeasure.time_path's fast path (the engine's compiled CachedLM steps) under the variant
    whose width-1 target replay measured fastest."""
    from .gpumeasure import Clock, Settings, time_path

    def replay_ms(v):
        r = report["models"]["target"].get(f"{v} 1" if len(variants) > 1 else 1, {})
        return r.get("graph_ms", float("inf"))

    best = min(variants, key=replay_ms)
    models = {role: random_model(config(role, False), "cuda", torch.bfloat16, seed=i)
              for i, role in enumerate(ROLES)}
    s, skipped = Settings.for_device("cuda"), []
    try:
        with contextlib.ExitStack() as stack:
            for m in models.values():
                stack.enter_context(attention(m, best))
            out = time_path(models, "fast", s, Clock(240), (1, s.k + 1), skipped, "random")
    except Exception as e:  # noqa: BLE001
        return {"variant": best, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"variant": best, "draft_ms": out["draft_ms"], "target_ms": out["target_ms"],
            "seconds": out["seconds"], "compiled_ok": out.get("compiled_ok"), "skipped": skipped}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specviz.graphprobe", description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="1,2,5,9,17", help="target widths (the draft: 1 and 2)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--attention", default="sdpa",
                   help=f"comma list of attention variants to time ({', '.join(ATTENTION)})")
    p.add_argument("--max-len", type=int, default=0,
                   help="static cache positions (0: just the context and the pass; the engine's "
                        "compiled slots hold at least 1024)")
    p.add_argument("--profile", help="write torch.profiler's kernel table of each model's width-1 "
                                     "replay (first attention variant) to this file")
    p.add_argument("--compile", action="store_true",
                   help="also time specviz's own compiled steps (torch.compile, reduce-overhead: "
                        "draft 1, target 1 and 5) under the variant whose target replay was fastest")
    p.add_argument("--out", help="write the report here as JSON")
    args = p.parse_args(argv)
    variants = args.attention.split(",")
    if unknown := set(variants) - set(ATTENTION):
        raise SystemExit(f"unknown attention variants {sorted(unknown)}: pick from {', '.join(ATTENTION)}")
    if not torch.cuda.is_available():
        raise SystemExit("graphprobe needs a CUDA device (it captures CUDA graphs)")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "models": {}}
    import transformers

    report["transformers"] = transformers.__version__
    widths = {"draft": (1, 2), "target": tuple(int(w) for w in args.widths.split(","))}
    tables = []
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
    if args.profile:
        with open(args.profile, "w") as f:
            f.write("\n\n".join(tables) + "\n")
    if args.compile:
        report["compiled"] = compiled(report, variants)
        print("compiled", json.dumps(report["compiled"]), flush=True)
    model32 = random_model(config("target", False), "cuda", torch.float32, seed=0)
    try:
        report["identity_float32"] = greedy_identity(model32, 24, args.context)
    except Exception as e:  # noqa: BLE001
        report["identity_float32"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("identity", json.dumps(report["identity_float32"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
