"""HTML pieces for the app beside the token text: round timeline, counters, verdict."""

from __future__ import annotations

import html
import math

from .compare import Comparison
from .detok import token_label
from .digits import beside, percent
from .metrics import RunStats
from .render import HTML_BUDGET, KEYS, NBSP, Span, ascii_html, more_note, shown, token_html, within
from .untrusted import visible_bidi


def _chip(span: Span) -> str:
    text = html.escape(shown(span.text).replace("\n", "↵")) or "∅"
    return token_html(span.fate, text, span.tooltip)


def timeline_html(spans: list[Span], stats: RunStats, budget: int = HTML_BUDGET) -> str:
    """One row per round, newest first: the drafts with their fates, n/k kept, the target's
    token; the newest 200 rounds, in at most budget characters."""
    by_round: dict[int, list[Span]] = {}
    for s in spans:
        by_round.setdefault(s.round, []).append(s)
    rows = []
    for e in stats.events[-200:]:  # the newest 200 rounds keep the page light
        chips = by_round.get(e.round, [])
        drafts = "".join(_chip(s) for s in chips if s.position)
        own = "".join(_chip(s) for s in chips if not s.position)
        # a tree's row shows its walked branch
        # kept: the drafts the output kept (RoundEvent.kept), as α and the acceptance rate count them
        # a number kept with its word (NBSP): on a 375 px phone "4)" of "(the rule accepted 4)"
        # stood alone on the cell's last line
        kept = f"{e.kept} of {e.nodes}{NBSP}nodes" if e.tree else f"{e.kept}/{e.k}"
        if e.accepted and len(e.new_tokens) <= e.accepted:  # only an EOS ends the output among the
            # accepted drafts: the budget leaves room for the target's token (tracecheck holds traces to it)
            kept += f", EOS at draft{NBSP}{len(e.new_tokens)}" + (
                f" (the rule accepted{NBSP}{e.accepted})" if e.accepted > e.kept else "")
        rows.append(ascii_html(f"<tr><td>{e.round}</td><td>{drafts or '—'}</td><td>{kept}</td>"
                               f"<td>{own or '(cut)'}</td><td>{len(e.new_tokens)}</td></tr>"))
    rows = within(rows[::-1], budget)
    hidden = len(stats.events) - len(rows)
    more = more_note(f"… {hidden} earlier rounds not shown: the timeline shows the newest 200 "
                     f"rounds, in at most {budget // 2**10} KiB") if hidden else ""
    return (f'<table class="specviz-timeline" {KEYS}><thead><tr><th>round</th><th>drafted</th>'
            '<th>kept</th><th>target</th><th>tokens</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>" + ascii_html(more))


def _row(label: str, spec: str, base: str = "", *more: str) -> str:
    return f"<tr><th>{label}</th><td>{spec}</td><td>{base}</td>" + "".join(
        f"<td>{m}</td>" for m in more) + "</tr>"


def _predicted(stats: RunStats) -> str:
    if stats.is_tree:
        return "— (not for trees)"
    return f"{stats.predicted_tokens_per_pass:.2f}{NBSP}/pass" if stats.drafted else "—"  # one line at 375 px


def stats_html(spec: RunStats, base: RunStats | None = None, chain: RunStats | None = None) -> str:
    """The counters, speculative beside the target alone; a tree run adds the tokens it verified
    and a column for the chain drafter at the same depth (chain, once it has run)."""
    b = base if base and base.events else None
    tree = spec.is_tree
    c = chain if tree and chain and chain.events else None

    def row(label: str, of, base_text: str = "") -> str:
        """of(stats): a speculative run's cell (the tree's, then the chain's beside it)."""
        return _row(label, of(spec), base_text, *([of(c) if c else ""] if tree else []))

    rows = [
        row("tokens", lambda r: f"{r.new_tokens}", f"{b.new_tokens}" if b else ""),
        row("target passes", lambda r: f"{r.target_passes}", f"{b.target_passes}" if b else ""),
        row("draft passes", lambda r: f"{r.draft_passes}", "0" if b else ""),
        row("tokens per target pass", lambda r: beside(r.tokens_per_pass, 1.0), "1.00" if b else ""),
    ]
    if tree:  # accepted / nodes verified is a tree's acceptance rate
        rows += [row("drafted tokens verified (tree nodes; a chain: k a round)",
                     lambda r: f"{r.nodes_verified}"),
                 row("depth drafted a round (mean; k caps a tree's)", lambda r: f"{r.draft_depth:.1f}"),
                 row("accepted per verified token", lambda r: percent(r.accepted_per_node))]
    rows += [
        row("per-token acceptance α = accepted / (accepted + rejections)"
            + (" (a tree: rejections = candidates refused)" if tree else ""),
            lambda r: percent(r.alpha) if r.drafted else "—"),
        *([] if tree else [row("acceptance rate = accepted / drafted",
                               lambda r: percent(r.acceptance_rate) if r.drafted else "—")]),
        # the formula in two unbroken halves (NBSP): at 375 px its "−" stood alone on a line
        row(f"i.i.d. prediction: mean over rounds of (1{NBSP}−{NBSP}α^(kᵢ+1)) /{NBSP}(1{NBSP}−{NBSP}α), "
            "kᵢ the drafts round i could keep (k, less where the budget or an EOS cut it)", _predicted),
        # each number with its unit (NBSP), as in the time split: at 375 px the tree column's "s" stood alone
        row("elapsed", lambda r: seconds(r.wall_seconds), seconds(b.wall_seconds) if b else ""),
        row("tokens / s", _speed, _speed(b) if b else ""),
        # each number with its unit (NBSP): in a tree run's three columns the last "s" stood alone
        row("time split", lambda r: f"draft {seconds(r.draft_seconds)} · target "
                                    f"{seconds(r.target_seconds)} · other {seconds(r.overhead_seconds, 3)}"),
    ]
    if b and b.stop and spec.stop:
        rows.append(row("speedup", lambda r: _speedup(r, b) if r.stop else "",
                        "1.00×" if b.wall_seconds > 0 else "—"))
        rows.append(row("speedup after round 1 (the prompt's reading left out: what the k plot's "
                        "break-even prices)", lambda r: _decode_speedup(r, b) if r.stop else "",
                        "1.00×" if b.decode_tokens_per_second else "—"))
    # "same k)" unbroken: its "k)" stood alone in the header at 375 px
    columns = (f"<th>token tree</th><th>baseline (target alone)</th><th>chain (draft model, same{NBSP}k)</th>"
               if tree else "<th>speculative</th><th>baseline (target alone)</th>")
    return (f'<table class="specviz-stats"><thead><tr><th></th>{columns}</tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def seconds(value: float, decimals: int = 2) -> str:
    """Seconds with their unit held on (NBSP): `decimals`, or more where those would print a
    nonzero time as 0 (a GPU run's 4 ms of drafting read "draft 0.00 s", as the n-gram's none)."""
    return f"{beside(value, 0.0, decimals)}{NBSP}s"


def _speed(r: RunStats) -> str:
    rate = r.tokens_per_second  # an opened trace may say 5e-324 s: no rate to show
    return f"{rate:.2f}" if r.wall_seconds > 0 and math.isfinite(rate) else "— (no time measured)"


def _decode_speedup(r: RunStats, base: RunStats) -> str:
    """Tokens a second after round 1 over the target alone's: each run's prompt read (prefills,
    its first token) left out, so a baseline reused from a run under another load, or a cold
    first pass, does not decide it. "—" for a run of one round."""
    ratio = r.decode_speedup_over(base)
    return "—" if ratio is None else f"{beside(ratio, 1.0)}×"


def race_text(spec: RunStats, base: RunStats) -> str:
    """The status line's race: the speedup, and where the outputs differ in length (a sampled
    run, which stops at its own EOS) the speedup after round 1 beside it: the prompt's reading,
    paid once by each, weighs on a short output's rate far more than on a long one's (8 tokens
    after a 1 s prompt read at 0.63x what 64 did, though each later token came 1.67x as fast)."""
    speedup = spec.speedup_over(base)
    if speedup is None:
        return "no time measured"
    text = f"{beside(speedup, 1.0)}× the target alone"
    after = spec.decode_speedup_over(base)
    if spec.new_tokens != base.new_tokens and after is not None:
        text += (f" over outputs of {spec.new_tokens} and {base.new_tokens} tokens; "
                 f"{beside(after, 1.0)}× after the prompt's reading")
    return text


# A round's verify pass costs about a one-token pass or more, so a run cannot be much faster than
# its tokens per target pass: past this factor the two runs' times were measured under different
# loads (a shared machine, a baseline reused from earlier).
NOISE_MARGIN = 1.2


def implausible_race(r: RunStats, base: RunStats) -> str | None:
    """Why r's speedup over base cannot be a fair race (the two were timed under different loads),
    or None: a run cannot be much faster than its tokens per target pass explain (a verify pass
    costs about a one-token pass or more), and one that drafted nothing does the target alone's work."""
    speedup = r.speedup_over(base)
    if speedup is not None and speedup > NOISE_MARGIN * r.tokens_per_pass:
        return f"more than its {beside(r.tokens_per_pass, 1.0)} tokens per target pass can explain"
    if speedup is not None and not r.drafted and speedup < 1 / NOISE_MARGIN:
        return "a run that drafted nothing does the target alone's work"
    return None


def _speedup(r: RunStats, base: RunStats) -> str:
    speedup = r.speedup_over(base)
    if speedup is None:
        return "—"
    if implausible_race(r, base):  # the table showed it bold, as a result
        return f"{beside(speedup, 1.0)}× (not a fair race: the two were timed under different loads)"
    return f"<b>{beside(speedup, 1.0)}×</b>"  # 0.996 never reads 1.00


def _top2(top2, tokenizer) -> str:
    if not top2:
        return "—"
    (a, la), (b, lb) = top2
    show = lambda t: html.escape(token_label(tokenizer, t))  # noqa: E731
    return f"{show(a)} {la:.4f} vs {show(b)} {lb:.4f} (margin {la - lb:.4g})"


def _text(value) -> str:
    """An opened trace's words (its device, numerics) in the page: escaped, bidi controls shown."""
    return html.escape(visible_bidi(str(value)))


WIDE = ("float32", "float64")  # a run in these has no wider dtype to rerun a near-tie in


def verdict_html(comparison: Comparison | None, tokenizer, greedy: bool) -> str:
    if comparison is None:
        return ""
    if not greedy:
        narrow = ("" if comparison.dtype in WIDE else
                  f" In {_text(comparison.dtype)}, the target's probabilities are those of the pass "
                  "that computed them, and a wide verify pass rounds a little differently from a "
                  "one-token pass: a token at the edge of a top-p or top-k cut can be kept by one and "
                  "cut by the other. In float32 they differed by 2e-7 at most where measured.")
        return ('<div class="specviz-verdict sampled">Sampling (temperature &gt; 0): the two runs '
                "draw different samples from the same distribution, so their texts differ by "
                f"design. The Exactness lab checks the distribution itself.{narrow}</div>")
    c, dtype, device = comparison, _text(comparison.dtype), _text(comparison.device)
    compared = (f'<br><span class="specviz-numerics">Compared: '
                f"{_text(c.numerics or f'target in {c.dtype} on {c.device}')}.</span>")
    if comparison.identical:
        return ('<div class="specviz-verdict ok">✔ Identical: the speculative output is '
                f"token-for-token the target's own greedy output.{compared}</div>")
    check = (f"The run was in {dtype} already: there is no wider dtype here to check a near-tie in."
             if c.dtype in WIDE else "Re-run in float32 to confirm a near-tie.")
    return (f'<div class="specviz-verdict diff">✘ The outputs differ from output token {c.position + 1} on. '
            f"Verdict: <b>{html.escape(c.verdict)}</b>.<br>"
            f"speculative run's top-2 there: {_top2(c.spec_top2, tokenizer)}<br>"
            f"baseline run's top-2 there: {_top2(c.base_top2, tokenizer)}<br>"
            + (f"dtype {dtype} on {device}; near-tie bound {c.threshold:.3g} "
               f"(8 units in the last place of the logit in {dtype}). " if c.threshold is not None
               else f"dtype {dtype} on {device}; no near-tie bound without a logit to scale it. ")
            + f"{check}{compared}</div>")
