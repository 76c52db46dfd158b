"""The token text's tooltips: p, q and the chance the rule kept each draft, against hand values
and against the rule itself."""

import html
import math
import re
from dataclasses import replace

import torch
from test_detok import Bytes

from specviz.engine import RoundEvent
from specviz.render import REJECTED, round_spans
from specviz.tree import TreeNode, walk


class Letters:
    """A tokenizer where token i is the letter 'a' + i."""

    def decode(self, ids, **_):
        return "".join(chr(97 + i) for i in ids)


def event(**fields) -> RoundEvent:
    base = dict(round=2, k=3, draft_tokens=[0, 1, 2], accepted=1, token=3, kind="recovered",
                new_tokens=[0, 3], target_probs=[0.5, 0.3, 0.9], draft_probs=[0.6, 0.35, 0.9],
                target_passes=2, draft_passes=6, draft_seconds=0.01, target_seconds=0.1,
                round_seconds=0.12, elapsed=0.3, position=1, source="draft", target_cache_length=3,
                stop=None)
    return RoundEvent(**base | fields)


def test_a_chain_round_shows_min_1_p_over_q_up_to_its_first_refusal_and_nothing_after():
    spans = [s for s in round_spans(event(), Letters(), [5]) if s.position]
    kept, refused, untested = spans
    assert math.isclose(kept.keep, 0.5 / 0.6) and "kept with probability 0.8333" in kept.tooltip
    assert "p(x)=0.5000  q(x)=0.6000  kept with probability 0.8333" in kept.tooltip
    # p over q past 1 (0.9 against 0.6) is kept for sure: min(1, 1.5) = 1, shown as such
    sure = [s for s in round_spans(event(target_probs=[0.9, 0.3, 0.9]), Letters(), [5]) if s.position][0]
    assert sure.keep == 1.0 and "kept with probability 1.0000" in sure.tooltip
    assert "token tree" not in sure.tooltip
    assert refused.fate == REJECTED and math.isclose(refused.keep, 0.3 / 0.35)
    # the third draft was verified in the same pass, but the rule stopped at the second
    assert untested.fate == REJECTED and untested.p is None and untested.keep is None
    assert "never tested" in untested.tooltip and "p(x)" not in untested.tooltip


def test_nothing_of_a_round_is_shown_past_the_end_of_the_output():
    """EOS as the first of two kept drafts (a, then the EOS b; c refused): the page showed a, b and
    then the refused c, past the end, while the kept draft after the EOS was rightly hidden."""
    ended = event(k=4, draft_tokens=[0, 1, 2, 4], accepted=2, token=3, new_tokens=[0, 1], stop="eos",
                  target_probs=[1.0, 1.0, 0.0, 1.0], draft_probs=[1.0] * 4)
    assert [(s.text, s.fate) for s in round_spans(ended, Letters(), [5])] == [("a", "accepted"),
                                                                              ("b", "accepted")]
    whole = event(k=4, draft_tokens=[0, 1, 2, 4], accepted=2, token=3, new_tokens=[0, 1, 3],
                  target_probs=[1.0, 1.0, 0.0, 1.0], draft_probs=[1.0] * 4)
    assert [s.text for s in round_spans(whole, Letters(), [5])] == ["a", "b", "d", "c", "e"]


def test_each_rounds_tokens_are_read_after_the_output_so_far_not_after_its_drafts():
    """A UTF-8 character split across two rounds: round 1 commits its first byte (0xC3), round 2
    keeps the second (0xA9) as a draft, then the bonus b. The draft reads as the whole character
    only after what round 1 committed; refused drafts never join the context."""
    from specviz.render import all_spans

    r1 = event(round=1, k=0, draft_tokens=[], accepted=0, token=0xC3, kind="bonus", new_tokens=[0xC3],
               target_probs=[], draft_probs=[])
    r2 = event(round=2, k=2, draft_tokens=[0xA9, 0x41], accepted=1, token=ord("b"), kind="recovered",
               new_tokens=[0xA9, ord("b")], target_probs=[1.0, 0.0], draft_probs=[1.0, 1.0])
    spans = all_spans([r1, r2], Bytes(), [ord("x")])
    assert [(s.text, s.fate) for s in spans] == [("", "target"), ("\u00e9", "accepted"),
                                                 ("b", "recovered"), ("A", REJECTED)]


def test_a_run_cut_inside_a_character_ends_with_the_mark_it_decodes_to():
    """The token budget ends the run on an emoji's first byte: the last token shows the U+FFFD
    the output decodes to, not "", while a round that did not end the run still holds it back."""
    from specviz.render import all_spans

    last = event(round=1, k=1, draft_tokens=[ord("a")], accepted=1, token=0xF0, kind="bonus",
                 new_tokens=[ord("a"), 0xF0], target_probs=[1.0], draft_probs=[1.0], stop="length")
    assert [s.text for s in all_spans([last], Bytes(), [ord("x")])] == ["a", "\ufffd"]
    assert [s.text for s in all_spans([replace(last, stop=None)], Bytes(), [ord("x")])] == ["a", ""]


def test_a_greedy_chain_keeps_with_p():
    greedy = event(target_probs=[1.0, 0.0, 1.0], draft_probs=[1.0, 1.0, 1.0])
    assert [s.keep for s in round_spans(greedy, Letters(), [5]) if s.position] == [1.0, 0.0, None]


# Root -> A (token 0, p .5), B (token 1, p .3); B -> C (token 2, p .2), D (token 3).
TREE = (TreeNode(-1, 0, 1, q=0.6, score=0.6), TreeNode(-1, 1, 1, q=0.35, score=0.35),
        TreeNode(1, 2, 2, q=0.5, score=0.175), TreeNode(1, 3, 2, q=0.4, score=0.14))
P = torch.tensor([[0.5, 0.3, 0.2, 0.0],  # row 0: the root's p; row 1 + i: after node i
                  [0.25, 0.25, 0.25, 0.25],
                  [0.1, 0.1, 0.2, 0.6],
                  [0.25, 0.25, 0.25, 0.25],
                  [0.25, 0.25, 0.25, 0.25]])


def test_a_tree_round_shows_the_chance_the_walk_kept_each_candidate():
    """The walk tries siblings in order: B, after A's refusal, is kept with p(B) / (1 - p(A)) =
    0.6, not min(1, p/q) = 0.857; C, B's first child, with p(C) = 0.2. Checked against 20,000 walks."""
    g = torch.Generator().manual_seed(0)
    a_refused = b_kept = c_tried = c_kept = 0
    verdict = None
    for _ in range(20_000):
        v = walk(TREE, P, g, greedy=False)
        fates = [n.fate for n in v.nodes]
        a_refused += fates[0] == "rejected"
        b_kept += fates[1] == "accepted"
        c_tried += fates[2] != "unreached"
        c_kept += fates[2] == "accepted"
        if fates == ["rejected", "accepted", "rejected", "rejected"]:
            verdict = v
    # 4 standard errors: sqrt(.24 / 10,000) = .005 and sqrt(.16 / 6,000) = .005
    assert abs(b_kept / a_refused - 0.6) < 0.02 and abs(c_kept / c_tried - 0.2) < 0.02
    tree_event = event(k=2, draft_tokens=[1, 2], accepted=1, token=3, new_tokens=[1, 3],
                       target_probs=[0.3, 0.2], draft_probs=[0.35, 0.5], source="tree", tree=verdict.nodes)
    spans = [s for s in round_spans(tree_event, Letters(), [5]) if s.position]
    assert [s.fate for s in spans] == ["accepted", REJECTED]
    assert [round(s.keep, 6) for s in spans] == [0.6, 0.2]
    assert "kept with probability 0.6000" in spans[0].tooltip and "0.857" not in spans[0].tooltip
    assert "one-hot draft" in spans[0].tooltip  # why it is not min(1, p/q) = 0.857
    chain = [s for s in round_spans(replace(tree_event, tree=(), source="draft"), Letters(), [5])
             if s.position]  # a chain keeps with min(1, p/q): no note
    assert round(chain[0].keep, 6) == round(0.3 / 0.35, 6) and "one-hot" not in chain[0].tooltip
    # the timeline's row: "1 of 4 nodes" with its last number and word on one line (NBSP)
    from specviz.metrics import RunStats
    from specviz.views import timeline_html

    assert "<td>1 of 4&#160;nodes</td>" in timeline_html([], RunStats.of([tree_event]))


def test_a_long_token_text_from_an_opened_trace_is_clipped_on_the_page():
    """A trace may hold token texts of 1,000 characters; '&' escapes to five. The page shows 100,
    so 4 MiB of such spans cannot become ~40 MiB of HTML (text and timeline chips)."""
    from specviz.render import SHOWN_TOKEN_CHARS, Span, to_html
    from specviz.views import _chip

    span = Span("&" * 1000, "accepted", 1, 1, 1, 0.5, 0.5, 1.0)
    for page in (to_html([span]), _chip(span)):
        # the chip's text and its tooltip's, each clipped: 2 x 99 escaped '&'
        assert page.count("&amp;") == 2 * (SHOWN_TOKEN_CHARS - 1) and len(page) < 2000
        assert "&…</span>" in html.unescape(page)
    assert "&amp;" * 3 in to_html([Span("&&&", "accepted", 1, 1, 1)])  # short texts are whole


def test_a_tokens_tooltip_names_the_token_as_a_tree_nodes_does():
    """The arrow keys read a token's tooltip out (assets/tips.js): "accepted: round 1, draft
    position 1; ..." told a screen reader whose token it was and never which. It says the text as
    the page shows it (clipped, bidirectional controls visible), quoted."""
    from specviz.render import Span

    assert Span("def", "accepted", 7, 1, 1, 0.5, 0.6, 0.5 / 0.6).tooltip == (
        "accepted: 'def', round 1, draft position 1; p(x)=0.5000  q(x)=0.6000  kept with probability 0.8333")
    assert Span("\n", "bonus", 8, 3, 0).tooltip == "bonus: '\\n', round 3, target's token"
    assert Span("a\u202eb", "rejected", 9, 2, 2, None, 0.25).tooltip.startswith(
        "rejected: 'a⟨U+202E⟩b', round 2, draft position 2; q(x)=0.2500; never tested")


def test_a_refused_draft_is_a_deletion_and_the_targets_own_tokens_insertions_to_a_screen_reader():
    """Each fate's element: assistive technology reads <del> and <ins> (only the slow browser test
    checked the bonus token's <ins>)."""
    from specviz.render import Span, to_html

    fates = ["accepted", "rejected", "recovered", "bonus", "target"]
    page = to_html([Span("x", fate, 7, 1, 1) for fate in fates])
    assert re.findall(r"<(\w+) class=\"tok (\w+)", page) == [
        ("span", "accepted"), ("del", "rejected"), ("ins", "recovered"), ("ins", "bonus"), ("span", "target")]


def test_token_html_drops_refused_drafts_first_then_counts_the_output_tokens_it_left_out():
    """Past the budget the refused drafts go first: a 512-token run at k=16 keeping 2 drafts a
    round was cut part-way through its output while every refused draft still showed."""
    from specviz.render import Span, span_html, to_html

    kept, refused = Span("ab", "accepted", 7, 1, 1), Span("ab", "rejected", 8, 1, 1)
    one = len(span_html(kept))  # one token's HTML: a refused one (a <del>) is 2 characters shorter
    assert len(span_html(refused)) == one - 2
    spans = [kept, refused] * 5  # 5 output tokens, 5 refused drafts
    whole = to_html(spans, budget=10 * one)
    assert whole.count('class="tok ') == 10 and "not shown" not in whole
    page = to_html(spans, budget=6 * one)  # over: the refused go; the 5 kept fit
    assert page.count('class="tok accepted"') == 5 and 'class="tok rejected"' not in page
    assert "5 refused drafts not shown, to keep this view within 0 KiB" in page
    assert "more output tokens" not in page
    cut = to_html(spans, budget=3 * one)  # over again: the output tokens from the end
    assert cut.count('class="tok accepted"') == 3 and "&#8230; 2 more output tokens not shown" in cut


def test_a_growing_token_text_is_the_start_of_every_later_one_and_of_the_closed_one():
    """While a run streams its text is left open (no closing tag, no notes), so that each view
    begins with the one before and Gradio's stream sends only the tokens added: closed, the last
    view's `</div>` made every view a new string, sent whole (35 MiB of a 512-token run's stream).
    The finished run's text is closed, and the browser reads the open one as the same element."""
    from specviz.render import Span, span_html, to_html

    spans = [Span(f"t{i}", "accepted" if i % 3 else "rejected", i, i // 4 + 1, i % 4) for i in range(40)]
    views = [to_html(spans[:n], growing=True) for n in range(0, 41, 5)]
    assert all(later.startswith(earlier) for earlier, later in zip(views, views[1:], strict=False))
    closed = to_html(spans)
    assert closed == views[-1] + "</div>" and "</div>" not in views[-1] and views[-1].count("<div") == 1
    # past the budget the refused drafts go, and the notes wait for the closed text
    one = len(span_html(spans[1]))
    over = to_html(spans, budget=30 * one, growing=True)
    assert 'class="tok rejected"' not in over and "not shown" not in over and "specviz-more" not in over
    closed = to_html(spans, budget=30 * one)
    assert closed.startswith(over + "</div>") and "refused drafts not shown" in closed


def test_the_timeline_counts_every_round_it_leaves_out():
    from specviz.metrics import RunStats
    from specviz.views import timeline_html

    events = [event(round=i, new_tokens=[0], accepted=0) for i in range(1, 555)]
    page = timeline_html([], RunStats.of(events))
    assert page.count("<tr><td>") == 200 and "&#8230; 354 earlier rounds not shown" in page
    rounds = re.findall(r"<tr><td>(\d+)</td>", page)  # the newest 200, newest first
    assert (rounds[0], rounds[1], rounds[-1]) == ("554", "553", "355")
    assert re.findall(r"<tr><td>(\d+)</td>", timeline_html([], RunStats.of(events[:3]))) == ["3", "2", "1"]
    assert "not shown" not in timeline_html([], RunStats.of(events[:200]))


def test_the_timeline_says_when_the_output_ended_among_the_kept_drafts():
    """EOS as the second of four accepted drafts: the row shows two chips and 2 tokens, so "4/4"
    alone contradicted it; and "4/4, 2 committed" counted as kept the 2 drafts past the EOS that
    α and the acceptance rate leave out. The column is the drafts the output kept (RoundEvent.kept),
    summing to the stats' accepted; only an EOS ends the output there (the budget leaves room for
    the target's token), so the row never blames the budget. Each number is held to its word by a
    no-break space (&#160;): in a 375 px phone's timeline the cell, 62 px wide, wrapped
    "(the rule accepted 4)" with "4)" alone on its last line."""
    from dataclasses import replace

    from specviz.metrics import RunStats
    from specviz.render import Span
    from specviz.views import timeline_html

    e = event(round=1, k=4, draft_tokens=[10, 0, 11, 12], accepted=4, token=13, kind="bonus",
              new_tokens=[10, 0], target_probs=[1.0] * 4, draft_probs=[1.0] * 4, stop="eos")
    spans = [Span("a", "accepted", 10, 1, 1), Span("<eos>", "accepted", 0, 1, 2)]
    assert "<td>2/4, EOS at draft&#160;2 (the rule accepted&#160;4)</td>" in \
        timeline_html(spans, RunStats.of([e]))
    assert timeline_html(spans, RunStats.of([e])).endswith("<td>(cut)</td><td>2</td></tr></tbody></table>")
    # EOS as the second draft of two kept (the third refused): 2 of 4 kept, both committed
    two = replace(e, accepted=2, kind="recovered", target_probs=[1.0, 1.0, 0.0, 1.0])
    assert "<td>2/4, EOS at draft&#160;2</td><td>(cut)</td><td>2</td></tr>" in \
        timeline_html([], RunStats.of([two]))
    whole = replace(e, new_tokens=[10, 0, 11, 12, 13], stop=None)
    assert "<td>4/4</td>" in timeline_html(spans, RunStats.of([whole]))
    # by hand from the column: round 1 kept 1 of 4 and was refused (the output went on), round 2
    # kept 2 of 4 and met no refusal: α = 3 / (3 + 1), the acceptance rate 3 / 8
    first = event(round=1, k=4, draft_tokens=[5, 6, 7, 8], accepted=1, token=9, new_tokens=[5, 9],
                  target_probs=[1.0] * 4, draft_probs=[1.0] * 4, position=0, target_passes=1)
    stats = RunStats.of([first, replace(e, round=2, position=2)])
    kept = re.findall(r"<tr><td>\d+</td><td>[^<]*</td><td>(\d+)/4", timeline_html([], stats))
    assert kept == ["2", "1"] and stats.accepted == 3
    assert (stats.alpha, stats.acceptance_rate) == (0.75, 0.375)


def test_token_views_are_ascii_so_one_emoji_cannot_widen_a_pages_state_fourfold():
    """Python stores a string at the width of its widest character: one emoji made a view within
    HTML_BUDGET characters take 4 bytes a character (3 MiB of a page's state, kept per page).
    The views write every non-ASCII character as a reference; the browser shows the same text."""
    import sys

    from specviz.metrics import RunStats
    from specviz.render import HTML_BUDGET, Span, to_html
    from specviz.views import timeline_html

    spans = [Span("😀" * 100, "accepted", 7, 1, 1), Span("↵ é", "rejected", 8, 1, 1)]
    page = to_html(spans * 2000)
    assert page.isascii() and sys.getsizeof(page) < len(page) + 100  # one byte a character
    assert len(page) <= HTML_BUDGET + 1000 and "😀" * 100 in html.unescape(page)
    events = [event(round=i, new_tokens=[0], accepted=0) for i in range(1, 11)]
    spans = [Span("😀", "accepted", 0, i, 1) for i in range(1, 11)]
    timeline = timeline_html(spans, RunStats.of(events))
    assert timeline.isascii() and html.unescape(timeline).count("😀") == 20  # each chip and its tooltip


def test_bidirectional_controls_are_shown_not_obeyed():
    """A token of U+202E (right-to-left override) showed every token after it reversed, in the
    token view, the tree and a link's notice."""
    from specviz import treeview
    from specviz.render import Span, to_html
    from specviz.settings import markdown_text

    html = to_html([Span("\u202egnp.exe", "accepted", 5, 1, 0), Span(" ok", "bonus", 6, 1, 0)])
    assert "\u202e" not in html and "&#8238;" not in html and "U+202E" in html
    assert "⟨U\\+2067⟩" in markdown_text("a\u2067b") and "\u2067" not in markdown_text("a\u2067b")
    assert treeview._chip_text("x\u200fy") == "x⟨U+200F⟩y"


def test_a_terminal_marks_each_fate_without_colour_too_and_no_color_keeps_only_the_marks():
    """The CLI's text told recovered and bonus from accepted by colour alone, and NO_COLOR
    (no-color.org) was not honoured."""
    from specviz.render import Span, to_ansi

    spans = [Span("a", "accepted", 1, 1, 1), Span("b", "rejected", 2, 1, 2), Span("c", "recovered", 3, 1, 0),
             Span("d", "bonus", 4, 2, 0), Span("e", "target", 5, 3, 0)]
    assert to_ansi(spans) == ("\x1b[32ma\x1b[0m\x1b[31;9mb\x1b[0m\x1b[33;4mc\x1b[0m\x1b[34;1md\x1b[0me")
    assert to_ansi(spans, marks_only=True) == "a\x1b[9mb\x1b[0m\x1b[4mc\x1b[0m\x1b[1md\x1b[0me"
    assert to_ansi(spans, color=False) == "acde"  # a pipe gets the output alone


class Pieces:
    """A tokenizer where token i is PIECES[i]."""

    PIECES = ["x\r\n", "\r", "y", "z"]

    def decode(self, ids, **_):
        return "".join(self.PIECES[i] for i in ids)


def test_a_carriage_return_is_shown_as_a_mark_and_breaks_no_line():
    """A browser's HTML parser turns every CR into a line feed, so the coloured text's "\r↵<br>" for
    a CRLF token broke its line twice (an empty line after every line of a CRLF text), and a lone
    CR broke it with no ↵ to say so; the timeline's chip showed it as a space. The tree view shows
    ␍, as here: a CRLF is one line break."""
    from specviz.metrics import RunStats
    from specviz.render import to_html
    from specviz.views import timeline_html

    crlf = event(k=2, draft_tokens=[0, 1], accepted=2, token=2, kind="bonus", new_tokens=[0, 1, 2],
                 target_probs=[1.0, 1.0], draft_probs=[1.0, 1.0])
    spans = round_spans(crlf, Pieces(), [3])
    assert "".join(s.text for s in spans) == "x\r\n\ry"  # the output, whole
    for page in (to_html(spans), timeline_html(spans, RunStats.of([crlf]))):
        assert "\r" not in page  # the browser reads each as a line break
        assert html.unescape(page).count("\u240d") == 4  # ␍, shown (in each token and its tooltip)
    assert to_html(spans).count("<br>") == 1  # one line break: the CRLF's


def test_a_tokens_p_and_q_print_off_0_and_1_when_they_are_not():
    """As the lab's (digits.share): a draft the target finds unlikely (p(x) = 2e-5, q(x) = 3e-5,
    kept with probability 2/3) read "p(x)=0.0000  q(x)=0.0000" beside it, as if p/q were 0/0; a
    refused draft with p/q = 0.99999 read "kept with probability 1.0000"."""
    from specviz import treeview

    kept = [s for s in round_spans(event(target_probs=[2e-5, 0.3, 0.9], draft_probs=[3e-5, 0.35, 0.9]),
                                   Letters(), [5]) if s.position][0]
    assert "p(x)=0.00002  q(x)=0.00003  kept with probability 0.6667" in kept.tooltip
    near = event(target_probs=[0.5, 0.99996, 0.9], draft_probs=[0.6, 0.99997, 0.9])
    refused = [s for s in round_spans(near, Letters(), [5]) if s.position][1]
    assert refused.fate == REJECTED
    assert "p(x)=0.99996  q(x)=0.99997  kept with probability 0.99999" in refused.tooltip
    assert treeview.prob(0.99996) == "0.99996" and treeview.prob(0.5) == "0.5000"


def test_a_control_character_token_is_shown_as_its_control_picture():
    """A token of a NUL (or another C0 control, or DEL) drew as nothing and was not marked blank:
    a token no one could point at. Tab, newline and CR keep their own marks."""
    from specviz.render import to_html
    from specviz.treeview import _chip_text

    class Controls:
        PIECES = ["\x00", "a\x1b[31m", "\x7f", "\t"]

        def decode(self, ids, **_):
            return "".join(self.PIECES[i] for i in ids)

    e = event(k=2, draft_tokens=[0, 1], accepted=2, token=2, kind="bonus", new_tokens=[0, 1, 2],
              target_probs=[1.0, 1.0], draft_probs=[1.0, 1.0])
    page = html.unescape(to_html(round_spans(e, Controls(), [3])))
    assert "\u2400" in page and "a\u241b[31m" in page and "\u2421" in page
    assert not any(chr(c) in page for c in [*range(9), *range(11, 13), *range(14, 32), 0x7F])
    assert _chip_text("\x00") == "\u2400" and _chip_text("\t") == "⇥"


def test_a_character_split_at_a_rounds_accepted_and_refused_drafts_is_shown_once_whole():
    """Qwen2.5 writes " 🚀" as " \\xf0\\x9f", "\\x9a", "\\x80": a round that kept the first two and
    refused a draft that would have finished another emoji, then took the target's "\\x80". The
    kept draft's space was lost ("Hi🚀"); the refused draft shows what it would have written."""
    from test_detok import Cuts

    from specviz.render import all_spans

    tok = Cuts(b"Hi", b" \xf0\x9f", b"\x9a", b"\x98", b"\x80", b"!")
    e1 = event(round=1, k=3, draft_tokens=[1, 2, 3], accepted=2, token=4, kind="recovered",
               new_tokens=[1, 2, 4], target_probs=[1.0, 1.0, 0.0], draft_probs=[1.0] * 3)
    e2 = event(round=2, k=0, draft_tokens=[], accepted=0, token=5, kind="bonus", new_tokens=[5],
               target_probs=[], draft_probs=[])
    spans = all_spans([e1, e2], tok, [0])
    assert [(s.text, s.fate) for s in spans] == [(" ", "accepted"), ("", "accepted"), ("🚀", "recovered"),
                                                 ("\U0001f698", REJECTED), ("!", "target")]
    assert "".join(s.text for s in spans if s.emitted) == tok.decode([1, 2, 4, 5])


def test_a_token_of_characters_that_draw_nothing_is_shown_by_its_code_points():
    """Qwen2.5 has tokens of a zero-width joiner (👨‍👩‍👧), of U+FE0F (❤️), of a soft hyphen and a
    zero-width space: each drew as nothing, a token no one could see or point at; a C1 control
    (U+009B reads as ESC [ in a terminal) likewise. Inside a token with other text they stay."""
    from specviz import treeview
    from specviz.render import Span, to_html

    texts = ["\u200d", "\ufe0f", "\u00ad", "\u200b\u2060", "\x85", "👨\u200d", "❤\ufe0f"]
    page = html.unescape(to_html([Span(t, "accepted", i, 1, 1) for i, t in enumerate(texts)]))
    shown = re.findall(r'data-round="1">(.*?)</span>', page)
    assert shown == ["⟨U+200D⟩", "⟨U+FE0F⟩", "⟨U+00AD⟩", "⟨U+200B⟩⟨U+2060⟩", "⟨U+0085⟩",
                     "👨\u200d", "❤\ufe0f"]
    assert treeview._chip_text("\u200d") == "⟨U+200D⟩" and treeview._chip_text("a\u200db") == "a\u200db"


def test_a_terminal_shows_a_tokens_escape_sequences_and_a_pipe_gets_them_as_written():
    """The CLI wrote a token's ESC ] 52 (set the clipboard) or ESC [ 2 J (clear the screen) to the
    terminal, which obeyed it."""
    from specviz.render import Span, to_ansi

    spans = [Span("\x1b]52;c;aGk=\x07", "accepted", 1, 1, 1), Span("\x1b[2J\u202e", "target", 2, 1, 0)]
    shown = to_ansi(spans)
    assert shown == "\x1b[32m\u241b]52;c;aGk=\u2407\x1b[0m\u241b[2J⟨U+202E⟩"
    assert to_ansi(spans, marks_only=True) == "\u241b]52;c;aGk=\u2407\u241b[2J⟨U+202E⟩"
    assert to_ansi(spans, color=False) == "\x1b]52;c;aGk=\x07\x1b[2J\u202e"  # the output, as it is
