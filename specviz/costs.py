"""python -m specviz costs: what one pass costs, so the benchmark's ratios can be explained.

Draft pass (one token, warm cache) for each draft weight format; target pass by the number of
tokens it verifies (C_T(k+1), up to a 64-node tree's 65); the fitted verify slope; and a
torch.profiler table of five one-token draft passes in --draft-quant's format (auto: the engine's
default, int4 on CPU). Medians of repeated passes on a
fixed context.

The verify slope is what sizes adaptive drafts and token trees: T(n) = a + b * n least squares
over the widths, n = width - 1 the drafted tokens verified, and slope = b / a, one more verified
token as a fraction of a one-token pass. It is the model both drafters fit from their own rounds
(verifycost.VerifyCost); verifycost.VERIFY_SLOPE is that fit's prior.
"""

from __future__ import annotations

import copy
import json
import statistics
import time

from . import fastpath, quant
from .digits import sig3
from .lm import CachedLM, draft_lm
from .verifycost import VERIFY_SLOPE, fit_line, split_step

CONTEXT = "def merge_sorted(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
VERIFIED = (1, 2, 3, 5, 9, 17, 33, 65)  # tokens a target pass verifies: 1 + k, or 1 + a tree's nodes


def engine_lm(model, vocab_size: int, refine: bool | None) -> CachedLM:
    """The CachedLM the engine runs model through on its eager path (a dynamic cache, eager
    forwards: the CPU's default; see fast_note): the target's, with the pair's head refinement
    (refine True or False), or a drafter's (refine None: no refinement, over the rows its head has,
    as proposers.ModelProposer and treedraft.TreeProposer run it)."""
    if refine is None:
        return draft_lm(model, vocab_size)
    return CachedLM(model, vocab_size, refine=refine)


def fast_note(pair) -> str | None:
    """A line for a pair whose runs compile their steps (the fast path's default on CUDA), whose
    passes these eager ones are not; None where the engine runs eager too."""
    steps = fastpath.resolve_fast(pair.fast, pair.target)[1]
    if steps is None:
        return None
    return (f"these are eager passes (a dynamic cache); on {pair.device} the engine runs {steps} steps "
            "on a static cache: `python -m specviz gpucheck` times both")


def pass_seconds(model, vocab_size: int, ids: list[int], tokens: int, repeats: int,
                 refine: bool | None = True) -> float:
    """Median seconds of a pass feeding `tokens` new tokens after a cached `ids`, with model run
    as engine_lm(refine) runs it."""
    lm = engine_lm(model, vocab_size, refine)
    lm.forward(ids)
    times = []
    for r in range(repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        lm.forward(ids + [(7 * r + t) % vocab_size for t in range(1, tokens + 1)], last=tokens)
        times.append(time.perf_counter() - start)
        lm.rollback(ids + [0])
    return statistics.median(times[1:])


def profile_table(model, vocab_size: int, ids: list[int], rows: int = 6, refine: bool | None = None) -> str:
    """torch.profiler's table of five passes, by default as the engine's drafter runs them."""
    from torch.profiler import ProfilerActivity, profile

    lm = engine_lm(model, vocab_size, refine)
    lm.forward(ids)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for t in range(5):
            lm.forward(ids + list(range(1, t + 2)))
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def measure(pair, repeats: int = 10, draft_formats=("none", "int8", "int4")) -> dict:
    ids = pair.encode(CONTEXT)
    out: dict = {"target_ms": {}, "draft_ms": {}}
    for n in VERIFIED:
        out["target_ms"][n] = 1e3 * pass_seconds(pair.target, pair.vocab_size, ids, n, max(3, repeats // 3),
                                               refine=pair.refine)
    if pair.draft is not None:
        for fmt in draft_formats:
            draft = copy.deepcopy(pair.draft)
            if fmt != "none":
                quant.apply(draft, fmt)
            out["draft_ms"][fmt] = 1e3 * pass_seconds(draft, pair.vocab_size, ids, 1, repeats, refine=None)
    return out


def verify_fit(target_ms: dict) -> dict:
    """{pass_ms: a, per_token_ms: b, slope: b / a}: the least-squares line T(n) = a + b * n
    through target_ms {width: ms} (n = width - 1 drafted tokens verified; JSON's string keys are
    read as numbers; b held at 0 when times fall). With the one-token pass and two or more wider
    ones, also the two pieces verifycost.VerifyCost fits from a run's rounds: T(0) = the
    one-token pass, T(n) = T(0) * (1 + step + drafted_slope * n) for n >= 1, the line through the
    wider passes alone giving drafted_slope (its b over T(0)) and step (its intercept over T(0),
    less one, at least 0)."""
    points = sorted((int(w) - 1, float(ms)) for w, ms in target_ms.items())
    if len(points) < 2:
        raise ValueError("the verify slope needs pass times at two widths or more")
    line = fit_line([x for x, _ in points], [y for _, y in points])
    if line is None:
        raise ValueError(f"pass times {target_ms} do not fit a line with a positive one-token cost")
    a, b = line
    out = {"pass_ms": a, "per_token_ms": b, "slope": b / a}
    drafted = [(x, y) for x, y in points if x >= 1]
    if points[0][0] == 0 and len(drafted) >= 2:
        wide = fit_line([x for x, _ in drafted], [y for _, y in drafted])
        pieces = split_step(wide, points[0][1]) if wide is not None else None
        if pieces is not None:
            a1, s, b1 = pieces
            out.update(step=s / a1, drafted_slope=b1 / a1)
    return out


def add_costs_args(p) -> None:
    from .cli import _add_model_args

    _add_model_args(p, draft_quant="the draft's weight format (auto: time every format this draft's "
                                   "device and dtype take: none, int8 and int4 on CPU)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="also profile five one-token draft passes, in --draft-quant's format (auto: the "
                        "engine's default, int4 on CPU)")


def cmd_costs(args) -> int:
    from .cli import load_from_args

    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if args.profile and args.json:  # the profile is a table for people: JSON had silently left it out
        raise ValueError("--profile prints a table, which --json leaves no room for: drop one of them")
    asked, args.draft_quant = args.draft_quant, "none"  # measure each format on its own copy
    pair = load_from_args(args)
    formats = (asked,)
    if asked == "auto":  # the formats this draft's device and dtype serve (float16: none but "none")
        served = pair.draft is not None and quant.supported(pair.draft)
        formats = ("none", "int8", "int4") if served else ("none",)
    if args.profile and pair.draft is None:
        raise ValueError("--profile profiles the draft's passes, and this pair has none: add --draft")
    result = measure(pair, args.repeats, formats)
    result["verify_fit"] = verify_fit(result["target_ms"])
    note = fast_note(pair)
    if args.json:
        print(json.dumps(result | {"note": note} if note else result))
        return 0
    if note:
        print(note)
    base = result["target_ms"][1]
    print("target pass by tokens verified: " + ", ".join(
        f"{n}: {sig3(ms)} ms ({ms / base:.2f}x)" for n, ms in result["target_ms"].items()))
    fit = result["verify_fit"]
    print(f"verify slope: one more verified token costs {fit['slope']:.4f} of the line's 1-token pass "
          f"(least squares T(n) = {sig3(fit['pass_ms'])} ms + {sig3(fit['per_token_ms'])} ms * n, n = "
          f"drafted tokens = width - 1, over widths {min(result['target_ms'])}..{max(result['target_ms'])}; "
          f"or {sig3(fit['per_token_ms'] / base)} of the measured 1-token pass); this sizes adaptive drafts "
          f"and token trees (prior {VERIFY_SLOPE})")
    if "step" in fit:
        widest = max(result["target_ms"])
        print(f"in two pieces: a drafted pass costs {1 + fit['step']:.3f} of a 1-token pass plus "
              f"{fit['drafted_slope']:.4f} a drafted token (a line through widths 2..{widest}); "
              "the run's own rounds fit the same pieces")
    print("draft pass (1 token): " + (", ".join(f"{f}: {sig3(ms)} ms" for f, ms in result["draft_ms"].items())
                                       or "no draft model (give --draft to time one)"))
    if args.profile:
        draft = copy.deepcopy(pair.draft)
        quant.apply(draft, asked)
        print(profile_table(draft, pair.vocab_size, pair.encode(CONTEXT)))
    return 0
