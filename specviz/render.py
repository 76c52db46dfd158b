"""RoundEvents -> spans: one record per shown token, with its fate. Plain values, no UI imports.

Fates: accepted (a draft kept), rejected (the first failed draft and those after it, shown but
never emitted), recovered (the target's token after a rejection), bonus (the target's token
after all k were kept; in a baseline run every token is the target's own "target" token).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass, replace

from .detok import token_pieces
from .digits import share
from .engine import RoundEvent
from .tree import first_branch
from .untrusted import visible_bidi

ACCEPTED, REJECTED, RECOVERED, BONUS, TARGET = "accepted", "rejected", "recovered", "bonus", "target"
LEGEND = {
    ACCEPTED: "draft token the target kept",
    REJECTED: "draft token the target refused (shown, never part of the output)",
    RECOVERED: "target's token after a rejection (drawn from the residual)",
    BONUS: "target's extra token after all k drafts were kept",
    TARGET: "target's token in a round with no draft",
}
# A refused draft is a deletion and the target's own token an insertion: assistive technology
# tells them apart (style.css marks every fate without colour too: struck, barred, outlined)
TAGS = {REJECTED: "del", RECOVERED: "ins", BONUS: "ins"}
# a no-break space: a number or a short word kept on one line with its neighbour in a narrow
# cell (views' timeline and stats table, labview's verdicts)
NBSP = "\u00a0"
# A view of tokens is one stop of the keyboard's Tab: its arrow keys step through the tokens'
# details (assets/tips.js), as a tap or the pointer does
KEYS = 'tabindex="0" data-tips aria-label="tokens: arrow keys read each token\'s details"'
# A terminal's fates: a colour and, as on the page, a mark that needs none (struck, underlined,
# bold); under NO_COLOR (no-color.org) the marks alone
MARKS = {REJECTED: "9", RECOVERED: "4", BONUS: "1"}
ANSI = {fate: ";".join(code for code in (colour, MARKS.get(fate)) if code) for fate, colour in
        {ACCEPTED: "32", REJECTED: "31", RECOVERED: "33", BONUS: "34", TARGET: ""}.items()}


@dataclass(frozen=True)
class Span:
    text: str
    fate: str
    token: int
    round: int
    position: int  # 1-based draft position within the round (0: the target's own token)
    p: float | None = None  # p(x) of a drafted token (None: the rule never tested it)
    q: float | None = None  # q(x) of a drafted token
    keep: float | None = None  # the chance the rule kept it, once the round reached it (None: untested)

    @property
    def emitted(self) -> bool:
        return self.fate != REJECTED

    @property
    def tooltip(self) -> str:
        """The token's fate, its text (as a tree node's says it: the arrow keys read a token's
        tooltip out, and without it a screen reader heard whose token, never which), its place and
        its numbers."""
        where = f"{shown(self.text)!r}, round {self.round}, " + (f"draft position {self.position}"
                                                                  if self.position else "target's token")
        if self.p is None and self.q is not None:  # a draft after the round's first refusal
            return (f"{self.fate}: {where}; q(x)={share(self.q)}; never tested: the round stopped at an "
                    "earlier refusal")
        if self.p is None:
            return f"{self.fate}: {where}"
        rule = ""  # a tree's candidate: not Algorithm 1's min(1, p/q), so say what it is
        if self.keep is not None and self.q and abs(self.keep - min(1.0, self.p / self.q)) > 1e-6:
            rule = (" (a token tree tries each candidate as a one-hot draft: p(x) over the mass its "
                    "refused elder siblings left; q only picked and ordered them)")
        return (f"{self.fate}: {where}; p(x)={share(self.p)}"  # never 0.0000 or 1.0000 when it is not
                + ("" if self.q is None else f"  q(x)={share(self.q)}")  # a trace may leave q out
                + ("" if self.keep is None else f"  kept with probability {share(self.keep)}{rule}"))


def target_fate(event: RoundEvent) -> str:
    """The fate of a round's own target token: "target" in a round that drafted nothing."""
    return TARGET if not event.k else BONUS if event.kind == "bonus" else RECOVERED


def keep_probabilities(event: RoundEvent) -> list[float]:
    """The chance the rule kept each tested draft of a round, given the round reached it: the
    accepted ones, then the first refused one. A chain keeps x with min(1, p(x)/q(x)) (Algorithm 1;
    greedy and n-gram drafts have q one-hot, so it is p(x)). A tree tries siblings as candidates
    in the draft's order: x with p(x) over the mass its refused elder siblings left (tree.walk)."""
    if not event.tree:
        tested = min(event.accepted + 1, event.k)
        return [min(1.0, p / q) if q else float(p > 0)  # acceptance.verify: keep iff u·q < p
                for p, q in zip(event.target_probs[:tested], event.draft_probs, strict=False)]
    out, parents = [], [n.parent for n in event.tree]
    path = [i for i, n in enumerate(event.tree) if n.fate == ACCEPTED]
    for i in path + first_branch(parents, path[-1] if path else -1)[:1]:  # then the first refused
        elders = [j for j in range(i) if parents[j] == parents[i]]  # tried first, all refused
        mass = 1.0 - sum(event.tree[j].p for j in elders)
        out.append(min(1.0, event.tree[i].p / mass) if mass > 1e-12 else event.tree[i].p)
    return out


def round_marks(event: RoundEvent) -> list[Span]:
    """What a round shows, token by token, without the texts (text ""): each token's fate, round,
    position and the rule's numbers. A saved trace's spans are held to these (tracecheck)."""
    n, drafts = event.accepted, event.draft_tokens
    keep = keep_probabilities(event)  # the rule tests drafts up to the first refusal
    spans = [Span("", ACCEPTED if i < n else REJECTED, x, event.round, i + 1,
                  event.target_probs[i] if i < len(keep) else None, event.draft_probs[i],
                  keep[i] if i < len(keep) else None)
             for i, x in enumerate(drafts)]  # the kept drafts, then the refused ones
    # Past the output's end (an EOS among the kept drafts) nothing is shown: the
    # refused drafts are shown where the target's token that replaced them survived.
    spans = [s for s in spans if s.position <= len(event.new_tokens)
             or s.fate == REJECTED and len(event.new_tokens) > n]
    if len(event.new_tokens) > n:  # the target's token survived truncation
        spans.insert(n, Span("", target_fate(event), event.token, event.round, 0))
    return spans


def round_spans(event: RoundEvent, tokenizer, context: list[int]) -> list[Span]:
    """Spans for one round; context is every committed id before it (prompt included)."""
    n, drafts = event.accepted, event.draft_tokens
    texts = token_pieces(tokenizer, context, drafts[:n]) \
        + token_pieces(tokenizer, context + drafts[:n], drafts[n:])  # [k]: by draft position
    marks = round_marks(event)
    own = token_pieces(tokenizer, context + drafts[:n], [event.token], final=event.stop is not None)[0] \
        if len(event.new_tokens) > n else ""  # the target's token, where it survived truncation
    return [replace(s, text=own if s.position == 0 else texts[s.position - 1]) for s in marks]


def all_spans(events: Iterable[RoundEvent], tokenizer, prompt_ids: list[int]) -> list[Span]:
    context, spans = list(prompt_ids), []
    for event in events:
        spans += round_spans(event, tokenizer, context)
        context += event.new_tokens
    return spans


def to_ansi(spans: list[Span], color: bool = True, marks_only: bool = False) -> str:
    """The text for a terminal, every token styled by its fate (ANSI; MARKS with marks_only) and
    its control characters shown, not obeyed (visible_bidi: a token's ESC ] 52 set the terminal's
    clipboard, its ESC [ 2 J cleared the screen); without color, the output alone, as it is
    (refused drafts left out), for a pipe or a file."""
    if not color:
        return "".join(s.text for s in spans if s.emitted)
    codes = MARKS if marks_only else ANSI
    return "".join(f"\x1b[{codes[s.fate]}m{visible_bidi(s.text)}\x1b[0m" if codes.get(s.fate)
                   else visible_bidi(s.text) for s in spans)


SHOWN_TOKEN_CHARS = 100  # a token's text on the page; an opened trace may hold up to 1,000


def shown(text: str) -> str:
    """A token's text as the page shows it: clipped, so that an opened trace's long token texts
    (escaping can grow each character fivefold) cannot swell the page, and with bidirectional
    controls shown, not obeyed."""
    text = text if len(text) <= SHOWN_TOKEN_CHARS else text[:SHOWN_TOKEN_CHARS - 1] + "…"
    return visible_bidi(text)  # a U+202E token showed the tokens after it reversed


HTML_BUDGET = 512 * 2**10  # characters of HTML one view of tokens sends (and the page's state
# keeps), each one byte: the view is ASCII (ascii_html)


def ascii_html(markup: str) -> str:
    """markup with every non-ASCII character as a character reference ("↵" as "&#8629;"): the
    browser shows the same, and Python keeps the string at one byte a character. One emoji in a
    view made every character of it take 4 bytes, and a UTF-8 copy besides: a view within
    HTML_BUDGET characters took 3 MiB of a page's state, and the server keeps 1,000 pages."""
    return markup.encode("ascii", "xmlcharrefreplace").decode("ascii")


def within(parts: list[str], budget: int) -> list[str]:
    """The leading parts that fit in budget characters. Gradio keeps a view's last value in its
    page's state, so one view of a hostile trace (17,000 spans of 100 escaped quotes) must not be
    17 MiB a page."""
    used = 0
    for i, part in enumerate(parts):
        used += len(part)
        if used > budget:
            return parts[:i]
    return parts


def more_note(text: str) -> str:
    return f'<div class="specviz-more">{html.escape(text)}</div>'


def token_html(fate: str, inner: str, title: str | None = None, classes: str = "", attrs: str = "") -> str:
    """One token's element (TAGS) with its fate's class; inner is HTML already escaped."""
    tag = TAGS.get(fate, "span")
    title = "" if title is None else f' title="{html.escape(title)}"'
    return f'<{tag} class="tok {fate}{classes}"{title}{attrs}>{inner}</{tag}>'


def span_html(s: Span) -> str:
    text = html.escape(shown(s.text)).replace("\n", "↵<br>")  # shown: a CR as ␍, not a line break
    blank = "" if text else " blank"  # no text to show: a tappable width of its own (2 px before)
    return token_html(s.fate, text or "&#8203;", s.tooltip, blank, f' data-round="{s.round}"')


def to_html(spans: list[Span], budget: int = HTML_BUDGET, growing: bool = False) -> str:
    """Every token HTML-escaped; fates as CSS classes, details in the title tooltip. Past budget
    characters the refused drafts go first (the output is what the text is for), then the output
    tokens from the end, each time with a note saying what is left out.

    growing: the text of a run still streaming, left open (no closing tag, no notes; the browser
    closes the element at the fragment's end), so that each view begins with the one before and
    Gradio's stream sends only the tokens added (its diff appends to a string the new one starts
    with). Closed, every view was the whole text again: 35 MiB of the stream of a 512-token run at
    0.3 s a round, four views a second."""
    parts = [ascii_html(span_html(s)) for s in spans]
    notes = []
    if sum(map(len, parts)) > budget:
        refused = sum(not s.emitted for s in spans)
        parts = [p for s, p in zip(spans, parts, strict=True) if s.emitted]
        notes.append(f"{refused} refused drafts not shown, to keep this view within "
                     f"{budget // 2**10} KiB (a saved trace holds every one)")
    shown_parts = within(list(parts), budget)
    if len(shown_parts) < len(parts):
        notes.append(f"… {len(parts) - len(shown_parts)} more output tokens not shown: this view "
                     f"shows at most {budget // 2**10} KiB of them (a saved trace holds every one)")
    text = f'<div class="specviz-text" role="group" {KEYS}>' + "".join(shown_parts)
    return text if growing else text + "</div>" + ascii_html("".join(more_note(n) for n in notes))


def legend_html() -> str:
    items = "".join(f'{token_html(fate, fate)} {html.escape(text)}<br>' for fate, text in LEGEND.items())
    return f'<div class="specviz-legend">{items}</div>'
