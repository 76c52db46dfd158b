"""Token trees as plain HTML: one round's tree, and a compact overview of a run's rounds.

Plain values, no UI imports. Token text is attacker-influenced (a prompt, an opened trace), so
every string that becomes HTML is escaped here, text and title attributes alike.

Token text comes from pieces_of(context, tokens): the text each of tokens adds after context and
the tokens before it (detok.token_pieces), so a character split over two tokens shows whole on the
token that completes it, never as two halves. A node is read along its own path from the root,
after the tokens committed before its round.

A round's tree reads left to right from the last committed token: each node is followed by its
children (the draft's order, top to bottom). The accepted path keeps the usual colours (green
accepted, then the target's own token, orange recovered or blue bonus); refused nodes are red and
struck through, nodes never reached grey and outlined with dots: each fate is told by more than
its colour, and a refused node is a deletion (render.TAGS) to assistive technology.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from .digits import beside, percent, share
from .engine import RoundEvent
from .metrics import RunStats
from .render import KEYS, shown, target_fate, token_html
from .tree import ACCEPTED, REJECTED, UNREACHED, ancestors, children
from .untrusted import visible_bidi

Pieces = Callable[[Sequence[int], Sequence[int]], list[str]]  # (context, tokens) -> a text per token
CONTEXT = 8  # committed tokens before a round that its texts are read after

CHAIN_NOTE = "Token trees appear when the drafter is 'token tree'."
OVERVIEW_ROUNDS = 200  # the newest rounds the overview lists (a 512-token run stays light)
CHIP_CHARS = 12  # of a token's text shown on its chip (the tooltip has all of it)
FATE_WORDS = {ACCEPTED: "accepted", REJECTED: "refused", UNREACHED: "never reached"}

# For gr.HTML(css_template=...): scoped to the component. The fate colours are style.css's .tok.
CSS = """
.specviz-tree { font-size: 13px; }
.tree-head { margin: 2px 0 6px; }
.tree-body { overflow: auto; max-height: 520px; padding: 4px;
  border: 1px solid var(--border-color-primary); border-radius: 8px; }
.tree-branch { display: flex; align-items: flex-start; }
.tree-kids { display: flex; flex-direction: column; border-left: 1px solid #6b7280;
  margin-left: 3px; padding-left: 5px; }
.tree-node { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre;
  margin: 1px 2px; display: inline-block; cursor: default; }
.tok.unreached { background: #f3f4f6; color: #4b5563; outline: 1px dotted #4b5563; outline-offset: -1px; }
.tree-root { color: #6b7280; }
.tree-overview { max-height: 360px; overflow: auto; }
.tree-overview table { border-collapse: collapse; width: 100%; }
.tree-overview td, .tree-overview th { padding: 1px 6px; text-align: left;
  border-bottom: 1px solid var(--border-color-primary); }
.tree-overview tr.tree-current { outline: 2px solid #2563eb; }
.tree-bar { display: inline-block; width: 8px; height: 10px; margin-right: 1px; border-radius: 2px; }
.tree-bar.accepted { background: #15803d; } .tree-bar.refused { box-shadow: inset 0 0 0 1px #6b7280; }
.tree-bar.recovered { background: #c2410c; } .tree-bar.bonus { background: #1d4ed8; }
.tree-bar.target { background: #4b5563; }
"""


def prob(x: float) -> str:
    """A probability as tooltips show it: 4 decimals (more where they would read 1.0000 for one
    below 1), or 2 significant digits below 1e-4."""
    return share(x) if x == 0 or x >= 1e-4 else f"{x:.1e}"


def _visible(text: str) -> str:
    return visible_bidi(text.replace("\n", "↵").replace("\t", "⇥"))  # a CR: ␍ (visible_bidi)


def _chip_text(text: str, chars: int = CHIP_CHARS) -> str:
    """Escaped display text, clipped to `chars`; ∅ for a token that shows nothing."""
    shown = _visible(text)
    if len(shown) > chars:
        shown = shown[: chars - 1] + "…"
    return html.escape(shown) or "∅"


def node_tooltip(event: RoundEvent, i: int, text: str) -> str:
    """Node i's tooltip, plain text: fate, token, depth, p, q and the cumulative draft probability.
    p is known where the rule tried the node (its parent was kept), else it is not shown."""
    nodes = event.tree
    n = nodes[i]
    tried = n.parent < 0 or nodes[n.parent].fate == ACCEPTED
    p = f"p={prob(n.p)}" if tried else "p: not computed (its parent was not kept)"
    cut = ""
    if n.fate == ACCEPTED and n.depth > len(event.new_tokens):
        cut = " (not committed: the run stopped before it)"
    return (f"{FATE_WORDS.get(n.fate, n.fate)}{cut}: {shown(text)!r} at depth {n.depth}; {p}  "
            f"q={prob(n.q)}  cumulative q={prob(n.score)}")


def _target_chip(event: RoundEvent, text: str) -> str:
    """The target's own token after the accepted path, if it survived the run's end."""
    if len(event.new_tokens) <= event.accepted:
        return ""
    fate = target_fate(event)
    why = ("drawn from p with the refused candidates removed" if fate == "recovered"
           else "drawn from p after a leaf was kept" if event.tree else "the target's token: "
           "nothing was drafted this round")
    title = f"{fate}: {shown(text)!r}, the target's own token after the accepted path ({why})"
    return f'<div class="tree-branch">{token_html(fate, _chip_text(text), title, " tree-node")}</div>'


def kept_text(event: RoundEvent) -> str:
    """What a round kept: its accepted drafts and the target's token, or, where the output ended
    inside the accepted path (only an EOS does: the budget leaves room for the target's token),
    the drafts it committed."""
    if len(event.new_tokens) > event.accepted:
        return f"{event.accepted} accepted, then the target's token ({target_fate(event)})"
    return (f"{event.accepted} accepted, {len(event.new_tokens)} of them committed: the output ended "
            "at EOS, before the target's token")


def round_html(event: RoundEvent, pieces_of: Pieces, rounds: int | None = None,
               greedy: bool = False, context: Sequence[int] = ()) -> str:
    """One round's tree as nested HTML; context: the tokens committed before the round."""
    of = f" of {rounds}" if rounds else ""
    committed = pieces_of(context, event.new_tokens)
    target = committed[event.accepted] if len(committed) > event.accepted else ""
    if not event.tree:
        why = ("drafted a chain of " + str(event.k) + " tokens" if event.k
               else "drafted nothing (only the target's token fitted the budget)" if event.stop == "length"
               # the drafter keeps its best node whatever the bar (TreeProposer._choose)
               else "drafted nothing (the draft cannot read a token of the context"
                    + (", or only the target's token fitted the budget)" if event.stop else ")"))
        return (f'<div class="specviz-tree" data-round="{event.round}"><div class="tree-head">'
                f"<b>Round {event.round}{of}</b> {why}.</div>"
                f'<div class="tree-body">{_target_chip(event, target)}</div></div>')
    nodes, kids = event.tree, children(event.tree)
    path = [i for i, n in enumerate(nodes) if n.fate == ACCEPTED]
    last = path[-1] if path else -1
    depth = max(n.depth for n in nodes)

    def branch(i: int) -> str:
        n = nodes[i]
        fate = n.fate if n.fate in (ACCEPTED, REJECTED) else UNREACHED
        path = [nodes[a].token for a in ancestors(nodes, i)]  # root .. i
        text = pieces_of(context, path)[-1]
        chip = token_html(fate, _chip_text(text), node_tooltip(event, i, text), " tree-node",
                          f' data-node="{i}"')
        return f'<div class="tree-branch">{chip}{below(i)}</div>'

    def below(i: int) -> str:
        inner = (_target_chip(event, target) if i == last else "") + "".join(
            branch(c) for c in kids.get(i, []))
        return f'<div class="tree-kids">{inner}</div>' if inner else ""

    committed = "".join(committed)
    head = (f"<b>Round {event.round}{of}</b>: {len(nodes)} node{'s' * (len(nodes) != 1)} verified in one "
            f"target pass, depth "
            f"{depth}; {kept_text(event)}. "
            f"Committed: <code>{_chip_text(committed, 80)}</code>. Hover a node for its p, q and "
            "cumulative draft probability; refused nodes are struck through, never-reached ones "
            "outlined with dots.")
    if greedy:
        head += (" Greedy run: p is 1 for the target's top token and 0 otherwise; q is the draft's "
                 "softmax at temperature 1.")
    root = '<span class="tree-node tree-root" title="the last committed token">▶</span>'
    return (f'<div class="specviz-tree" data-round="{event.round}"><div class="tree-head">{head}</div>'
            f'<div class="tree-body" role="group" {KEYS}><div class="tree-branch">{root}{below(-1)}</div>'
            '</div></div>')


def _bar(event: RoundEvent) -> str:
    """The round's path as bars, and in words for a screen reader and a pointer (role="img" with
    its aria-label and title): the bars alone were empty elements, told apart by colour."""
    depth = max((n.depth for n in event.tree), default=event.k)
    rest = max(0, depth - event.kept)
    cells = ['<i class="tree-bar accepted"></i>'] * event.kept  # kept in the output (an EOS ends it)
    cells += ['<i class="tree-bar refused"></i>'] * rest
    words = ([f"{event.kept} accepted"] if depth else ["nothing drafted"]) + (
        [f"{rest} more of depth {depth} not kept"] if rest else [])
    if len(event.new_tokens) > event.accepted:
        cells.append(f'<i class="tree-bar {target_fate(event)}"></i>')
        words.append(f"then the target's token ({target_fate(event)})")
    words = html.escape(", ".join(words))
    return f'<span class="tree-path" role="img" aria-label="{words}" title="{words}">{"".join(cells)}</span>'


def overview_html(events: Sequence[RoundEvent], pieces_of: Pieces, current: int | None = None) -> str:
    """Every round on one line (the newest OVERVIEW_ROUNDS): nodes, depth, accepted length as a
    bar (green accepted, grey the rest of the depth, then the target's token) and the text."""
    if not events:
        return ""
    stats = RunStats.of(events)
    trees = [e for e in events if e.tree]
    summary = (f"{len(trees)} of {len(events)} round{'s' * (len(events) != 1)} verified a tree: "
               f"{stats.nodes_verified} node{'s' * (stats.nodes_verified != 1)} "
               f"({stats.nodes_per_round()}), {stats.accepted} accepted"
               + (f" ({percent(stats.accepted_per_node)} of the nodes)" if stats.nodes_verified else "")
               + f", {beside(stats.tokens_per_pass, 1.0)} tokens per target pass.")
    listed = list(zip(events, contexts(events), strict=True))
    shown = listed[-OVERVIEW_ROUNDS:]
    if len(events) > len(shown):
        summary += f" The newest {len(shown)} rounds are listed."
        if current is not None and 1 <= current <= len(events) - len(shown):  # the round opened beside
            shown = [listed[current - 1], *shown]  # it, older than those: its row first, marked
            summary = summary.removesuffix(".") + f", after round {current}, the one shown."
    rows = []
    for e, context in shown:
        depth = max((n.depth for n in e.tree), default=0)
        text = "".join(pieces_of(context, e.new_tokens))
        mark = ' class="tree-current"' if e.round == current else ""
        rows.append(f"<tr{mark}><td>{e.round}</td><td>{e.nodes if e.tree else '—'}</td>"
                    f"<td>{depth or '—'}</td><td>{e.kept}</td><td>{_bar(e)}</td>"
                    f"<td><code>{_chip_text(text, 40)}</code></td></tr>")
    return (f'<div class="specviz-tree"><div class="tree-head">{summary}</div>'
            '<div class="tree-overview"><table><thead><tr><th>round</th><th>nodes</th><th>depth</th>'
            "<th>accepted</th><th>path</th><th>committed</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div></div>")


def tree_run(events: Sequence[RoundEvent]) -> bool:
    """The token tree drafted the run, whether or not any round verified a tree (a run of one
    token verifies none)."""
    return any(e.tree or e.source == "tree" for e in events)


def chain_html() -> str:
    return f'<div class="specviz-tree"><div class="tree-head">{html.escape(CHAIN_NOTE)}</div></div>'


def contexts(events: Sequence[RoundEvent]) -> list[list[int]]:
    """For each round, the last CONTEXT tokens committed before it (the prompt is not in events)."""
    out, committed = [], []
    for e in events:
        out.append(committed[-CONTEXT:])
        committed = (committed + list(e.new_tokens))[-CONTEXT:]
    return out


def fullest_round(events: Sequence[RoundEvent]) -> int:
    """The round a finished run opens on: the most nodes verified, then the most tokens kept, then
    the latest. The last round is often a small tree the token budget cut; this one shows the
    tree's branches."""
    return max(range(1, len(events) + 1),
               key=lambda n: (events[n - 1].nodes, events[n - 1].kept, n), default=1)


def tree_views(events: Sequence[RoundEvent], pieces_of: Pieces, round_number: int | None = None,
               greedy: bool = False) -> tuple[str, str]:
    """(round HTML, overview HTML) for a run: round_number's tree (default the last round), or
    the chain note for a run without trees."""
    if not tree_run(events):
        return chain_html(), ""
    number = len(events) if round_number is None else round_number
    if not 1 <= number <= len(events):
        raise ValueError(f"pick a round in 1..{len(events)}")
    event = events[number - 1]
    context = contexts(events[:number])[-1]
    return (round_html(event, pieces_of, len(events), greedy, context),
            overview_html(events, pieces_of, number))
