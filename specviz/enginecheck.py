"""gpucheck's engine section: the engine's own rounds, end to end, on the random-weight pair.

The pass timings price a round as k draft passes plus one verify pass; the cost profiles'
projections (profiles.project) add nothing else. Everything else a round does is the engine's own
work: sampling, the rule, the host read-backs, the KV bookkeeping, the event. On a CPU that is
under 1% of a round; on a GPU, where a graphed pass takes about a millisecond, it may not be.
This section runs `specviz.generate` (greedy: the target drafting for itself, a chain at k and a
token tree of depth k with a fixed node budget) and splits each round's wall time into the
draft's passes, the target's verify pass and the rest, as the engine's RoundEvents time them.
Drafting for itself, the target has nearly every draft kept; in the chain and the tree the
random draft has nearly every draft refused, so each round commits about one token: the split,
not the speed, is the figure here.
"""

from __future__ import annotations

import time
from collections import Counter
from statistics import fmean

from . import profiles
from .compare import compare
from .engine import generate, warm_steps
from .loading import Pair
from .metrics import RunStats

TREE_NODES = 16  # a fixed budget: the tree's verify width is known (17, a power of two plus 1)


class Vocabulary:
    """All of a tokenizer the engine asks of a random-weight pair fed token ids: its size, and no
    end-of-sequence token."""

    eos_token_id = None

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def split(events, k: int, max_new_tokens: int) -> dict:
    """Means per round over the full rounds after the first (round 1 also fed the prompt; near
    the end the budget cuts a round's drafts):
    wall ms, the draft's and the target's ms, the engine's own ms (the rest), and the rest's share
    of those rounds' time; with the rounds, the tokens they committed (the drafts accepted among
    them), the nodes they verified a
    round, and the passes they asked for (draft passes, target passes by verify width)."""
    events = list(events)
    kept = [(before, e) for before, e in zip(events, events[1:], strict=False)
            if max_new_tokens - e.position - 1 >= k]
    if not kept:
        raise ValueError("the engine section needs a full round after the first: generate more tokens")
    later = [e for _, e in kept]
    total = sum(e.round_seconds for e in later)
    widths = Counter(e.nodes + 1 for e in later)
    return {"rounds": len(later), "tokens": sum(len(e.new_tokens) for e in later),
            "accepted": sum(e.accepted for e in later),
            "nodes": fmean(e.nodes for e in later),
            "round_ms": 1e3 * fmean(e.round_seconds for e in later),
            "draft_ms": 1e3 * fmean(e.draft_seconds for e in later),
            "target_ms": 1e3 * fmean(e.target_seconds for e in later),
            "engine_ms": 1e3 * fmean(e.overhead_seconds for e in later),
            "engine_share": sum(e.overhead_seconds for e in later) / total if total else 0.0,
            "draft_passes": sum(e.draft_passes - before.draft_passes for before, e in kept),
            "widths": {str(w): n for w, n in sorted(widths.items())},
            "tree": any(e.tree for e in later), "k": k}


def passes_of(r: dict, drafts_by_target: bool = False) -> profiles.Passes:
    """An engine run's passes as profiles.project takes them (no draft passes where the target drafted)."""
    return profiles.Passes(0 if drafts_by_target else r["draft_passes"],
                           {int(w): n for w, n in r["widths"].items()}, r["tree"], r["k"])


def projected_ms(r: dict, profile: profiles.Profile, path: str,
                 drafts_by_target: bool = False) -> float | None:
    """What the profile's path charges those rounds' passes (profiles.project), per round.
    drafts_by_target: the target drafted ("self"), so each draft pass is priced at its C_T(1)."""
    passes = passes_of(r, drafts_by_target)
    try:
        seconds = profiles.project(passes, profile, path, first_round=False)  # the rounds after it
        if drafts_by_target:
            seconds += r["draft_passes"] * profile.path(path).target_seconds(1)
    except ValueError:  # no draft cost or no such path on this profile
        return None
    return 1e3 * seconds / r["rounds"]


# "self": the target drafts for itself (its draft CachedLM, unrefined, beside its verifying one),
# so nearly every draft is accepted and every row of each (k+1)-token verify pass is used, where
# the random draft's refused drafts use only the first: the promise checked on the rows that differ
# most from the target alone's 1-token passes (in bfloat16 a wider pass rounds otherwise).
RUNS = {"chain": {"proposer": "draft"}, "tree": {"proposer": "tree", "nodes": TREE_NODES},
        "self": {"proposer": "draft"}}


def engine_run(models: dict, fast: str, kind: str, k: int, context: int, tokens: int) -> dict:
    """split() of a greedy `kind` run (RUNS) on the random pair through the engine, after a short
    warm-up run that reaches every width the run feeds (on CUDA the first use of a shape captures
    its graph: a chain at k reuses the target's widths the pass timings captured and captures the
    draft's 2-token catch-up (engine.warm_steps); a tree captures three masked passes anew), and
    whether its output is the target alone's on the same path (equals_target_alone)."""
    target = models["target"]
    draft = target if kind == "self" else models["draft"]
    vocab = target.config.vocab_size
    pair = Pair(target, Vocabulary(vocab), draft, "random target", "random draft", fast=fast)
    prompt = [(11 * i + 5) % vocab for i in range(context)]
    eos, target.generation_config.eos_token_id = target.generation_config.eos_token_id, None
    try:
        start = time.perf_counter()
        if kind in ("chain", "self"):
            warm_steps(pair, k)
        list(generate(pair, prompt, k=k, max_new_tokens=k + 2, **RUNS[kind]))
        events = list(generate(pair, prompt, k=k, max_new_tokens=tokens, **RUNS[kind]))
        # seconds: the whole section for this kind, its warm-up (and any graph captures) included
        seconds = round(time.perf_counter() - start, 2)
        # the promise, on this path and dtype (bfloat16 on a GPU: the refined head, captured
        # steps): greedy output token for token the target alone's, run after the timing
        alone = RunStats.of(generate(pair, prompt, k=k, max_new_tokens=tokens, proposer="none"))
        result = compare(RunStats.of(events), alone, next(target.parameters()).dtype, str(target.device))
        verdict = {} if result.identical else {  # a near-tie in bfloat16 is rounding, not the rule
            "first_difference": result.position, "verdict": result.verdict,
            "margins": [result.margin(result.spec_top2), result.margin(result.base_top2)],
            "near_tie_bound": result.threshold}
        return split(events, k, tokens) | {"seconds": seconds, "equals_target_alone": result.identical,
                                           **verdict}
    finally:
        target.generation_config.eos_token_id = eos


def lines(result: dict, profile: profiles.Profile | None, path: str = "fast") -> list[str]:
    """The section for a terminal, each run against what the profile's path projects for it."""
    out, estimated = [f"engine rounds ({path} path, random weights, greedy; means over the full rounds "
                      "after the first):"], False
    for name, r in result.items():
        projected = projected_ms(r, profile, path, name == "self") if profile is not None else None
        past = projected is not None and profiles.extrapolated(passes_of(r), profile, path)
        estimated |= past
        out.append(f"  {name} k={r['k']}, {r['nodes']:.1f} nodes a round: round {r['round_ms']:.3f} ms = "
                   f"draft {r['draft_ms']:.3f} + target {r['target_ms']:.3f} + engine "
                   f"{r['engine_ms']:.3f} ms ({r['engine_share']:.1%} of the time)"
                   + ("" if projected is None else f"; the profile projects {projected:.3f} ms" + "*" * past)
                   + {True: "; output = the target alone's", False: "; output NOT the target alone's",
                      None: ""}[r.get("equals_target_alone")]
                   + (f" from output token {r['first_difference'] + 1} ({r['verdict']}; the top-2 "
                      "margins there "
                      f"{', '.join('-' if m is None else f'{m:.4g}' for m in r['margins'])}, a near-tie "
                      f"within {'-' if r['near_tie_bound'] is None else format(r['near_tie_bound'], '.4g')})"
                      if "verdict" in r else ""))
    if estimated:
        out.append("  * a verify priced past the widest pass the path measured (along its last two widths, "
                   "or flat at the one): an estimate")
    return out


def main(argv=None) -> int:
    """python -m specviz.enginecheck: the engine's rounds on the random-weight pair, each run's
    output against the target alone's on the same path; exit status 1 if any run's output differs
    or a run failed."""
    import argparse
    import json

    import torch

    from .gpumeasure import random_pair

    p = argparse.ArgumentParser(prog="python -m specviz.enginecheck",
                                description=" ".join(main.__doc__.split()))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--fast", default="compiled", help="fast path (fastpath.FAST_PATHS)")
    p.add_argument("--kinds", default="self,tree,chain", help=f"comma list of {', '.join(RUNS)}")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--quick", action="store_true", help="the architectures' depths at tiny widths")
    p.add_argument("--out", help="write the results here as JSON (after each run)")
    from .gpucheck import add_step_args, apply_step_args

    add_step_args(p)
    args = p.parse_args(argv)
    kinds = [kind for kind in args.kinds.split(",") if kind]
    if unknown := set(kinds) - set(RUNS):
        raise SystemExit(f"unknown kinds {sorted(unknown)}: pick from {', '.join(RUNS)}")
    if not kinds:  # nothing run would pass the check
        raise SystemExit(f"--kinds {args.kinds!r} names no run: pick from {', '.join(RUNS)}")
    apply_step_args(args)  # after the checks: a refused command changes no step setting
    from .loading import check_device

    try:
        check_device(args.device)  # a CUDA device on a CPU-only torch raised torch's AssertionError
    except ValueError as e:
        raise SystemExit(f"enginecheck: {e}") from None
    dtype = getattr(torch, args.dtype)
    models = random_pair(args.device, dtype, args.quick)
    results: dict = {}
    for kind in kinds:
        try:
            results[kind] = engine_run(models, args.fast, kind, args.k, args.context, args.tokens)
        except Exception as e:  # noqa: BLE001 - a check: say what failed, run the rest
            results[kind] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(kind, json.dumps(results[kind]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    print("\n".join(lines({k: r for k, r in results.items() if "error" not in r}, None, args.fast)))
    return 0 if all(r.get("equals_target_alone") for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
