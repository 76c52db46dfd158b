"""HTML pieces for the app beside the token text: round timeline, counters, verdict."""

from __future__ import annotations

import html

from .compare import Comparison
from .metrics import RunStats
from .render import Span


def _chip(span: Span) -> str:
    text = html.escape(span.text.replace("\n", "↵")) or "∅"
    return f'<span class="tok {span.fate}" title="{html.escape(span.tooltip)}">{text}</span>'


def timeline_html(spans: list[Span], stats: RunStats) -> str:
    """One row per round: the drafts with their fates, n/k kept, the target's token."""
    by_round: dict[int, list[Span]] = {}
    for s in spans:
        by_round.setdefault(s.round, []).append(s)
    rows = []
    for e in stats.events[-200:]:  # the newest 200 rounds keep the page light
        chips = by_round.get(e.round, [])
        drafts = "".join(_chip(s) for s in chips if s.position)
        own = "".join(_chip(s) for s in chips if not s.position)
        rows.append(f"<tr><td>{e.round}</td><td>{drafts or '—'}</td><td>{e.accepted}/{e.k}</td>"
                    f"<td>{own or '(cut)'}</td><td>{len(e.new_tokens)}</td></tr>")
    return ('<table class="specviz-timeline"><thead><tr><th>round</th><th>drafted</th>'
            '<th>kept</th><th>target</th><th>tokens</th></tr></thead><tbody>'
            + "".join(reversed(rows)) + "</tbody></table>")


def _row(label: str, spec: str, base: str = "") -> str:
    return f"<tr><th>{label}</th><td>{spec}</td><td>{base}</td></tr>"


def stats_html(spec: RunStats, base: RunStats | None = None) -> str:
    b = base if base and base.events else None
    rows = [
        _row("tokens", f"{spec.new_tokens}", f"{b.new_tokens}" if b else ""),
        _row("target passes", f"{spec.target_passes}", f"{b.target_passes}" if b else ""),
        _row("draft passes", f"{spec.draft_passes}", "0" if b else ""),
        _row("tokens per target pass", f"{spec.tokens_per_pass:.2f}", "1.00" if b else ""),
        _row("per-token acceptance α = accepted / (accepted + rejections)",
             f"{spec.alpha:.1%}" if spec.drafted else "—", ""),
        _row("acceptance rate = accepted / drafted", f"{spec.acceptance_rate:.1%}" if spec.drafted else "—"),
        _row("i.i.d. prediction (1 − α^(k+1))/(1 − α)",
             f"{spec.predicted_tokens_per_pass:.2f} /pass" if spec.drafted else "—"),
        _row("elapsed", f"{spec.wall_seconds:.2f} s", f"{b.wall_seconds:.2f} s" if b else ""),
        _row("tokens / s", f"{spec.tokens_per_second:.2f}", f"{b.tokens_per_second:.2f}" if b else ""),
        _row("time split", f"draft {spec.draft_seconds:.2f} s · target {spec.target_seconds:.2f} s · "
                           f"other {spec.overhead_seconds:.3f} s", ""),
    ]
    if b and b.stop and spec.stop:
        speedup = spec.tokens_per_second / max(b.tokens_per_second, 1e-9)
        rows.append(_row("speedup", f"<b>{speedup:.2f}×</b>", "1.00×"))
    return ('<table class="specviz-stats"><thead><tr><th></th><th>speculative</th>'
            '<th>baseline (target alone)</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _top2(top2, tokenizer) -> str:
    if not top2:
        return "—"
    (a, la), (b, lb) = top2
    show = lambda t: html.escape(repr(tokenizer.decode([t])))  # noqa: E731
    return f"{show(a)} {la:.4f} vs {show(b)} {lb:.4f} (margin {la - lb:.4g})"


def verdict_html(comparison: Comparison | None, tokenizer, greedy: bool) -> str:
    if comparison is None:
        return ""
    if not greedy:
        return ('<div class="specviz-verdict sampled">Sampling (temperature &gt; 0): the two runs '
                "draw different samples from the same distribution, so their texts differ by "
                "design. The Exactness lab checks the distribution itself.</div>")
    c, dtype, device = comparison, html.escape(str(comparison.dtype)), html.escape(str(comparison.device))
    compared = (f'<br><span class="specviz-numerics">Compared: '
                f"{html.escape(c.numerics or f'target in {c.dtype} on {c.device}')}.</span>")
    if comparison.identical:
        return ('<div class="specviz-verdict ok">✔ Identical: the speculative output is '
                f"token-for-token the target's own greedy output.{compared}</div>")
    return (f'<div class="specviz-verdict diff">✘ The outputs differ from token {c.position}. '
            f"Verdict: <b>{html.escape(c.verdict)}</b>.<br>"
            f"speculative run's top-2 there: {_top2(c.spec_top2, tokenizer)}<br>"
            f"baseline run's top-2 there: {_top2(c.base_top2, tokenizer)}<br>"
            f"dtype {dtype} on {device}; near-tie bound {c.threshold:.3g} "
            f"(8 units in the last place of the logit in {dtype}). Re-run in float32 to "
            f"confirm a near-tie.{compared}</div>")
