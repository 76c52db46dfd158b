"""What a bench run says: per method and prompt class, tokens per second and per target pass,
speedups over the family's target alone and over transformers, token trees against the chain at
their depth (issue 13's goals), the projection onto a cost profile, and the tables that print
them (text, markdown, a plotly page). Pure arithmetic on bench.Record rows: no model runs here.

Method names: `specviz:<drafter>-<k>`, `specviz:tree-<depth>[-n<nodes>][-b<branching>]`,
`hf:<kind>-<k>`, and `specviz:none-plainhead`, `specviz:draft-4-plainhead` (the target's head
left in its own dtype: a family of its own); see bench.methods.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from . import profiles
from .digits import beside, percent
from .engine import MAX_K
from .treedraft import check_tree_settings

if TYPE_CHECKING:
    from .bench import Record

TREE_NAME = re.compile(r"specviz:tree-(\d+)(?:-n(\d+))?(?:-b(\d+))?")
# Issue 13: at depth 4 a tree reaches >= 1.1x the chain's tokens per target pass (k=4) in every
# prompt class, and >= 0.95x its tokens per second at the same depth.
TREE_GOALS = {"depth": 4, "tokens_per_pass": 1.1, "tokens_per_second": 0.95}
ALONE = ("specviz:none", "specviz:none-plainhead", "hf:target")  # each family's target alone
POOLED = "all"  # the summary's class of every prompt


def tree_method(name: str) -> tuple[int, int | None, int | None] | None:
    """(depth, nodes or None, branching or None) of `specviz:tree-<depth>[-n<nodes>][-b<branching>]`
    (no -b: the width adapts, treedraft.TreeProposer.widen); None for any other name; ValueError
    for a tree name out of range."""
    m = TREE_NAME.fullmatch(name)
    if m is None:
        return None
    depth, nodes = int(m[1]), None if m[2] is None else int(m[2])
    branching = None if m[3] is None else int(m[3])
    if not 1 <= depth <= MAX_K:
        raise ValueError(f"{name}: a tree's depth must be in 1..{MAX_K}")
    try:
        check_tree_settings(nodes, branching)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return depth, nodes, branching


def tree_name(depth: int, nodes: int | None = None, branching: int | None = None) -> str:
    return (f"specviz:tree-{depth}" + ("" if nodes is None else f"-n{nodes}")
            + ("" if branching is None else f"-b{branching}"))


def pooled_alpha(rs) -> float | None:
    """α over runs as RunStats.alpha takes it over rounds: accepted / (accepted + rejections),
    summed over the runs; None where no draft was tested (the target alone). Records written
    before they carried rejections: the mean of their α."""
    if any(r.accepted is None or r.rejections is None for r in rs):
        return statistics.fmean(r.alpha for r in rs)
    tested = sum(r.accepted + r.rejections for r in rs)
    return sum(r.accepted for r in rs) / tested if tested else None


def baselines(records: list[Record]) -> dict[str, str]:
    """{method: its family's target alone}, for the methods whose family's target alone ran."""
    alone = {r.family: r.method for r in records if r.method in ALONE}
    return {r.method: alone[r.family] for r in records if r.family in alone}


def summarize(records: list[Record]) -> dict:
    """Per method and class: tokens/s (total tokens / total seconds), speedups, passes, split."""
    out: dict[str, dict[str, dict]] = {}
    classes = sorted({r.cls for r in records}) + [POOLED]
    for method in dict.fromkeys(r.method for r in records):
        out[method] = {}
        for cls in classes:
            rs = [r for r in records if r.method == method and cls in (r.cls, POOLED)]
            if not rs:  # a method that failed before it reached this class (bench.run_bench)
                continue
            tokens, seconds = sum(r.tokens for r in rs), sum(r.seconds for r in rs)
            row = {"tokens_per_second": tokens / seconds if seconds else 0.0, "tokens": tokens,
                   "matches_target": sum(bool(r.matches_target) for r in rs), "runs": len(rs),
                   "compared": sum(r.matches_target is not None for r in rs),
                   "peak_rss_gib": max(r.peak_rss_gib for r in rs)}
            if rs[0].target_passes is not None:
                row["tokens_per_pass"] = tokens / sum(r.target_passes for r in rs)
            if rs[0].alpha is not None:
                row |= {"draft_share": sum(r.draft_seconds for r in rs) / seconds,
                        "target_share": sum(r.target_seconds for r in rs) / seconds,
                        "other_share": sum(r.other_seconds for r in rs) / seconds,
                        "draft_seconds": sum(r.draft_seconds for r in rs),
                        "target_seconds": sum(r.target_seconds for r in rs),
                        "other_seconds": sum(r.other_seconds for r in rs)}
                alpha = pooled_alpha(rs)
                if alpha is not None:
                    row["alpha"] = alpha
            if rs[0].decode_seconds is not None:  # specviz's runs: the rate with the prompt paid
                decode = sum(r.decode_seconds for r in rs)
                row["decode_tokens_per_second"] = (sum(r.decode_tokens for r in rs) / decode
                                                   if decode else None)
            if rs[0].nodes_verified is not None and rs[0].target_passes is not None:
                nodes = sum(r.nodes_verified for r in rs)
                row |= {"nodes_per_round": nodes / sum(r.target_passes for r in rs),
                        "accepted_per_node": sum(r.accepted for r in rs) / nodes if nodes else 0.0}
            out[method][cls] = row
    bases = baselines(records)

    def runs(method: str, cls: str) -> dict[tuple, tuple[int, float]]:
        return by_run([r for r in records if r.method == method and cls in (r.cls, POOLED)],
                      lambda r: r.seconds)

    for method, rows in out.items():
        base = bases.get(method)
        for cls, row in rows.items():
            if cls in out.get(base, {}) and (ratio := shared_ratio(runs(method, cls), runs(base, cls))):
                row["speedup"] = ratio
    for method, rows in out.items():
        for cls, row in rows.items():
            # a target alone, either head, against transformers' target alone
            if method.removesuffix("-plainhead") == "specviz:none" and cls in out.get("hf:target", {}):
                if ratio := shared_ratio(runs(method, cls), runs("hf:target", cls)):
                    row["vs_transformers"] = ratio
                continue
            # each pair of speedups over the runs all four made (the method, its twin and their
            # baselines): a method that failed or was cut short ran fewer (bench.run_bench)
            mine, base, ratios = runs(method, cls), runs(bases.get(method), cls), {}
            for t in counterparts(method, out):
                theirs, their_base = runs(t, cls), runs(bases.get(t), cls)
                keys = mine.keys() & base.keys() & theirs.keys() & their_base.keys()
                a, b = shared_ratio(mine, base, keys), shared_ratio(theirs, their_base, keys)
                if a and b:
                    ratios[t] = (b, a / b)
            if ratios:
                best = max(ratios, key=lambda t: (ratios[t][0], t))  # the best of them counts
                row |= {"vs_transformers": ratios[best][1], "vs_transformers_method": best}
    return out


def by_run(rs: list[Record], seconds) -> dict[tuple, tuple[int, float]]:
    """{(prompt, repeat, class): (tokens, seconds(record))} of runs, summed where several share
    one (synthetic records)."""
    out: dict[tuple, tuple[int, float]] = {}
    for r in rs:
        tokens, secs = out.get((r.prompt, r.repeat, r.cls), (0, 0.0))
        out[r.prompt, r.repeat, r.cls] = (tokens + r.tokens, secs + seconds(r))
    return out


def shared_ratio(mine: dict, theirs: dict, only=None) -> float | None:
    """Tokens a second of `mine` over `theirs` (by_run's {run: (tokens, seconds)}), both over
    the runs they share: a method that failed part way (bench.run_bench) ran fewer prompts than
    its baseline, and a rate over other prompts is no speedup (1.0x on the prompt both ran read
    2.5x). Where both ran the same, the rates of all their runs. None where they share none or
    either takes no time. only: a set of runs to keep to (None: all)."""
    shared = [key for key in mine if key in theirs and (only is None or key in only)]

    def rate(runs: dict) -> float:
        seconds = sum(runs[key][1] for key in shared)
        return sum(runs[key][0] for key in shared) / seconds if seconds else 0.0

    a, b = rate(mine), rate(theirs)
    return a / b if a and b else None


def measured_against(summary: dict) -> str:
    """One line per specviz method measured against more than one transformers method (hybrid and
    adaptive: the best of assisted at any k and prompt lookup; n-gram: of several lookups), naming
    the one that counted in each class, where the table's "vs hf" alone does not say it."""
    lines = []
    for method, rows in summary.items():
        if len(counterparts(method, summary)) < 2:
            continue
        by = {}
        for cls, row in rows.items():
            if "vs_transformers_method" in row:
                by.setdefault(row["vs_transformers_method"], []).append(cls)
        if by:
            lines.append(f"{method}'s vs hf is against " + "; ".join(
                f"{twin} ({', '.join(classes)})" for twin, classes in by.items()))
    return "\n".join(lines)


def counterparts(method: str, out: dict) -> list[str]:
    """The transformers methods a specviz method is measured against (the best of them counts).

    draft-k: assisted generation at the same k with the draft as loaded (what a transformers
    user runs); ngram: prompt lookup; hybrid and adaptive: the better of assisted (any k) and
    prompt lookup. A plain-head method: the same as its refined-head twin.
    """
    method = method.removesuffix("-plainhead")
    if method.startswith("specviz:draft-"):
        return [m for m in ["hf:assisted-" + method.rsplit("-", 1)[1]] if m in out]
    if tree_method(method):
        return [m for m in [f"hf:assisted-{tree_method(method)[0]}"] if m in out]
    if method.startswith("specviz:ngram"):
        return [m for m in out if m.startswith("hf:lookup-")]
    if method.startswith(("specviz:hybrid", "specviz:adaptive")):
        return [m for m in out if m.startswith(("hf:assisted-", "hf:lookup-")) and not m.endswith("-qdraft")]
    return []


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def tree_vs_chain(summary: dict, records: list[Record] | None = None) -> dict:
    """{tree method: {chain, depth, nodes, branching, classes: {class: ratios}, verdicts}}: each
    tree against the chain at its depth, per class, as issue 13's goals read them:
    tokens_per_pass = tree's tokens per target pass / chain's, tokens_per_second likewise, each
    with _ok against TREE_GOALS, and decode_tokens_per_second (tok/s after round 1, the prompt
    paid: shown beside the goal, not judged; None where a run had one round). Each class also
    keeps the figures the ratios divide (tree_tokens_per_pass, chain_tokens_per_pass, and the
    same of tokens_per_second). The verdicts (tokens_per_pass_ok, tokens_per_second_ok) hold in
    every prompt class ("all" aside); `goal_depth` marks the depth the issue states them at.

    records: where given and the tree or its chain failed part way (bench.run_bench), both are
    compared over the runs both made (`shared_runs` counts them; None where they made the same),
    not over rates of different prompts. A class the tree or the chain never reached fails the
    verdicts: the goal was not shown to hold there."""
    out = {}
    for method, rows in summary.items():
        shape = tree_method(method)
        name = shape and f"specviz:draft-{shape[0]}"
        chain = shape and summary.get(name)
        if not chain:
            continue
        tree_rows, chain_rows, shared_runs = rows, chain, None
        if records is not None:
            made = {m: {(r.prompt, r.repeat, r.cls) for r in records if r.method == m}
                    for m in (method, name)}
            if made[method] != made[name]:
                both = made[method] & made[name]
                shared_runs = len(both)
                sub = summarize([r for r in records if r.method in (method, name)
                                 and (r.prompt, r.repeat, r.cls) in both])
                tree_rows, chain_rows = sub.get(method, {}), sub.get(name, {})
        classes = {}
        for cls, row in tree_rows.items():
            base = chain_rows.get(cls, {})
            if not base.get("tokens_per_pass") or not base.get("tokens_per_second") \
                    or "tokens_per_pass" not in row:
                continue
            tpp = row["tokens_per_pass"] / base["tokens_per_pass"]
            tps = row["tokens_per_second"] / base["tokens_per_second"]
            classes[cls] = {"tokens_per_pass": tpp, "tokens_per_second": tps,
                            "decode_tokens_per_second": _ratio(row.get("decode_tokens_per_second"),
                                                               base.get("decode_tokens_per_second")),
                            "tokens_per_pass_ok": tpp >= TREE_GOALS["tokens_per_pass"],
                            "tokens_per_second_ok": tps >= TREE_GOALS["tokens_per_second"]}
            classes[cls] |= {f"{who}_{figure}": r[figure] for who, r in (("tree", row), ("chain", base))
                             for figure in ("tokens_per_pass", "tokens_per_second")}
        # every class either ran, one the other did not reach (it failed) failing: no comparison there
        named = [c for c in dict.fromkeys([*chain, *rows]) if c != POOLED] or [c for c in chain]
        held = {goal: bool(named) and all(c in classes and classes[c][goal] for c in named)
                for goal in ("tokens_per_pass_ok", "tokens_per_second_ok")}
        out[method] = {"chain": name, "depth": shape[0], "nodes": shape[1], "branching": shape[2],
                       "goal_depth": shape[0] == TREE_GOALS["depth"], "shared_runs": shared_runs,
                       "classes": classes} | held
    return out


def tree_table(trees: dict, summary: dict) -> str:
    """Markdown: each tree against the chain at its depth, per class, with pass/fail. The tree /
    chain figures are those tree_vs_chain divided (over the runs both made); the tree's nodes,
    acceptance per node and time split are its own runs' (summary)."""
    ok = lambda b: "pass" if b else "FAIL"  # noqa: E731
    lines = [f"Token trees against the chain at the same depth (issue 13's goals, stated at depth "
             f"{TREE_GOALS['depth']}: tokens per target pass >= {TREE_GOALS['tokens_per_pass']:.2f}x the "
             f"chain's in every class; tok/s >= {TREE_GOALS['tokens_per_second']:.2f}x):", "",
             "| tree | class | tokens/pass tree / chain | ratio | tok/s tree / chain | ratio | decode tok/s "
             "ratio | nodes/round tree / chain | accepted/node | tree's draft / target / other s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for method, t in trees.items():
        for cls, r in t["classes"].items():
            tree, chain = summary[method][cls], summary[t["chain"]].get(cls, {})
            lines.append(
                f"| {method} | {cls} | {r['tree_tokens_per_pass']:.2f} / {r['chain_tokens_per_pass']:.2f} | "
                f"{beside(r['tokens_per_pass'], TREE_GOALS['tokens_per_pass'])}x "
                f"{ok(r['tokens_per_pass_ok'])} | "
                f"{r['tree_tokens_per_second']:.2f} / {r['chain_tokens_per_second']:.2f} | "
                f"{beside(r['tokens_per_second'], TREE_GOALS['tokens_per_second'])}x "
                f"{ok(r['tokens_per_second_ok'])} | "
                f"{_times(r.get('decode_tokens_per_second'))} | "
                f"{tree.get('nodes_per_round', 0):.1f} / {chain.get('nodes_per_round', 0):.1f} | "
                f"{beside(tree.get('accepted_per_node', 0), (0.0, 1.0))} | "
                f"{tree.get('draft_seconds', 0):.2f} / "
                f"{tree.get('target_seconds', 0):.2f} / {tree.get('other_seconds', 0):.3f} |")
        goal = "" if t["goal_depth"] else f" (the goals are stated at depth {TREE_GOALS['depth']})"
        lines.append(f"| {method} | every class{goal} | | {ok(t['tokens_per_pass_ok'])} | | "
                     f"{ok(t['tokens_per_second_ok'])} | | | | |")
        if (n := t.get("shared_runs")) is not None:
            notes.append(f"{method} and {t['chain']} made different runs (one was cut short): their "
                         f"tokens per pass, tok/s and decode ratio are over the {n} run{'s' * (n != 1)} "
                         "both made; nodes, accepted/node and the time split are each one's own runs'.")
    return "\n".join(lines + ([""] + notes if notes else []))


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
    """A speedup as shown: "1.23x" ("0.996x" where two decimals would round it onto the baseline's
    1.00x), or "-" where its baseline did not run."""
    return "-" if ratio is None else f"{beside(ratio, 1.0)}x"


def _speed_rows(summary: dict, classes: list[str], cell) -> list[tuple[str, list[str]]]:
    """[(method, [cell(row, vs) for each class])], vs the 'vs transformers' ratio or None; "-"
    for a class the method has no run of (it failed before it)."""
    return [(method, [cell(rows[c], rows[c].get("vs_transformers")) if c in rows else "-" for c in classes])
            for method, rows in summary.items()]


def classes_of(summary: dict) -> list[str]:
    """The prompt classes any method ran, then the pooled one."""
    return sorted({c for rows in summary.values() for c in rows} - {POOLED}) + [POOLED]


def table(summary: dict) -> str:
    classes = classes_of(summary)
    w = max(22, *map(len, summary))  # the names' column: a longer name (specviz:draft-4-plainhead) kept
    # its row's columns under their heads
    lines = [f"{'method':{w}}" + "".join(f"{c:>24}" for c in classes),
             f"{'':{w}}" + "".join(f"{'tok/s  speedup  vs hf':>24}" for _ in classes)]
    cell = lambda r, vs: (f"{r.get('tokens_per_second', 0):8.2f} {_times(r.get('speedup')):>8} "  # noqa: E731
                          f"{'  - ' if vs is None else beside(vs, 1.0):>6}")
    for method, cells in _speed_rows(summary, classes, cell):
        lines.append(f"{method:{w}}" + "".join(f"{c:>24}" for c in cells))
    against = measured_against(summary)
    return "\n".join(lines) + (f"\n{against}" if against else "")


def differences(records: list[Record]) -> str:
    """Markdown: each greedy output that parted from its family's target alone, and why."""
    parted = [r for r in records if r.matches_target is False]
    return "\n".join(["Outputs that differ from the target alone's:", ""] + [
        f"- {r.method}, prompt #{r.prompt} ({r.cls}), repeat {r.repeat}: from output token "
        f"{r.first_difference + 1}: "  # 1-based, as the CLI and the page count
        f"{r.difference or 'not explained'}" for r in parted]) if parted else ""


def markdown(summary: dict, meta: dict) -> str:
    """Tables for docs/benchmarks.md: speed by class, then the 'all' row's details."""
    classes = classes_of(summary)
    head = "| method | " + " | ".join(classes) + " |\n|" + " --- |" * (len(classes) + 1)
    cell = lambda r, vs: (f"{r.get('tokens_per_second', 0):.2f} tok/s, {_times(r.get('speedup'))}"  # noqa: E731
                          + ("" if vs is None else f", {beside(vs, 1.0)} vs hf"))
    rows = _speed_rows(summary, classes, cell)
    speed = [head] + [f"| {m} | " + " | ".join(cells) + " |" for m, cells in rows]
    detail = ["| method | tokens/pass | α per token | nodes/round | draft / target / engine's other time, of "
              "the wall time (the rest: set-up outside the engine) | peak RSS "
              "| greedy = its family's target alone (specviz's target alone: transformers') |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, rows in summary.items():
        r = rows[POOLED]
        split = (f"{percent(r['draft_share'], 0)} / {percent(r['target_share'], 0)} / "
                 f"{percent(r['other_share'])}" if "draft_share" in r else "-")
        tpp = f"{r['tokens_per_pass']:.2f}" if "tokens_per_pass" in r else "-"
        # a tree's accepted / (accepted + refused siblings) is not a chain's α: its table shows per node
        alpha = beside(r["alpha"], (0.0, 1.0)) if "alpha" in r and not tree_method(method) else "-"
        nodes = f"{r['nodes_per_round']:.1f}" if "nodes_per_round" in r else "-"
        same = (f"{r['matches_target']}/{r['compared']}" if r.get("compared", r["runs"])
                else "the reference (its first run of each prompt)" if method in ALONE
                else "not compared (its target alone did not run)")
        detail.append(f"| {method} | {tpp} | {alpha} | {nodes} | {split} | {r['peak_rss_gib']:.1f} GiB | "
                      f"{same} |")
    m = meta["machine"]
    draft = meta.get("draft")  # and specviz's own where it differs from the one transformers ran (int4)
    drafts = (f"with draft {draft}" if draft else "with no draft model") + (
        f" (specviz: {meta['specviz_draft']})" if meta.get("specviz_draft", draft) != draft else "")
    about = (f"{meta['target']} {drafts}, "
             f"{meta['dtype']} on {meta['device']}, {meta['max_new_tokens']} new tokens, greedy, "
             f"{meta['repeats']} repeat(s); machine: {m['processor']}, {m['cpus']} CPUs, "
             f"{m['memory_gib']} GiB, torch {m['torch']} with {m['threads']} threads, GPU {m['cuda']}.")
    against = measured_against(summary).replace("\n", "  \n")  # markdown's line break
    return (about + "\n\n" + "\n".join(speed) + "\n\n" + (f"{against}\n\n" if against else "")
            + "\n".join(detail) + "\n")


def projected(records: list[Record], profile: profiles.Profile) -> dict:
    """{method: {path: {seconds, tokens_per_second, speedup}}}: this run's passes on a cost profile.

    Each run's draft passes times the profile's C_D plus each target pass's C_T(tokens verified)
    (profiles.project): 1 + k for a chain round, 1 + nodes for a tree round (widths_of); a tree's
    batched draft pass (one per depth) counts as one C_D. Methods whose verify widths were not
    observed (transformers' assisted generation and prompt lookup) are left out; speedups are over
    the family's target alone, projected the same way; a tree's vs_chain is its tokens/s over the
    chain's at its depth on the same path."""
    out: dict[str, dict] = {}
    timed: dict[str, dict] = {}  # method -> {path: by_run(its runs, projected seconds)}
    for method in dict.fromkeys(r.method for r in records):
        rs = [r for r in records if r.method == method]
        if any(r.passes is None for r in rs):
            continue
        tokens, rows, timed[method] = sum(r.tokens for r in rs), {}, {}
        for path in profile.paths:
            try:
                each = by_run(rs, lambda r: profiles.project(r.passes, profile, path))  # noqa: B023
            except ValueError:  # a draft method on a profile path without a draft cost
                continue
            seconds = sum(s for _, s in each.values())
            timed[method][path] = each
            rows[path] = {"seconds": seconds, "tokens_per_second": tokens / seconds if seconds else 0.0,
                          "extrapolated": any(profiles.extrapolated(r.passes, profile, path) for r in rs)}
        out[method] = rows
    bases = baselines(records)

    def versus(method: str, other: str | None, path: str) -> float | None:  # over the runs both made
        theirs = timed.get(other, {}).get(path)
        return None if theirs is None else shared_ratio(timed[method][path], theirs)

    for method, rows in out.items():
        chain = f"specviz:draft-{tree_method(method)[0]}" if tree_method(method) else None
        for path, row in rows.items():
            if (ratio := versus(method, bases.get(method), path)) is not None:
                row["speedup"] = ratio
            if chain and (ratio := versus(method, chain, path)) is not None:
                row["vs_chain"] = ratio
    return out


def projected_table(rows: dict, profile: profiles.Profile) -> str:
    """Markdown: projected seconds, tokens/s and speedup per method on each path of a profile."""
    paths = list(profile.paths)
    lines = [f"Projected onto the cost profile {profile.label} (this run's passes times the profile's "
             "C_D and C_T(tokens verified: 1 + k a chain round, 1 + nodes a tree round; on a path with "
             "compiled steps as the engine pads them, a chain's to its k + 1 and a tree's nodes to a "
             "power of two; a tree's batched draft pass counts one C_D); the prefill counts as one pass, "
             "each model's first at the eager path's price on a compiled path, which runs it eager)"
             + (f". The profile timed {profile.measured}: a pair of other sizes costs more or less a pass"
                if profile.measured else "") + ":",
             "",
             "| method | " + " | ".join(profile.path_label(p) for p in paths) + " |",
             "|" + " --- |" * (len(paths) + 1)]
    for method, by_path in rows.items():
        cells = [f"{r['seconds']:.2f} s, {r['tokens_per_second']:.1f} tok/s, {_times(r.get('speedup'))}"
                 + (f", {_times(r['vs_chain'])} chain" if "vs_chain" in r else "")
                 + ("*" if r.get("extrapolated") else "")
                 if (r := by_path.get(p)) else "-" for p in paths]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if any(r.get("extrapolated") for by_path in rows.values() for r in by_path.values()):
        lines += ["", "* C_T(width) not measured for some of the method's target passes: priced past the "
                      "widest pass its path measured (along the last two widths, or flat at the one, "
                      "verifying free), an estimate"]
    return "\n".join(lines)


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

    classes = classes_of(summary)
    fig = go.Figure()
    for method, rows in summary.items():  # None: a gap
        fig.add_bar(name=method, x=classes, y=[rows.get(c, {}).get("speedup") for c in classes])
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_layout(title=title, yaxis_title="speedup over own baseline", barmode="group",
                      height=600)
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
