"""python -m specviz costs: what one pass costs, so the benchmark's ratios can be explained.

Draft pass (one token, warm cache) for each draft weight format; target pass by the number of
tokens it verifies (C_T(k+1)); and a torch.profiler table of one draft pass in the default
format. Medians of repeated passes on a fixed context.
"""

from __future__ import annotations

import copy
import json
import statistics
import time

from . import quant
from .lm import CachedLM

CONTEXT = "def merge_sorted(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
VERIFIED = (1, 2, 3, 5, 9, 17)


def pass_seconds(model, vocab_size: int, ids: list[int], tokens: int, repeats: int) -> float:
    """Median seconds of a pass feeding `tokens` new tokens after a cached `ids`."""
    lm = CachedLM(model, vocab_size)
    lm.forward(ids)
    times = []
    for r in range(repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        lm.forward(ids + [(7 * r + t) % vocab_size for t in range(1, tokens + 1)], last=tokens)
        times.append(time.perf_counter() - start)
        lm.rollback(ids + [0])
    return statistics.median(times[1:])


def profile_table(model, vocab_size: int, ids: list[int], rows: int = 6) -> str:
    from torch.profiler import ProfilerActivity, profile

    lm = CachedLM(model, vocab_size)
    lm.forward(ids)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for t in range(5):
            lm.forward(ids + list(range(1, t + 2)))
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def measure(pair, repeats: int = 10, draft_formats=("none", "int8", "int4")) -> dict:
    ids = pair.encode(CONTEXT)
    out: dict = {"target_ms": {}, "draft_ms": {}}
    for n in VERIFIED:
        out["target_ms"][n] = 1e3 * pass_seconds(pair.target, pair.vocab_size, ids, n, max(3, repeats // 3))
    if pair.draft is not None:
        for fmt in draft_formats:
            draft = copy.deepcopy(pair.draft)
            if fmt != "none" and not quant.apply(draft, fmt):
                continue  # auto on a device the quantized kernels do not serve
            out["draft_ms"][fmt] = 1e3 * pass_seconds(draft, pair.vocab_size, ids, 1, repeats)
    return out


def add_costs_args(p) -> None:
    from .cli import _add_model_args

    _add_model_args(p)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", action="store_true", help="also profile one draft pass")


def cmd_costs(args) -> int:
    from .cli import load_from_args

    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    formats = ("none", "int8", "int4") if args.draft_quant == "auto" else (args.draft_quant,)
    args.draft_quant = "none"  # measure each format on its own copy
    pair = load_from_args(args)
    result = measure(pair, args.repeats, formats)
    if args.json:
        print(json.dumps(result))
        return 0
    base = result["target_ms"][1]
    print("target pass by tokens verified: " + ", ".join(
        f"{n}: {ms:.0f} ms ({ms / base:.2f}x)" for n, ms in result["target_ms"].items()))
    print("draft pass (1 token): " + ", ".join(f"{f}: {ms:.1f} ms" for f, ms in result["draft_ms"].items()))
    if args.profile and pair.draft is not None:
        draft = copy.deepcopy(pair.draft)
        quant.apply(draft, "auto")
        print(profile_table(draft, pair.vocab_size, pair.encode(CONTEXT)))
    return 0
