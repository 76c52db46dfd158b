"""Views for the Exactness lab and the k explorer tabs: plain HTML strings and plotly figures."""

from __future__ import annotations

import html
import time
from collections import Counter

import plotly.graph_objects as go
import torch

from . import explorer, lab, profiles
from .arch import input_rows, output_rows
from .detok import token_label
from .digits import beside, share, sig3
from .figures import BASE, PAGE_HALF_PX, PAGE_PX, SPEC, THEORY, _layout
from .lm import CachedLM
from .render import NBSP, to_html
from .sampling import SamplingParams, process
from .untrusted import gc_paused

TOP = 8  # tokens shown by name; the rest is summed into "other"
# the Monte Carlo's variants are told apart by a bar pattern each, not by plotly's colours alone
# (under red-green colour blindness two pairs of them were one colour): plotly's seven shapes over
# the bar's colour, then the same in the bar's colour over white
PATTERNS = tuple(dict(shape=shape, fillmode=mode) for mode in ("overlay", "replace")
                 for shape in ("/", "\\", "x", "-", "|", "+", "."))
# and each of its bars edged in EDGE (10.3:1 on the plot's white): plotly's colours for them run down
# to 1.4:1 (#B6E880) on it, and a bar in a pattern over white ("replace") had a white edge, its
# top no line at all
EDGE = dict(color="#374151", width=1)


def flatten(q: torch.Tensor, factor: float = 0.5) -> torch.Tensor:
    """q^factor renormalised: the same draft at 1/factor times the temperature."""
    r = q.clamp_min(0) ** factor
    return r / r.sum()


def example() -> tuple[torch.Tensor, torch.Tensor, list[str], int]:
    """(p, q, labels, drafted token) for the built-in A, B, C example."""
    p, q = torch.tensor(lab.EXAMPLE_P, dtype=torch.float64), torch.tensor(lab.EXAMPLE_Q, dtype=torch.float64)
    return p, q, list(lab.EXAMPLE_LABELS), 0


def _read(lm: CachedLM, prefix: list[int], name: str, deadline: float | None):
    """CachedLM.prefill of a long context, a progress line after each pass; ValueError past the
    deadline (time.monotonic())."""
    for read in lm.prefill(prefix):
        if deadline is not None and time.monotonic() > deadline:
            raise ValueError("stopped at this deployment's time limit per job while reading the round's "
                             "context (operators: SPECVIZ_MAX_JOB_SECONDS): pick an earlier round")
        yield f"Reading the round's context into the {name}: {read} of {len(prefix) - 1} tokens"


@torch.inference_mode()
def from_round_steps(pair, trace, round_number: int, max_tokens: int = 4096,
                     max_prompt_tokens: int | None = None, deadline: float | None = None):
    """p and q at the first drafted position of a round of the last run (each model reads the
    round's context as the engine does: CachedLM, a long one in passes of lm.PREFILL_CHUNK, a
    progress line yielded after each so that Stop and the deadline act between them); returns
    (p, q, labels, drafted, note).

    Only with the pair that made the trace (same target, draft and dtype), a prefix of at most
    max_tokens (prompt plus earlier rounds; the prompt at most max_prompt_tokens) and ids the pair
    knows. Greedy runs have one-hot p and q, so the lab looks at temperature 1 there; an n-gram
    round (the n-gram and hybrid drafters) has a one-hot q on the drafted token, as the rule used
    (both said in the note).
    """
    def pair_name(models: dict) -> str:
        return (f"{str(models.get('target'))[:60]} with {str(models.get('draft'))[:60]} "
                f"({str(models.get('dtype'))[:12]})")

    def number(settings: dict, name: str, default: float, lo: float, hi: float) -> float:
        value = settings.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise ValueError(f"this trace's {name} ({str(value)[:20]!r}) is not in {lo:g}..{hi:g}: "
                             "run it here first")
        return value

    events = trace.events
    if pair is None:
        raise ValueError("no pair is loaded: run something first, then come back")
    from .store import made_here, pair_models  # the names a run here writes into its trace

    if not made_here(trace, pair):
        made, here = trace.models if isinstance(trace.models, dict) else {}, pair_models(pair)
        other = ""
        if pair_name(made) == pair_name(here):  # the same short names: their folders differ
            other = (" from other folders of the same names" if "source" in made else
                     " (this trace is older than specviz's marks of which folder a name was: it "
                     "cannot tell them apart)")
        raise ValueError(f"this trace was made with {pair_name(made)}, but the loaded pair is "
                         f"{pair_name(here)}{other} (the server holds one pair at a time, and "
                         "the last run loads it, perhaps another visitor's): "
                         "run it here first (Run tab, same settings), then look at its rounds")
    if isinstance(round_number, bool) or not isinstance(round_number, int) \
            or not 1 <= round_number <= len(events):
        raise ValueError(f"pick a round in 1..{len(events)}")
    event = events[round_number - 1]
    if not event.draft_tokens:
        raise ValueError(f"round {round_number} drafted nothing: pick another round")
    candidates = [n.token for n in event.tree if n.parent == -1]  # a tree round's root candidates
    one_hot_q = event.source == "ngram" or bool(candidates)  # both try drafts as one-hot
    if pair.draft is None and not one_hot_q:
        raise ValueError("this round was drafted by a draft model and the loaded pair has none: "
                         "load the run's pair with its draft, then come back")
    if max_prompt_tokens is not None and len(trace.prompt_ids) > max_prompt_tokens:
        raise ValueError(f"the trace's prompt is {len(trace.prompt_ids)} tokens; this deployment "
                         f"allows {max_prompt_tokens} (operators: SPECVIZ_MAX_PROMPT_TOKENS): "
                         "pick a trace with a shorter prompt")
    prefix = list(trace.prompt_ids) + [t for e in events[: round_number - 1] for t in e.new_tokens]
    limit = min(max_tokens, pair.max_positions or max_tokens)
    if len(prefix) > limit:
        raise ValueError(f"round {round_number} starts after {len(prefix)} tokens; the lab reads at "
                         f"most {limit} here: pick an earlier round")
    drafted = candidates[0] if candidates else event.draft_tokens[0]  # the first draft the rule tried
    if any(not 0 <= t < pair.vocab_size for t in [*prefix, *candidates, drafted]):
        raise ValueError(f"this trace holds token ids outside the loaded pair's vocabulary "
                         f"(0..{pair.vocab_size - 1}): it was not made with this pair; run it here first")
    s = trace.settings if isinstance(trace.settings, dict) else {}
    run_temperature = number(s, "temperature", 0.0, 0.0, 100.0)
    if 0 < run_temperature < 0.01:  # logits / temperature would overflow the softmax
        raise ValueError(f"this trace's temperature {run_temperature:g} is below 0.01: run it here first")
    top_k = number(s, "top_k", 0, 0, 2**20)
    top_p = number(s, "top_p", 1.0, 1e-9, 1.0)
    temperature = float(run_temperature) or 1.0
    params = SamplingParams(temperature, int(top_k), float(top_p))
    # the context read as the engine reads it (CachedLM: a long one's prompt read, the target's
    # refined head), so p and q are the run's up to rounding, and a 2,048-token context costs what
    # a run's does. The run read the rounds after its prompt in passes of their own; read here with
    # the prompt (on a CPU without bfloat16 instructions, on the prompt's float32 kernel), their keys
    # and values can differ by a rounding step in bfloat16 (far less in float32), p and q with them.
    target = CachedLM(pair.target, pair.vocab_size, refine=pair.refine)
    yield from _read(target, prefix, "target", deadline)
    logits_p = target.forward(prefix)[0]  # [vocab]
    p = process(logits_p, params).double().cpu()  # [vocab]
    if one_hot_q:
        q = torch.zeros_like(p)
        q[drafted] = 1.0
    else:
        if max(prefix) >= input_rows(pair.draft):
            raise ValueError("the draft cannot read this round's context (an id past its vocabulary): "
                             "it drafted nothing there; pick another round")
        rows = min(pair.vocab_size, output_rows(pair.draft))
        draft = CachedLM(pair.draft, rows, refine=False)
        yield from _read(draft, prefix, "draft", deadline)
        logits_q = draft.forward(prefix)[0]  # [<=vocab]
        q = process(logits_q, params).double().cpu()  # ids the draft cannot produce get q = 0:
        q = torch.nn.functional.pad(q, (0, pair.vocab_size - len(q)))  # [vocab]
    kept = min(1.0, float(p[candidates].sum()))  # a float32 distribution's sum can pass 1 by rounding
    truncated = ", ".join([f"top-k {int(top_k)}"] * bool(top_k) + [f"top-p {top_p:g}"] * (top_p < 1))
    note = (f"round {round_number}, draft position 1, temperature {temperature:g}"
            + (f", {truncated}" if truncated else "")
            + (" (the run was greedy: one-hot p and q, so the lab looks at temperature 1"
               + (", with the top-k and top-p its settings hold" if truncated else "") + ")"
               if not run_temperature else "")
            + ("; an n-gram round: q is one-hot on the drafted token (a deterministic drafter), "
               "as the rule used it" if event.source == "ngram" else "")
            + (f"; a tree round: the walk tries the root's {len(candidates)} candidates one at a time, "
               "each as a one-hot draft, so q is one-hot on the first; one of them is kept with "
               f"probability Σ p(x) over the candidates = {share(kept)} (the tree "
               "variants below try them all)" if candidates else ""))
    return p, q, [], drafted, note


def token_name(i: int, labels, tokenizer=None) -> str:
    """Token i as the lab names it: the built-in example's label, else the token's own label
    (detok.token_label: a partial character by its bytes), else its id."""
    if labels:
        return labels[i]
    return token_label(tokenizer, i) if tokenizer is not None else str(i)


def _top(p, q, labels, tokenizer=None) -> tuple[list[int], list[str]]:
    order = torch.unique(torch.cat([p.topk(min(TOP, len(p))).indices, q.topk(min(TOP, len(q))).indices]))
    ids = sorted(order.tolist(), key=lambda i: -float(p[i] + q[i]))[:TOP]
    ids = [i for i in ids if p[i] + q[i] > 0] or ids[:1]  # a top-k run's zero-mass ids crowded the axis
    names = [token_name(i, labels, tokenizer) for i in ids]
    seen = Counter(names)  # two tokens of one text (a tokenizer's duplicates): one bar each
    names = [f"{n} #{i}" if seen[n] > 1 else n for n, i in zip(names, ids, strict=True)]
    return ids, [html.escape(n, quote=False) for n in names]  # plotly reads tags in its labels


def pvalue_text(p: float) -> str:
    """A p-value beside the 0.001 bar; one that underflows float64 is "< 1e-300", not "0"."""
    return "< 1e-300" if p < 1e-300 else beside(p, 1e-3, 3, "g")


def _bars(ids, series: dict[str, torch.Tensor]) -> list[tuple[str, list[float]]]:
    out = []
    for name, dist in series.items():
        shown = [float(dist[i]) for i in ids]
        if len(ids) < len(dist):
            shown.append(max(0.0, float(dist.sum()) - sum(shown)))
        out.append((name, shown))
    return out


def residual_name(m: lab.Masses) -> str:
    """The residual's legend: it says where there is none (p <= q everywhere, never drawn)."""
    name = "normalize(max(0, p - q)): residual"
    return name + (" (none: p ≤ q everywhere)" if float(m.shown_residual.sum()) == 0 else "")


def masses_figure(p, q, labels, tokenizer=None) -> go.Figure:
    ids, names = _top(p, q, labels, tokenizer)
    masses = lab.Masses(p, q)
    x = names + (["other"] if len(ids) < len(p) else [])
    fig = go.Figure()
    series = {"target p": (p, SPEC, ""), "draft q": (q, BASE, "/"),
              "min(p, q): accepted mass": (masses.accepted, "#16a34a", "."),
              residual_name(masses): (masses.shown_residual, THEORY, "x")}
    for name, ys in _bars(ids, {k: v[0] for k, v in series.items()}):  # a pattern each too
        fig.add_bar(name=name, x=x, y=ys, marker=dict(color=series[name][1], pattern_shape=series[name][2]))
    fig.update_layout(barmode="group")
    return _layout(fig, "p, q, accepted mass and residual", "token", "probability", PAGE_HALF_PX)


def masses_html(p, q, drafted: int, label: str, note: str = "") -> str:
    m = lab.Masses(p, q)
    return (f"<div class='specviz-lab'>{html.escape(note)}<br>Drafted token {html.escape(label)}: "
            f"p(x)={share(p[drafted])}, q(x)={share(q[drafted])}, accept probability "
            f"min(1, p/q) = <b>{share(m.accept_probability(drafted))}</b>.<br>Expected "
            f"acceptance Σ min(p, q) = 1 − TV(p, q) = <b>{share(m.expected_acceptance)}</b>."
            "</div>")


def tree_root(trace, round_number: int) -> list[int]:
    """The root's candidates a tree round verified (its depth-1 nodes, in the draft's order): what
    the lab's tree variants should try for that round. [] for a chain round or a bad number."""
    events = getattr(trace, "events", ())
    if isinstance(round_number, bool) or not isinstance(round_number, int) \
            or not 1 <= round_number <= len(events):
        return []
    nodes = getattr(events[round_number - 1], "tree", ()) or ()
    return [n.token for n in nodes if getattr(n, "parent", None) == -1
            and isinstance(getattr(n, "token", None), int)][: lab.MAX_TREE_CANDIDATES]


def monte_carlo(p, q, labels, n: int, variants, seed: int = 0, tokenizer=None,
                candidates: list[int] | None = None) -> tuple[go.Figure, str]:
    """Run each variant n times; empirical distributions against p, with TV and chi-square.

    candidates: the tree variants' depth-1 candidates (tree_root of a tree round); default the
    draft's top lab.TREE_BRANCHING under q."""
    if not 1_000 <= n <= 1_000_000:
        raise ValueError("trials must be between 1,000 and 1,000,000")
    variants = [v for v in variants if v in lab.VARIANTS] or ["exact"]
    candidates = list(dict.fromkeys(c for c in candidates or () if isinstance(c, int) and 0 <= c < len(p)))
    candidates = candidates[: lab.MAX_TREE_CANDIDATES] or None
    tried = lab.tree_candidates(q) if candidates is None else candidates
    named = ", ".join(token_name(i, labels, tokenizer) for i in tried)
    ids, names = _top(p, q, labels, tokenizer)
    x = names + (["other"] if len(ids) < len(p) else [])
    fig = go.Figure()
    fig.add_bar(name="target p", x=x, y=_bars(ids, {"p": p})[0][1], marker_color=SPEC,
                marker_line=EDGE)
    rows = []
    for i, v in enumerate(variants):
        # seeded by N as well: the same N draws the same again, another N a stream of its own
        r = lab.check(v, p, q, n, seed=seed + n, q_draw=flatten(q) if v == "mismatched_q" else None,
                      candidates=candidates)
        fig.add_bar(name=v, x=x, y=_bars(ids, {v: r.empirical})[0][1],
                    marker_pattern=PATTERNS[i % len(PATTERNS)], marker_line=EDGE)
        verdict = _verdict(v, r, p)
        what = lab.VARIANTS[v] + (f" (candidates: {named})" if v in lab.TREE_VARIANTS else "")
        rows.append(f"<tr><td>{v}</td><td>{html.escape(what)}</td><td>{r.tv_to_p:.4f}</td>"
                    f"<td>{pvalue_text(r.pvalue_vs_p)}</td><td>{verdict}</td>"
                    f"<td>{r.seconds:.2f} s</td></tr>")
    fig.update_layout(barmode="group")
    point = (" Here q is a point mass (an n-gram's or a token tree's draft): drafting its argmax or at "
             "another temperature draws the same token, so those variants are the rule itself."
             if int((torch.as_tensor(q) > 0).sum()) == 1 else "")
    # the short columns' headers and numbers unbroken (assets/style.css): "TV to p" and "0.02 s"
    # left "p" and "s" alone on a line, "< 1e-300" its "<"
    table = ("<table class='specviz-stats'><thead><tr><th>variant</th><th>what it does</th><th>TV to p</th>"
             "<th>p-value</th><th>verdict</th><th>time</th></tr></thead><tbody>" + "".join(rows) +
             f"</tbody></table><p>{n:,} trials (one-token rounds) per variant. An exact sampler's TV "
             "shrinks like 1/√N; "
             "a p-value below 0.001 flags a bias. The p-value is Pearson's χ² over tokens expecting 5 "
             "draws or more, the rarer ones pooled, and a second test of that pool (a Poisson tail where "
             "it expects fewer than 5, else its tokens in groups expecting 20 or more): where both run, "
             "twice the smaller of the two, at most 1. The draws "
             "are seeded, so the same round and N draw the same again: an exact rule is flagged one "
             f"to two times in 1,000 such draws, and another N draws anew.{point}</p>")
    # a title that fits a phone's plot (figures.TITLE_CHARS): "Monte Carlo: 200,000 one-token rounds
    # per variant" ran 92 px past its plot's right edge at 375 px; the rest is said under the table
    return (_layout(fig, f"Monte Carlo: {n:,} rounds each", "token", "frequency", PAGE_HALF_PX), table)


def _verdict(variant: str, r: lab.CheckResult, p: torch.Tensor) -> str:
    """The test's verdict beside what the closed form says: a wrong variant can be exact for one
    (p, q) (a point-mass q or p), an exact one is flagged one to two times in 1,000 seeds (the
    calibration of the Forty-fourth stop, docs/benchmarks.md), and a small bias
    can hide in too few trials (a page's million included: 5e-4 in TV on three tokens needs about
    1.4e7)."""
    p = torch.as_tensor(p, dtype=r.predicted.dtype)
    p = p / p.sum()
    off = lab.tv(r.predicted, p)
    exact = off < 1e-9
    if r.pvalue_vs_p < 1e-3:  # "below 0.001 flags a bias"
        if exact:  # the seeded draws of this N: the same every time, another N draws anew
            return ("flagged (p < 0.001), yet its exact output is p: a false alarm, as an exact rule "
                    "gets at one to two N in 1,000")
        return "<b>biased</b>"
    if exact:
        wrong = lab.VARIANTS[variant].startswith("wrong")
        # "matches p" unbroken (NBSP): its "p" stood alone on a line, at 375 px and at 1400 px
        if not wrong:
            return f"matches{NBSP}p"
        # a point-mass p: every rule emits its one token, whatever q (top-k 1, a tight top-p)
        return f"matches{NBSP}p: exact for this p (one token)" if int((p > 0).sum()) == 1 \
            else f"matches{NBSP}p: exact for this q"
    return (f"no bias detected at this N (its exact output is {sig3(off)} from p in TV, too little for "
            "these trials to show: more may, a bias this small can need more than a page draws)")


WEAK_NOISE = 0.5  # two exact samplers' mean TV past which the end-to-end check is called weak


def continuations_html(step: dict) -> str:
    """The end-to-end check's result (service.continuations' final step) as one paragraph."""
    sec = step["seconds"]
    verdict = ("a difference this large is rare under one distribution: <b>a sign of a bias</b>, "
               "please report it with this page's share link" if step["pvalue"] < 1e-3
               else "consistent with one distribution")
    # nearly every sample new (it said "consistent" of 100 distinct outcomes in 100 samples)
    if step["pvalue"] >= 1e-3 and step["noise"] >= WEAK_NOISE:
        verdict += (", but a weak check: with outcomes this spread, two exact samplers differ "
                    "this much too, so only a gross bias could show. Lower the temperature or set "
                    "top-k for fewer distinct outcomes, or take more samples")
    tests = step.get("tests") or [dict(step, what="tokens 1-2")]
    spread = max(t["noise"] for t in tests)  # the verdict's test is over every histogram
    if step["pvalue"] >= 1e-3 and step["noise"] < WEAK_NOISE and spread > 0:  # the check's resolution:
        # the classic correct-from-p bug hid at 60 samples and showed at 200 (test_service's
        # rejects_an_engine test, docs/benchmarks.md)
        verdict += (". A bias that moves a histogram less than about twice its exact samplers' spread "
                    f"({'up to ' if len(tests) > 1 else ''}{2 * spread:.2f} of TV here) can hide in it "
                    "at this N; four times the samples about halve the spread")
    first, later = tests[0], tests[1:]
    drafts = f" ({step['drafts']})" if step.get("drafts") else ""
    text = (f"<div class='specviz-lab'>{step['samples']} samples each of {step.get('tokens', 2)} "
            f"tokens{drafts}, {first['outcomes']} distinct outcomes of the first two. TV distance between "
            "the speculative and the target-alone histograms of the first two tokens: "
            f"<b>{first['tv']:.3f}</b>. Two exact samplers at this N differ by {first['noise']:.3f} on "
            f"average (the pooled samples split in two at random, {step['permutations']:,} times), and "
            f"{beside(100 * first['pvalue'], 0.1, 3, 'g')}% of the splits differ at least as much")
    if later:  # each later token's own histogram, and all of them in one test (the verdict's)
        text += ("; each later token's histogram: " + ", ".join(
            f"{t['what']} TV {t['tv']:.3f} (exact samplers {t['noise']:.3f}, "
            f"{beside(100 * t['pvalue'], 0.1, 3, 'g')}%)" for t in later)
            + f". Of the same splits, {beside(100 * step['pvalue'], 0.1, 3, 'g')}% put some histogram "
            "as far apart, in units of its exact samplers' TV, as the farthest one here")
    return (text + f": {verdict}. Time: {sec['spec']:.1f} s speculative, {sec['base']:.1f} s target "
            "alone.</div>")


def cost_text(rec: explorer.Recording) -> str:
    """The pass costs a replay is priced at, as the k explorer states them."""
    c_d = ("no draft pass (the n-gram drafter looks its drafts up)" if rec.proposer == "ngram"
           else f"C_D={sig3(rec.draft_pass_seconds * 1000)} ms")  # it read "C_D=0 ms"
    if rec.per_draft is None:
        return (f"{c_d}, C_T={sig3(rec.target_pass_seconds * 1000)} ms per target pass, "
                "whatever it verifies")
    c_t, b = rec.per_draft
    return (f"{c_d}; a target pass verifying k drafts costs {sig3(c_t * 1000)} + "
            f"{sig3(b * 1000)}·k ms, fitted to this run's target passes")


def prefill_text(prefilled: tuple[str, ...]) -> str:
    """How a replay's round 1 is priced, given the costs that include a prefill
    (RunStats.prefilled_costs): like any round, unless the run had no round to measure after it."""
    if "C_T" in prefilled:
        return ("the run had one round, so its costs are round 1's, the prompt's prefill included: "
                "every replayed round is priced so")
    if "C_D" in prefilled:
        return ("no round after round 1 drafted, so C_D is round 1's, the draft's prefill of the prompt "
                "included: every replayed draft pass is priced so; C_T without the prompt's prefill")
    return "round 1 priced like any round, without the prompt's prefill"


def on_profile(rep: explorer.Replay, profile: profiles.Profile) -> str:
    """One HTML line: the replay's predicted seconds and tokens/s on each path of a cost profile,
    and the speedup over the target alone (one width-1 pass per token) on the same path."""
    tokens = len(rep.recording.output)
    alone = profiles.Passes(0, {1: tokens})
    parts = []
    for path in profile.paths:
        try:
            seconds, base = profiles.project(rep, profile, path), profiles.project(alone, profile, path)
        except ValueError:  # no draft cost on this path
            continue
        name = html.escape(profile.path_label(path))
        parts.append(f"{name} {sig3(seconds)} s ({tokens / seconds:.1f} tok/s, "
                     f"{beside(base / seconds, 1.0)}x the target alone)" if seconds else f"{name}: -")
    measured = (f" The profile timed {html.escape(profile.measured)}: a pair of other sizes costs "
                "more or less a pass." if profile.measured else "")
    return (f"<br>On {html.escape(profile.label)}: " + ("; ".join(parts) or "no path with a draft cost")
            + ". Pass counts from this replay, costs from the profile; the prefill counts as one pass "
            "(on a compiled path each model's first at the eager price: no step is compiled for the "
            f"prompt).{measured}")


NEAR_FASTEST = 0.02  # a k whose predicted time is within this share of the fastest k's is named beside it


def ks_text(ks: list[int]) -> str:
    """Ascending ks in words: [2, 3, 4, 6] -> "2 to 4 and 6", [1, 2] -> "1 and 2"."""
    runs: list[list[int]] = []
    for k in ks:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    words = [w for r in runs for w in ([f"{r[0]} to {r[-1]}"] if len(r) > 2 else map(str, r))]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def fastest_text(seconds: dict[int, float | None], tokens: int) -> str | None:
    """The k of the curve with the least predicted time (the smallest such k on a tie), its
    tokens / s, and the other ks within NEAR_FASTEST of its time: no replay or cost model is
    finer than that, so the choice among them is the visitor's. None where no k has a time."""
    timed = {k: t for k, t in seconds.items() if t}
    if not timed:
        return None
    best = min(timed, key=lambda k: (timed[k], k))
    near = sorted(k for k, t in timed.items() if k != best and t <= timed[best] * (1 + NEAR_FASTEST))
    return (f"k = {best} ({tokens / timed[best]:.1f} tokens / s)"
            + (f", with k = {ks_text(near)} within {NEAR_FASTEST:.0%} of its time" if near else ""))


# why the replay at the run's own k can differ from the measured run, by the recording's proposer
MISMATCH = {
    "draft": (" A recording holds the run's own drafts wherever its rounds drafted, so at the run's k the "
              "replay is the run: this is a trace from an older specviz (before 2026-12-04 a recording "
              "took every draft from one draft pass over the whole output, which in bfloat16 or float16 "
              "can round a near-tie differently from the run's own passes), or an edited one."),
    "ngram": (" An n-gram run has no draft pass: the replay reruns its lookup on the recorded tokens as "
              "the recording says the run drafted (its price, whether its copies read on): a mismatch means "
              "the run drafted with another n-gram rule than this version's (a trace from an older "
              "specviz, or an edited one)."),
}


def explorer_views(rec: explorer.Recording, k: int, adaptive: bool, measured_k: int | None,
                   measured_rounds: list[int] | None, profile: profiles.Profile | str | None = None,
                   prefilled: tuple[str, ...] = ()) -> tuple[str, str, go.Figure]:
    """(re-laid text HTML, numbers HTML, curve figure) for k (or the adaptive policy).

    profile: a cost profile, or the name of a shipped one (profiles.shipped(); a menu's value),
    onto which the replay is projected: predicted seconds and tokens/s on its eager and fast
    paths, and the curve's tokens/s on those paths instead of the recording's own costs.
    prefilled: the recorded costs that include a prefill (the run's RunStats.prefilled_costs)."""
    with gc_paused():  # 18 replays, each indexing every n-gram of the context: the cyclic
        # collector would rescan those ~10^5 tuples again and again (1.4 s a call became 5 s)
        return _explorer_views(rec, k, adaptive, measured_k, measured_rounds, profile, prefilled)


def _explorer_views(rec, k, adaptive, measured_k, measured_rounds, profile, prefilled):
    if not isinstance(profile, profiles.Profile):  # a menu value: only shipped names are accepted
        profile = profiles.load_shipped(profile) if profile else None
    note = ""
    if adaptive and not rec.replays_adaptive:
        why = ("this recording holds no draft confidences (a trace from before they were recorded): "
               "run it again" if rec.proposer == "draft" else "record a greedy run of the draft drafter")
        adaptive, note = False, (f"<br>The adaptive policy drafts with the draft model: {why} to replay "
                                 "it. Showing fixed k instead.")
    rep = explorer.replay_adaptive(rec, k) if adaptive else explorer.replay(rec, k)
    if adaptive:
        note += (f"<br>The adaptive policy drafts at most k = {k} a round. "
                 f"It is {explorer.adaptive_differs(rec)}.")
    reps = rec.curve  # the totals at k = 1..16, computed once per recording
    check = ""
    if measured_k is not None and measured_rounds is not None:
        again = list(rec.committed(measured_k))
        ok = again == measured_rounds
        check = (f"<br>Measured run (k={measured_k}): {len(measured_rounds)} target passes; the "
                 f"recomputation {'matches it round by round ✔' if ok else 'does NOT match it ✘'}."
                 + ("" if ok else MISMATCH[rec.proposer]))
    seconds = rep.predicted_seconds  # tokens / s as the curve's: the output over predicted seconds
    tokens = len(rec.output)
    priced = {}  # path -> {k: predicted seconds on the profile's path}, for its line and its sentence
    for path in profile.paths if profile else ():
        try:
            priced[path] = {r.k: profiles.project(r, profile, path) for r in reps}
        except ValueError:  # no draft cost on this path: neither a line nor a sentence
            continue
    fastest = [f"at this run's costs, {text}" for text in
               [fastest_text({r.k: r.predicted_seconds for r in reps}, tokens)] if text]
    for path, times in priced.items():  # a sentence for each path's dashed or dotted line
        if text := fastest_text(times, tokens):
            fastest.append(f"On {html.escape(profile.name[:40])}, {html.escape(profile.path_label(path))}: "
                           f"{text}")
    numbers = (f"<div class='specviz-lab'><b>{f'adaptive k ≤ {k}' if adaptive else f'k = {k}'}</b>: "
               f"{rep.target_passes} target passes, {rep.draft_passes} draft passes, "
               f"{beside(rep.tokens_per_pass, 1.0)} tokens per pass, "
               f"predicted {sig3(seconds)} s"
               + (f", {tokens / seconds:.1f} tokens / s " if seconds else " ") +
               f"({cost_text(rec)}; {prefill_text(prefilled)})."
               f"{on_profile(rep, profile) if profile else ''}"
               + (f"<br>Fastest predicted k of {min(explorer.CURVE_KS)} to {max(explorer.CURVE_KS)}: "
                  f"{'. '.join(fastest)}." if fastest else "") + f"{check}{note}</div>")
    fig = go.Figure()
    ks = [r.k for r in reps]
    fig.add_scatter(x=ks, y=[r.tokens_per_pass for r in reps], name="tokens per target pass", line_color=SPEC)
    if profile is None:  # dashed, square: the two lines were one in grey
        speed = [len(rec.output) / r.predicted_seconds if r.predicted_seconds else None for r in reps]
        fig.add_scatter(x=ks, y=speed, name="predicted tokens / s", yaxis="y2",
                        line=dict(color=THEORY, dash="dash"), marker_symbol="square")
    for path, times in priced.items():
        speed = [tokens / t if (t := times[r.k]) else None for r in reps]  # no cost measured: no
        # point, not 0 tokens / s
        fig.add_scatter(x=ks, y=speed, name=f"tokens / s on {profile.name[:40]}, {profile.path_label(path)}",
                        yaxis="y2", marker_symbol="square",
                        line=dict(color=THEORY, dash="dash" if path == "fast" else "dot"))
    if measured_k is not None and measured_rounds:  # the run's own figure, not its replay's
        fig.add_scatter(x=[measured_k], y=[sum(measured_rounds) / len(measured_rounds)], mode="markers",
                        name="measured run", marker=dict(size=12, color=BASE, symbol="diamond"))
    if adaptive and rep.rounds:  # the replay shown drafts its own length a round: marked at its mean k
        # (the Run tab's way); a recording with no output (built by hand) has no rounds to average
        mean_k = sum(r.k for r in rep.rounds) / rep.target_passes
        fig.add_scatter(x=[mean_k], y=[rep.tokens_per_pass], mode="markers",
                        name=f"adaptive k ≤ {k} (k varies by round: mean {mean_k:.1f})",
                        marker=dict(size=12, color=SPEC, symbol="star"))
    fig.add_vline(x=k, line_dash="dot", line_color=SPEC,  # the k shown, or the adaptive policy's bound
                  annotation_text=f"adaptive k ≤ {k}" if adaptive else f"k = {k}",
                  # above the plot, not on the curve (its plateau struck the label through), and on
                  # the line's side towards the middle: a label past the last k widened the axis to
                  # hold it (k = 16 took 0 to 28 at 375 px)
                  annotation_position="top",
                  annotation_xanchor="left" if k <= max(explorer.CURVE_KS) / 2 else "right")
    fig.update_layout(yaxis=dict(rangemode="tozero"),  # from 0: a 2.4-3 axis made steps look like swings
                      yaxis2=dict(overlaying="y", side="right", title="tokens / s", rangemode="tozero"))
    return to_html(explorer.spans(rep)), numbers, _layout(fig, "Every k, recomputed from one run", "k",
                                                         "tokens per target pass", PAGE_PX)
