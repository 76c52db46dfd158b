"""python -m specviz bench: specviz against transformers `generate` on the same loaded models.

Methods run interleaved (repeat > prompt > method) in one process, so machine drift hits all
alike. Greedy only: every method's output is compared with the target alone's.

Token trees (`specviz:tree-<depth>[-n<nodes>][-b<branching>]`; no -n: sized each round from the
measured verify cost) run beside the chain at the same depth (`specviz:draft-<depth>`), and the
summary holds their ratios tree / chain in tokens per target pass and tokens per second, with
issue 13's goals (TREE_GOALS) marked pass or fail per class.
"""

from __future__ import annotations

import copy
import json
import platform
import re
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import GenerationConfig

from . import profiles, quant
from .compare import first_difference
from .engine import MAX_K, generate
from .loading import Pair
from .metrics import RunStats
from .proposers import kept_of
from .treedraft import BRANCHING, check_tree_settings

PROMPTS = Path(__file__).parent.parent / "assets" / "bench_prompts.json"
DEFAULT_KS = (1, 2, 3, 4, 6, 8)
NGRAM_K = 8  # tokens an n-gram round may propose (specviz and transformers alike)
ADAPTIVE_K = 16  # the most the adaptive drafter may draft in a round
PLAIN_HEAD = "specviz-plainhead"  # specviz with the target's head in its own dtype
TREE_NAME = re.compile(r"specviz:tree-(\d+)(?:-n(\d+))?(?:-b(\d+))?")
# Issue 13: at depth 4 a tree reaches >= 1.1x the chain's tokens per target pass (k=4) in every
# prompt class, and >= 0.95x its tokens per second at the same depth.
TREE_GOALS = {"depth": 4, "tokens_per_pass": 1.1, "tokens_per_second": 0.95}


@dataclass(frozen=True)
class Record:
    method: str
    family: str  # "specviz", "transformers" or PLAIN_HEAD
    k: int | None
    prompt: int
    cls: str
    repeat: int
    tokens: int
    seconds: float
    target_passes: int | None = None
    alpha: float | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None
    other_seconds: float | None = None
    peak_rss_gib: float = 0.0
    matches_target: bool | None = None
    first_difference: int | None = None
    draft_passes: int | None = None
    widths: dict[int, int] | None = None  # target passes by tokens verified (1 + k or 1 + nodes)
    nodes_verified: int | None = None  # drafted tokens the target verified (tree nodes, or each k)
    accepted: int | None = None  # drafted tokens kept

    @property
    def passes(self) -> profiles.Passes | None:
        return None if self.widths is None else profiles.Passes(self.draft_passes or 0, self.widths,
                                                                bool(TREE_NAME.fullmatch(self.method)))

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class PeakRSS:
    """Samples this process's resident memory every 20 ms while a method runs."""

    def __enter__(self):
        import psutil  # not at import time: the CLI imports this module for any command

        self.peak, self._stop = 0, threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def specviz_method(proposer: str, k: int, **tree):
    """tree: nodes and branching of proposer="tree"."""
    def run(pair, ids, n):
        stats = RunStats.of(generate(pair, ids, proposer=proposer, k=k, max_new_tokens=n, **tree))
        return stats.tokens, dict(target_passes=stats.target_passes, alpha=stats.alpha,
                                  draft_seconds=stats.draft_seconds, target_seconds=stats.target_seconds,
                                  other_seconds=stats.overhead_seconds,
                                  draft_passes=stats.draft_passes, widths=widths_of(stats.events),
                                  nodes_verified=stats.nodes_verified, accepted=stats.accepted)
    return run


def widths_of(events) -> dict[int, int]:
    """Target passes by tokens verified: 1 + the round's nodes (a chain's k, a tree's nodes)."""
    return dict(Counter(e.nodes + 1 for e in events))


def tree_method(name: str) -> tuple[int, int | None, int] | None:
    """(depth, nodes or None, branching) of `specviz:tree-<depth>[-n<nodes>][-b<branching>]`;
    None for any other name; ValueError for a tree name out of range."""
    m = TREE_NAME.fullmatch(name)
    if m is None:
        return None
    depth, nodes = int(m[1]), None if m[2] is None else int(m[2])
    branching = BRANCHING if m[3] is None else int(m[3])
    if not 1 <= depth <= MAX_K:
        raise ValueError(f"{name}: a tree's depth must be in 1..{MAX_K}")
    try:
        check_tree_settings(nodes, branching)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return depth, nodes, branching


def tree_name(depth: int, nodes: int | None = None, branching: int = BRANCHING) -> str:
    return (f"specviz:tree-{depth}" + ("" if nodes is None else f"-n{nodes}")
            + ("" if branching == BRANCHING else f"-b{branching}"))


class PassCounter:
    """Counts a model's top-level forward calls: transformers' target passes, prefill included,
    which is how specviz counts its own (round 1 carries the prompt)."""

    def __init__(self, model):
        self.model, self.passes = model, 0

    def __enter__(self):
        self._hook = self.model.register_forward_pre_hook(self._count)
        return self

    def _count(self, module, args):
        self.passes += 1

    def __exit__(self, *exc):
        self._hook.remove()


def plain_greedy(model) -> GenerationConfig:
    """The model's generation config with every logits processor off, so `generate` computes
    the same raw-logit greedy as specviz (a hub config may set repetition_penalty etc.)."""
    config = copy.deepcopy(model.generation_config)
    # neutral values, not None: generate fills a None from the model's own config
    config.update(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0,
                  repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
                  encoder_no_repeat_ngram_size=0, min_length=0, min_new_tokens=0,
                  bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
                  sequence_bias=None, forced_bos_token_id=None, forced_eos_token_id=None,
                  exponential_decay_length_penalty=None, renormalize_logits=False)
    return config


def hf_method(kind: str, k: int):
    def run(pair, ids, n):
        kwargs = dict(max_new_tokens=n, generation_config=plain_greedy(pair.target))
        if kind == "assisted":
            config = pair.draft.generation_config
            config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
            config.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = pair.draft
        elif kind == "lookup":
            kwargs["prompt_lookup_num_tokens"] = k
        with torch.inference_mode(), PassCounter(pair.target) as counter:
            out = pair.target.generate(torch.tensor([ids], device=pair.device), **kwargs)
        alone = {1: counter.passes} if kind == "target" else None  # others' widths are not observed
        return out[0, len(ids):].tolist(), dict(target_passes=counter.passes, draft_passes=0, widths=alone)
    return run


def passes_on_text(prompt: list[int], out: list[int], propose) -> int:
    """Greedy target passes a deterministic drafter needs to write exactly `out` after `prompt`:
    each round keeps the proposed tokens that agree with out, plus the target's own token.

    Run on the target alone's output, it compares drafting rules on one text, free of the
    timing noise and of the bf16 near-ties that make live runs write slightly different texts.
    propose(ids, budget) -> proposed ids."""
    position = passes = 0
    while position < len(out):
        proposal = propose(prompt + out[:position], len(out) - position - 1)
        kept = kept_of(proposal, out[position:])
        position, passes = position + kept + 1, passes + 1
    return passes


def lookup_rules(pair, prompt: list[int], max_new_tokens: int) -> dict:
    """The two n-gram drafters compared by passes_on_text: specviz's, and transformers' prompt
    lookup (its own candidate generator, as generate(prompt_lookup_num_tokens=8) builds it)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from .proposers import NgramProposer

    ngram = NgramProposer(3)  # engine default
    hf = PromptLookupCandidateGenerator(torch.tensor(sorted(pair.eos_ids)), num_output_tokens=NGRAM_K,
                                        max_length=len(prompt) + max_new_tokens)

    def lookup(ids, budget):
        candidates = hf.get_candidates(torch.tensor([ids]))[0][0, len(ids):].tolist()
        return candidates[:budget]

    return {f"specviz:ngram-{NGRAM_K}": lambda ids, budget: ngram.proposal(ids, min(NGRAM_K, budget)),
            f"hf:lookup-{NGRAM_K}": lookup}


def methods(ks, names: set[str] | None, has_draft: bool, quant_draft: bool = False,
            tree_nodes=()) -> dict[str, tuple[str, int | None, object]]:
    """{name: (family, k, runner)} in a fixed order; names filters by name or family prefix.

    Trees: specviz:tree-k (sized from the measured cost) for each k, and specviz:tree-k-n<N> for
    each fixed budget in tree_nodes; any other tree shape by its name in `names`. Each selected
    tree brings the chain at its depth (specviz:draft-<depth>), which its ratios compare with."""
    table = {"hf:target": ("transformers", None, hf_method("target", 0)),
             "specviz:none": ("specviz", None, specviz_method("none", 1)),
             f"hf:lookup-{NGRAM_K}": ("transformers", NGRAM_K, hf_method("lookup", NGRAM_K)),
             f"specviz:ngram-{NGRAM_K}": ("specviz", NGRAM_K, specviz_method("ngram", NGRAM_K))}
    if has_draft:
        for k in ks:
            table[f"hf:assisted-{k}"] = ("transformers", k, hf_method("assisted", k))
            if quant_draft and k == 4:  # transformers on specviz's quantized draft, for transparency
                table[f"hf:assisted-{k}-qdraft"] = ("transformers", k, hf_method("assisted", k))
            table[f"specviz:draft-{k}"] = ("specviz", k, specviz_method("draft", k))
            for nodes in (None, *tree_nodes):
                table[tree_name(k, nodes)] = ("specviz", k, specviz_method("tree", k, nodes=nodes))
        table[f"specviz:hybrid-{NGRAM_K}"] = ("specviz", NGRAM_K, specviz_method("hybrid", NGRAM_K))
        table["specviz:adaptive"] = ("specviz", ADAPTIVE_K, specviz_method("adaptive", ADAPTIVE_K))
    if names:
        table = {m: v for m, v in table.items()
                 if m in names or m.split(":")[0] in names or m.split("-")[0] in names}
        for name in names & {"specviz:none-plainhead", "specviz:draft-4-plainhead"}:
            # the target's head left in its own dtype (no float32 refinement): what it costs
            run = specviz_method(name.split(":")[1].split("-")[0], 4)
            table[name] = (PLAIN_HEAD, 4,
                           lambda pair, ids, n, run=run: run(replace(pair, refine=False), ids, n))
        for name in sorted(names):
            shape = tree_method(name)
            if shape and has_draft and name not in table:
                depth, nodes, branching = shape
                runner = specviz_method("tree", depth, nodes=nodes, branching=branching)
                table[name] = ("specviz", depth, runner)
    for name, (_, depth, _) in list(table.items()):
        chain = f"specviz:draft-{depth}"
        if tree_method(name) and chain not in table:
            table[chain] = ("specviz", depth, specviz_method("draft", depth))
    return table


def check_methods(names: set[str], ks, tree_nodes=()) -> None:
    """ValueError for a --methods entry that selects nothing (checked before the models load)."""
    known = methods(ks, None, True, True, tree_nodes)
    for name in sorted(names):
        if tree_method(name) or name in ("specviz:none-plainhead", "specviz:draft-4-plainhead"):
            continue
        if not any(name in (m, m.split(":")[0], m.split("-")[0]) for m in known):
            raise ValueError(f"--methods: {name[:40]!r} selects no method: give names (specviz:draft-4, "
                             "specviz:tree-4-n16), families (hf, specviz) or kinds (specviz:tree); a "
                             "draft-k or assisted-k name needs its k in --ks")


def run_bench(pair, prompts, ks=DEFAULT_KS, max_new_tokens=64, repeats=1, names=None,
              log=None, spec_pair=None, tree_nodes=()) -> tuple[list[Record], dict[int, list[int]]]:
    """Records of every run, and the target alone's output per prompt index (when a baseline
    ran). spec_pair: the pair specviz methods run on (e.g. with a quantized draft)."""
    spec_pair = spec_pair or pair
    log = log or (lambda line: print(line, flush=True))
    table = methods(ks, names, pair.draft is not None, spec_pair.draft is not pair.draft, tree_nodes)
    encoded = [pair.encode(p["prompt"], chat=True) for p in prompts]
    list(generate(pair, encoded[0], proposer="draft" if pair.draft is not None else "ngram",
                  max_new_tokens=8))  # warm-up
    if any(tree_method(name) for name in table):
        list(generate(spec_pair, encoded[0], proposer="tree", max_new_tokens=8))  # the tree paths too
    reference: dict[tuple[str, int], list[int]] = {}  # (family, prompt) -> target alone's output
    records = []
    for repeat in range(repeats):
        for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True)):
            for name, (family, k, runner) in table.items():
                with PeakRSS() as rss:
                    start = time.perf_counter()
                    on = spec_pair if family != "transformers" or name.endswith("-qdraft") else pair
                    tokens, details = runner(on, ids, max_new_tokens)
                    seconds = time.perf_counter() - start
                if name in ("hf:target", "specviz:none", "specviz:none-plainhead") \
                        and (family, i) not in reference:
                    reference[family, i] = tokens  # each family against its own target alone
                ref = reference.get((family, i))
                diff = None if ref is None else first_difference(tokens, ref)
                rec = Record(name, family, k, i, p["class"], repeat, len(tokens), seconds,
                             peak_rss_gib=rss.peak / 2**30, matches_target=None if ref is None
                             else diff is None, first_difference=diff, **details)
                records.append(rec)
                log(f"[{repeat}] {p['class']:9} #{i} {name:22} {rec.tokens_per_second:6.2f} tok/s"
                    f"{'' if rec.matches_target in (True, None) else f'  differs at {diff}'}")
    texts = {i: t for (_, i), t in sorted(reference.items(), key=lambda r: r[0][0] == "transformers")}
    return records, texts  # prompt -> the target alone's output (transformers' where it ran)


def same_text_passes(pair, prompts, texts: dict[int, list[int]], max_new_tokens: int) -> dict:
    """{class: {drafter: passes}} of the n-gram drafters on the target alone's outputs (texts:
    prompt index -> output ids)."""
    out: dict[str, dict[str, int]] = {}
    for i, text in sorted(texts.items()):
        ids = pair.encode(prompts[i]["prompt"], chat=True)
        row = out.setdefault(prompts[i]["class"], {})
        for name, propose in lookup_rules(pair, ids, max_new_tokens).items():
            row[name] = row.get(name, 0) + passes_on_text(ids, text, propose)
    return out


def summarize(records: list[Record]) -> dict:
    """Per method and class: tokens/s (total tokens / total seconds), speedups, passes, split."""
    out: dict[str, dict[str, dict]] = {}
    classes = sorted({r.cls for r in records}) + ["all"]
    for method in dict.fromkeys(r.method for r in records):
        out[method] = {}
        for cls in classes:
            rs = [r for r in records if r.method == method and cls in (r.cls, "all")]
            tokens, seconds = sum(r.tokens for r in rs), sum(r.seconds for r in rs)
            row = {"tokens_per_second": tokens / seconds if seconds else 0.0, "tokens": tokens,
                   "matches_target": sum(bool(r.matches_target) for r in rs), "runs": len(rs),
                   "compared": sum(r.matches_target is not None for r in rs),
                   "peak_rss_gib": max(r.peak_rss_gib for r in rs)}
            if rs[0].target_passes is not None:
                row["tokens_per_pass"] = tokens / sum(r.target_passes for r in rs)
            if rs[0].alpha is not None:
                row |= {"alpha": statistics.fmean(r.alpha for r in rs),
                        "draft_share": sum(r.draft_seconds for r in rs) / seconds,
                        "target_share": sum(r.target_seconds for r in rs) / seconds,
                        "other_share": sum(r.other_seconds for r in rs) / seconds,
                        "draft_seconds": sum(r.draft_seconds for r in rs),
                        "target_seconds": sum(r.target_seconds for r in rs),
                        "other_seconds": sum(r.other_seconds for r in rs)}
            if rs[0].nodes_verified is not None and rs[0].target_passes is not None:
                nodes = sum(r.nodes_verified for r in rs)
                row |= {"nodes_per_round": nodes / sum(r.target_passes for r in rs),
                        "accepted_per_node": sum(r.accepted for r in rs) / nodes if nodes else 0.0}
            out[method][cls] = row
    for method, rows in out.items():
        base = out.get("specviz:none" if method.startswith("specviz") else "hf:target", {})
        for cls, row in rows.items():
            if cls in base:
                row["speedup"] = row["tokens_per_second"] / base[cls]["tokens_per_second"]
    for method, rows in out.items():
        for cls, row in rows.items():
            if method == "specviz:none" and cls in out.get("hf:target", {}):
                row["vs_transformers"] = row["tokens_per_second"] / out["hf:target"][cls]["tokens_per_second"]
                continue
            twins = [out[t][cls]["speedup"] for t in counterparts(method, out) if cls in out[t]]
            if twins and "speedup" in row:
                row["vs_transformers"] = row["speedup"] / max(twins)
    return out


def counterparts(method: str, out: dict) -> list[str]:
    """The transformers methods a specviz method is measured against (the best of them counts).

    draft-k: assisted generation at the same k with the draft as loaded (what a transformers
    user runs); ngram: prompt lookup; hybrid and adaptive: the better of assisted (any k) and
    prompt lookup.
    """
    if method.startswith("specviz:draft-"):
        return [m for m in ["hf:assisted-" + method.rsplit("-", 1)[1]] if m in out]
    if tree_method(method):
        return [m for m in [f"hf:assisted-{tree_method(method)[0]}"] if m in out]
    if method.startswith("specviz:ngram"):
        return [m for m in [f"hf:lookup-{NGRAM_K}"] if m in out]
    if method.startswith(("specviz:hybrid", "specviz:adaptive")):
        return [m for m in out if m.startswith(("hf:assisted-", "hf:lookup-")) and not m.endswith("-qdraft")]
    return []


def tree_vs_chain(summary: dict) -> dict:
    """{tree method: {chain, depth, nodes, branching, classes: {class: ratios}, verdicts}}: each
    tree against the chain at its depth, per class, as issue 13's goals read them:
    tokens_per_pass = tree's tokens per target pass / chain's, tokens_per_second likewise, each
    with _ok against TREE_GOALS. The verdicts (tokens_per_pass_ok, tokens_per_second_ok) hold in
    every prompt class ("all" aside); `goal_depth` marks the depth the issue states them at."""
    out = {}
    for method, rows in summary.items():
        shape = tree_method(method)
        chain = shape and summary.get(f"specviz:draft-{shape[0]}")
        if not chain:
            continue
        classes = {}
        for cls, row in rows.items():
            base = chain.get(cls, {})
            if not base.get("tokens_per_pass") or not base.get("tokens_per_second") \
                    or "tokens_per_pass" not in row:
                continue
            tpp = row["tokens_per_pass"] / base["tokens_per_pass"]
            tps = row["tokens_per_second"] / base["tokens_per_second"]
            classes[cls] = {"tokens_per_pass": tpp, "tokens_per_second": tps,
                            "tokens_per_pass_ok": tpp >= TREE_GOALS["tokens_per_pass"],
                            "tokens_per_second_ok": tps >= TREE_GOALS["tokens_per_second"]}
        named = [c for c in classes if c != "all"] or list(classes)
        held = {goal: bool(named) and all(classes[c][goal] for c in named)
                for goal in ("tokens_per_pass_ok", "tokens_per_second_ok")}
        out[method] = {"chain": f"specviz:draft-{shape[0]}", "depth": shape[0], "nodes": shape[1],
                       "branching": shape[2], "goal_depth": shape[0] == TREE_GOALS["depth"],
                       "classes": classes} | held
    return out


def tree_table(trees: dict, summary: dict) -> str:
    """Markdown: each tree against the chain at its depth, per class, with pass/fail."""
    ok = lambda b: "pass" if b else "FAIL"  # noqa: E731
    lines = [f"Token trees against the chain at the same depth (issue 13's goals, stated at depth "
             f"{TREE_GOALS['depth']}: tokens per target pass >= {TREE_GOALS['tokens_per_pass']:.2f}x the "
             f"chain's in every class; tok/s >= {TREE_GOALS['tokens_per_second']:.2f}x):", "",
             "| tree | class | tokens/pass tree / chain | ratio | tok/s tree / chain | ratio | nodes/round "
             "tree / chain | accepted/node | tree's draft / target / other s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, t in trees.items():
        for cls, r in t["classes"].items():
            tree, chain = summary[method][cls], summary[t["chain"]][cls]
            lines.append(
                f"| {method} | {cls} | {tree['tokens_per_pass']:.2f} / {chain['tokens_per_pass']:.2f} | "
                f"{r['tokens_per_pass']:.2f}x {ok(r['tokens_per_pass_ok'])} | "
                f"{tree['tokens_per_second']:.2f} / {chain['tokens_per_second']:.2f} | "
                f"{r['tokens_per_second']:.2f}x {ok(r['tokens_per_second_ok'])} | "
                f"{tree.get('nodes_per_round', 0):.1f} / {chain.get('nodes_per_round', 0):.1f} | "
                f"{tree.get('accepted_per_node', 0):.2f} | {tree.get('draft_seconds', 0):.2f} / "
                f"{tree.get('target_seconds', 0):.2f} / {tree.get('other_seconds', 0):.3f} |")
        goal = "" if t["goal_depth"] else f" (the goals are stated at depth {TREE_GOALS['depth']})"
        lines.append(f"| {method} | every class{goal} | | {ok(t['tokens_per_pass_ok'])} | | "
                     f"{ok(t['tokens_per_second_ok'])} | | | |")
    return "\n".join(lines)


def per_prompt(records: list[Record]) -> dict[str, dict[int, dict]]:
    """{method: {prompt: row}} over the repeats: tokens per target pass, tok/s, nodes verified per
    round and the draft / target / other seconds (specviz methods)."""
    out: dict[str, dict[int, dict]] = {}
    for method in dict.fromkeys(r.method for r in records):
        out[method] = {}
        for prompt in sorted({r.prompt for r in records if r.method == method}):
            rs = [r for r in records if r.method == method and r.prompt == prompt]
            tokens, seconds = sum(r.tokens for r in rs), sum(r.seconds for r in rs)
            row = {"class": rs[0].cls, "runs": len(rs), "tokens": tokens, "seconds": seconds,
                   "tokens_per_second": tokens / seconds if seconds else 0.0}
            if rs[0].target_passes is not None:
                row["tokens_per_pass"] = tokens / max(sum(r.target_passes for r in rs), 1)
                if rs[0].nodes_verified is not None:
                    row["nodes_per_round"] = sum(r.nodes_verified for r in rs) / max(
                        sum(r.target_passes for r in rs), 1)
            if rs[0].draft_seconds is not None:
                row |= {"draft_seconds": sum(r.draft_seconds for r in rs),
                        "target_seconds": sum(r.target_seconds for r in rs),
                        "other_seconds": sum(r.other_seconds for r in rs)}
            out[method][prompt] = row
    return out


def per_prompt_table(prompts: dict, methods: list[str]) -> str:
    """Markdown: the given methods prompt by prompt."""
    lines = ["Per prompt (summed over the repeats):", "",
             "| method | prompt | class | tokens/pass | tok/s | nodes/round | draft / target / other s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for method in methods:
        for prompt, r in prompts.get(method, {}).items():
            split = (f"{r['draft_seconds']:.2f} / {r['target_seconds']:.2f} / {r['other_seconds']:.3f}"
                     if "draft_seconds" in r else "-")
            nodes = f"{r['nodes_per_round']:.1f}" if "nodes_per_round" in r else "-"
            lines.append(f"| {method} | #{prompt} | {r['class']} | {r.get('tokens_per_pass', 0):.2f} | "
                         f"{r['tokens_per_second']:.2f} | {nodes} | {split} |")
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    """A speedup as shown: "1.23x", or "-" where its baseline did not run."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def _speed_rows(summary: dict, classes: list[str], cell) -> list[tuple[str, list[str]]]:
    """[(method, [cell(row, vs) for each class])], vs the 'vs transformers' ratio or None."""
    return [(method, [cell(rows.get(c, {}), rows.get(c, {}).get("vs_transformers")) for c in classes])
            for method, rows in summary.items()]


def table(summary: dict) -> str:
    classes = [c for c in next(iter(summary.values()))]
    lines = [f"{'method':22}" + "".join(f"{c:>24}" for c in classes),
             f"{'':22}" + "".join(f"{'tok/s  speedup  vs hf':>24}" for _ in classes)]
    cell = lambda r, vs: (f"{r.get('tokens_per_second', 0):8.2f} {_times(r.get('speedup')):>8} "  # noqa: E731
                          f"{'  - ' if vs is None else f'{vs:.2f}':>6}")
    for method, cells in _speed_rows(summary, classes, cell):
        lines.append(f"{method:22}" + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def markdown(summary: dict, meta: dict) -> str:
    """Tables for docs/benchmarks.md: speed by class, then the 'all' row's details."""
    classes = [c for c in next(iter(summary.values())) if c != "all"] + ["all"]
    head = "| method | " + " | ".join(classes) + " |\n|" + " --- |" * (len(classes) + 1)
    cell = lambda r, vs: (f"{r.get('tokens_per_second', 0):.2f} tok/s, {_times(r.get('speedup'))}"  # noqa: E731
                          + ("" if vs is None else f", {vs:.2f} vs hf"))
    rows = _speed_rows(summary, classes, cell)
    speed = [head] + [f"| {m} | " + " | ".join(cells) + " |" for m, cells in rows]
    detail = ["| method | tokens/pass | α per token | nodes/round | draft / target / other time | peak RSS "
              "| greedy = its family's target alone |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, rows in summary.items():
        r = rows["all"]
        split = (f"{r['draft_share']:.0%} / {r['target_share']:.0%} / {r['other_share']:.1%}"
                 if "draft_share" in r else "-")
        tpp = f"{r['tokens_per_pass']:.2f}" if "tokens_per_pass" in r else "-"
        alpha = f"{r['alpha']:.2f}" if "alpha" in r else "-"
        nodes = f"{r['nodes_per_round']:.1f}" if "nodes_per_round" in r else "-"
        same = (f"{r['matches_target']}/{r['compared']}" if r.get("compared", r["runs"])
                else "not compared (its target alone did not run)")
        detail.append(f"| {method} | {tpp} | {alpha} | {nodes} | {split} | {r['peak_rss_gib']:.1f} GiB | "
                      f"{same} |")
    m = meta["machine"]
    about = (f"{meta['target']} with draft {meta['draft']} (specviz: {meta.get('specviz_draft')}), "
             f"{meta['dtype']} on {meta['device']}, {meta['max_new_tokens']} new tokens, greedy, "
             f"{meta['repeats']} repeat(s); machine: {m['processor']}, {m['cpus']} CPUs, "
             f"{m['memory_gib']} GiB, torch {m['torch']} with {m['threads']} threads, GPU {m['cuda']}.")
    return about + "\n\n" + "\n".join(speed) + "\n\n" + "\n".join(detail) + "\n"


def projected(records: list[Record], profile: profiles.Profile) -> dict:
    """{method: {path: {seconds, tokens_per_second, speedup}}}: this run's passes on a cost profile.

    Each run's draft passes times the profile's C_D plus each target pass's C_T(tokens verified)
    (profiles.project): 1 + k for a chain round, 1 + nodes for a tree round (widths_of); a tree's
    batched draft pass (one per depth) counts as one C_D. Methods whose verify widths were not
    observed (transformers' assisted generation and prompt lookup) are left out; speedups are over
    the family's target alone, projected the same way; a tree's vs_chain is its tokens/s over the
    chain's at its depth on the same path."""
    out: dict[str, dict] = {}
    for method in dict.fromkeys(r.method for r in records):
        rs = [r for r in records if r.method == method]
        if any(r.passes is None for r in rs):
            continue
        tokens, rows = sum(r.tokens for r in rs), {}
        for path in profile.paths:
            try:
                seconds = sum(profiles.project(r.passes, profile, path) for r in rs)
            except ValueError:  # a draft method on a profile path without a draft cost
                continue
            rows[path] = {"seconds": seconds, "tokens_per_second": tokens / seconds if seconds else 0.0}
        out[method] = rows
    for method, rows in out.items():
        base = out.get("specviz:none" if method.startswith("specviz") else "hf:target", {})
        for path, row in rows.items():
            if path in base and base[path]["tokens_per_second"]:
                row["speedup"] = row["tokens_per_second"] / base[path]["tokens_per_second"]
            chain = out.get(f"specviz:draft-{tree_method(method)[0]}", {}) if tree_method(method) else {}
            if path in chain and chain[path]["tokens_per_second"]:
                row["vs_chain"] = row["tokens_per_second"] / chain[path]["tokens_per_second"]
    return out


def projected_table(rows: dict, profile: profiles.Profile) -> str:
    """Markdown: projected seconds, tokens/s and speedup per method on each path of a profile."""
    paths = list(profile.paths)
    lines = [f"Projected onto the cost profile {profile.label} (this run's passes times the profile's "
             "C_D and C_T(tokens verified: 1 + k a chain round, 1 + nodes a tree round; a tree's "
             "batched draft pass counts one C_D); the prefill counts as one pass):", "",
             "| method | " + " | ".join(paths) + " |", "|" + " --- |" * (len(paths) + 1)]
    for method, by_path in rows.items():
        cells = [f"{r['seconds']:.2f} s, {r['tokens_per_second']:.1f} tok/s, {_times(r.get('speedup'))}"
                 + (f", {r['vs_chain']:.2f}x chain" if "vs_chain" in r else "")
                 if (r := by_path.get(p)) else "-" for p in paths]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_profile(value: str) -> profiles.Profile:
    """--profile: a shipped profile's name (assets/profiles/) or a profile file."""
    return profiles.load_shipped(value) if value in profiles.shipped() else profiles.load(Path(value))


def same_text_table(same_text: dict) -> str:
    """Markdown: target passes of each n-gram drafter on the target alone's text, per class."""
    classes = sorted(same_text)
    names = list(next(iter(same_text.values())))
    lines = ["Target passes to write the target alone's own output, n-gram drafters (fewer is better):",
             "", "| drafter | " + " | ".join(classes) + " | all |", "|" + " --- |" * (len(classes) + 2)]
    for name in names:
        counts = [same_text[c][name] for c in classes]
        lines.append(f"| {name} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    return "\n".join(lines)


def html_report(summary: dict, path: Path, title: str) -> None:
    import plotly.graph_objects as go

    classes = [c for c in next(iter(summary.values()))]
    fig = go.Figure()
    for method, rows in summary.items():
        fig.add_bar(name=method, x=classes, y=[rows[c].get("speedup", 0) for c in classes])
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_layout(title=title, yaxis_title="speedup over own baseline", barmode="group",
                      height=600)
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True))


def machine() -> dict:
    import psutil

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def add_bench_args(p) -> None:
    from .cli import _add_model_args

    _add_model_args(p)
    p.add_argument("--prompts", default=str(PROMPTS), help="JSON list of {class, prompt}")
    p.add_argument("--methods", help="comma list: names (specviz:draft-4, specviz:tree-4, "
                                     "specviz:tree-4-n16-b4), families (hf, specviz) or kinds "
                                     "(specviz:draft, specviz:tree)")
    p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)),
                   help="k values for draft methods (and tree depths)")
    p.add_argument("--tree-nodes", default="", help="comma list of fixed tree budgets: adds "
                                                    "specviz:tree-<k>-n<nodes> for each k")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", dest="json_path", help="write records and summary here")
    p.add_argument("--html", dest="html_path", help="write a plotly report here")
    p.add_argument("--markdown", dest="markdown_path", help="write markdown tables here")
    p.add_argument("--quick", action="store_true", help="one prompt per class, k=4, 32 tokens")
    p.add_argument("--profile", help="also project each method onto a cost profile (a file written by "
                                     "`gpucheck`, or a name in assets/profiles/)")


def cmd_bench(args) -> int:
    from .cli import load_from_args

    try:
        prompts = json.loads(Path(args.prompts).read_text())
        ks = tuple(int(k) for k in args.ks.split(","))
        tree_nodes = tuple(int(n) for n in args.tree_nodes.split(",") if n.strip())
    except (OSError, ValueError) as e:
        raise ValueError(f"bad --prompts, --ks or --tree-nodes: {e}") from e
    if any(not 1 <= k <= MAX_K for k in ks) or args.max_new_tokens < 1 or args.repeats < 1:
        raise ValueError(f"--ks must be in 1..{MAX_K}, --max-new-tokens and --repeats >= 1")
    for nodes in tree_nodes:
        check_tree_settings(nodes, BRANCHING)
    if args.quick:
        seen: set[str] = set()
        prompts = [p for p in prompts if not (p["class"] in seen or seen.add(p["class"]))]
        ks, args.max_new_tokens = (4,), min(args.max_new_tokens, 32)
    names = set(args.methods.split(",")) if args.methods else None
    if names:
        check_methods(names, ks, tree_nodes)
    profile = load_profile(args.profile) if args.profile else None  # fail before the model load
    quantize, args.draft_quant = args.draft_quant, "none"
    pair = load_from_args(args)  # transformers runs the draft as loaded
    spec_pair = pair
    if pair.draft is not None and quant.wanted(pair.draft, quantize):
        draft = copy.deepcopy(pair.draft)
        label = quant.apply(draft, quantize)
        spec_pair = Pair(pair.target, pair.tokenizer, draft, pair.target_name,
                         f"{pair.draft_name} ({label})", pair.chat_default)
    records, texts = run_bench(pair, prompts, ks, args.max_new_tokens, args.repeats, names,
                               spec_pair=spec_pair, tree_nodes=tree_nodes)
    summary = summarize(records)
    trees, prompt_rows = tree_vs_chain(summary), per_prompt(records)
    shown = list(dict.fromkeys(m for t, row in trees.items() for m in (t, row["chain"])))
    tree_text = (tree_table(trees, summary) + "\n\n" + per_prompt_table(prompt_rows, shown)
                 if trees else "")
    same_text = same_text_passes(pair, prompts, texts, args.max_new_tokens)
    print(table(summary))
    if tree_text:
        print(tree_text)
    if same_text:
        print(same_text_table(same_text))
    onto = projected(records, profile) if profile else None
    if onto:
        print(projected_table(onto, profile))
    meta = {"machine": machine(), "target": pair.target_name, "draft": pair.draft_name,
            "specviz_draft": spec_pair.draft_name,
            "dtype": str(pair.dtype), "device": str(pair.device), "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "ks": list(ks), "tree_nodes": list(tree_nodes)}
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"meta": meta, "summary": summary, "same_text_passes": same_text,
             "tree_goals": TREE_GOALS, "tree_vs_chain": trees, "per_prompt": prompt_rows,
             "records": [asdict(r) for r in records]}
            | ({"profile": profile.to_dict(), "projected": onto} if profile else {}), indent=1))
    if args.markdown_path:
        Path(args.markdown_path).write_text(markdown(summary, meta) + (
            "\n" + tree_text + "\n" if tree_text else "") + (
            "\n" + same_text_table(same_text) + "\n" if same_text else "") + (
            "\n" + projected_table(onto, profile) + "\n" if onto else ""))
    if args.html_path:
        html_report(summary, Path(args.html_path), f"specviz bench: {pair.target_name}")
    return 0
