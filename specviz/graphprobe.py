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
def time_width(model, width: int, context: int, repeats: int) -> dict:
    vocab = model.config.vocab_size
    ctx = torch.tensor([[(11 * i + 5) % vocab for i in range(context)]], device=model.device)
    ids = torch.tensor([[(7 * i + 3) % vocab for i in range(width)]], device=model.device)
    cache = static_cache(model, context + width + 8)
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
    outs = []
    for captured in (False, True):
        cache = static_cache(model, context + tokens + 8)
        first = step(model, cache, ctx, 1, False, kv)[-1]  # [vocab]
        graph = Captured(model, cache, 1) if captured else None
        out, nxt = [], int(first.argmax())
        for _ in range(tokens):
            out.append(nxt)
            ids = torch.tensor([[nxt]], device=model.device)
            row = graph(ids) if graph else step(model, cache, ids, 1, False, kv)  # [1, vocab]
            nxt = int(row[0].argmax())
        outs.append(out)
    first = next((i for i, (a, b) in enumerate(zip(*outs, strict=True)) if a != b), None)
    return {"tokens": tokens, "graph_greedy_equals_eager": outs[0] == outs[1], "first_difference": first}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specviz.graphprobe", description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="1,2,5,9,17", help="target widths (the draft: 1 and 2)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--out", help="write the report here as JSON")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("graphprobe needs a CUDA device (it captures CUDA graphs)")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "models": {}}
    import transformers

    report["transformers"] = transformers.__version__
    widths = {"draft": (1, 2), "target": tuple(int(w) for w in args.widths.split(","))}
    for seed, role in enumerate(ROLES):
        model = random_model(config(role, False), "cuda", torch.bfloat16, seed=seed)
        report["models"][role] = {}
        for w in widths[role]:
            try:
                report["models"][role][w] = time_width(model, w, args.context, args.repeats)
            except Exception as e:  # noqa: BLE001 - a probe: say what failed, keep the rest
                report["models"][role][w] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(role, w, json.dumps(report["models"][role][w]), flush=True)
        del model
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
