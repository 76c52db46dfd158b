"""RoundEvents -> spans: one record per shown token, with its fate. Plain values, no UI imports.

Fates: accepted (a draft kept), rejected (the first failed draft and those after it, shown but
never emitted), recovered (the target's token after a rejection), bonus (the target's token
after all k were kept; in a baseline run every token is the target's own "target" token).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass

from .detok import token_pieces
from .engine import RoundEvent

ACCEPTED, REJECTED, RECOVERED, BONUS, TARGET = "accepted", "rejected", "recovered", "bonus", "target"
LEGEND = {
    ACCEPTED: "draft token the target kept",
    REJECTED: "draft token the target refused (shown, never part of the output)",
    RECOVERED: "target's token after a rejection (drawn from the residual)",
    BONUS: "target's extra token after all k drafts were kept",
    TARGET: "target's token in a round with no draft",
}
ANSI = {ACCEPTED: "\x1b[32m", REJECTED: "\x1b[31;9m", RECOVERED: "\x1b[33m", BONUS: "\x1b[34m",
        TARGET: ""}


@dataclass(frozen=True)
class Span:
    text: str
    fate: str
    token: int
    round: int
    position: int  # 1-based draft position within the round (0: the target's own token)
    p: float | None = None  # p(x) of a drafted token (None: a tree node the walk never reached)
    q: float | None = None  # q(x) of a drafted token

    @property
    def emitted(self) -> bool:
        return self.fate != REJECTED

    @property
    def accept_probability(self) -> float | None:
        if self.p is None or not self.q:
            return None
        return min(1.0, self.p / self.q)

    @property
    def tooltip(self) -> str:
        where = f"round {self.round}, " + (f"draft position {self.position}" if self.position
                                            else "target's token")
        if self.p is None and self.q is not None:  # a tree's node past the first refusal
            return f"{self.fate}: {where}; q(x)={self.q:.4f}; p(x) not computed: the walk never reached it"
        if self.p is None:
            return f"{self.fate}: {where}"
        ratio = self.accept_probability  # None without a q (a trace may leave it out)
        return (f"{self.fate}: {where}; p(x)={self.p:.4f}"
                + ("" if self.q is None else f"  q(x)={self.q:.4f}")
                + ("" if ratio is None else f"  min(1, p/q)={ratio:.4f}"))


def round_spans(event: RoundEvent, tokenizer, context: list[int]) -> list[Span]:
    """Spans for one round; context is every committed id before it (prompt included)."""
    n, drafts = event.accepted, event.draft_tokens
    shown = drafts[:n] + drafts[n:]  # kept drafts, then the refused ones
    texts = token_pieces(tokenizer, context, drafts[:n])
    refused = token_pieces(tokenizer, context + drafts[:n], drafts[n:])
    unreached = n + 1 if event.tree else len(drafts)  # a tree's walk computes p up to its refusal
    spans = [Span(t, ACCEPTED if i < n else REJECTED, x, event.round, i + 1,
                  event.target_probs[i] if i < unreached else None, event.draft_probs[i])
             for i, (x, t) in enumerate(zip(shown, texts + refused, strict=True))]
    spans = [s for s in spans if s.fate == REJECTED or s.position <= len(event.new_tokens)]
    if len(event.new_tokens) > n:  # the target's token survived truncation
        fate = TARGET if not event.k else BONUS if event.kind == "bonus" else RECOVERED
        text = token_pieces(tokenizer, context + drafts[:n], [event.token])[0]
        spans.insert(n, Span(text, fate, event.token, event.round, 0))
    return spans


def all_spans(events: Iterable[RoundEvent], tokenizer, prompt_ids: list[int]) -> list[Span]:
    context, spans = list(prompt_ids), []
    for event in events:
        spans += round_spans(event, tokenizer, context)
        context += event.new_tokens
    return spans


def to_ansi(spans: list[Span], color: bool = True) -> str:
    if not color:
        return "".join(s.text for s in spans if s.emitted)
    return "".join(f"{ANSI[s.fate]}{s.text}\x1b[0m" if ANSI[s.fate] else s.text for s in spans)


def to_html(spans: list[Span]) -> str:
    """Every token HTML-escaped; fates as CSS classes, details in the title tooltip."""
    parts = []
    for s in spans:
        text = html.escape(s.text).replace("\n", "↵<br>") or "&#8203;"
        parts.append(f'<span class="tok {s.fate}" title="{html.escape(s.tooltip)}" '
                     f'data-round="{s.round}">{text}</span>')
    return '<div class="specviz-text">' + "".join(parts) + "</div>"


def legend_html() -> str:
    items = "".join(f'<span class="tok {fate}">{fate}</span> {html.escape(text)}'
                    f'<br>' for fate, text in LEGEND.items())
    return f'<div class="specviz-legend">{items}</div>'
