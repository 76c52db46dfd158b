"""The token-tree views against hand computations on a constructed tree round."""

from dataclasses import replace
from html.parser import HTMLParser

import pytest
from test_detok import Bytes

from specviz import figures, treeview
from specviz.engine import RoundEvent
from specviz.metrics import RunStats
from specviz.tree import TreeNode, check
from specviz.views import stats_html

XSS = "<img src=x onerror=1>"
TEXT = {10: "def", 11: " x", 12: "(", 13: ":", 14: "\n", 15: XSS, 16: " y"}


def pieces(context, tokens):
    """The views' pieces_of for a tokenizer where every token stands alone."""
    return [TEXT[t] for t in tokens]

# Root -> "def" (0, kept), " x" (1, never tried: "def" was kept first); "def" -> "(" (2), ":" (3),
# both refused; " x" -> "\n" (4); "(" -> XSS (5). The target's token after "def": " y" (recovered).
# p is known for the children of the root and of "def" (the nodes the rule tried or could have).
TREE = (
    TreeNode(-1, 10, 1, q=0.6, score=0.6, p=0.5, fate="accepted"),
    TreeNode(-1, 11, 1, q=0.3, score=0.3, p=0.2, fate="unreached"),
    TreeNode(0, 12, 2, q=0.5, score=0.3, p=0.1, fate="rejected"),
    TreeNode(0, 13, 2, q=0.25, score=0.15, p=0.3, fate="rejected"),
    TreeNode(1, 14, 2, q=0.9, score=0.27, p=0.0, fate="unreached"),
    TreeNode(2, 15, 3, q=0.5, score=0.15, p=0.0, fate="unreached"),
)


def tree_round(number: int = 1, tree=TREE, accepted: int = 1, token: int = 16) -> RoundEvent:
    """A tree round: the walked branch (kept "def", then the first refused child "(" and its first
    child) in the chain-shaped fields, as the engine fills them."""
    branch = [i for i in (0, 2, 5) if i < len(tree)]
    return RoundEvent(round=number, k=len(branch), draft_tokens=[tree[i].token for i in branch],
                      accepted=accepted, token=token, kind="recovered", new_tokens=[10, token],
                      target_probs=[tree[i].p for i in branch], draft_probs=[tree[i].q for i in branch],
                      target_passes=number, draft_passes=3 * number, draft_seconds=0.01,
                      target_seconds=0.1, round_seconds=0.12, elapsed=0.12 * number,
                      position=2 * (number - 1), source="tree", target_cache_length=0, stop=None,
                      tree=tree)


class Chips(HTMLParser):
    """data-node -> (classes, title) of every tree node chip; and every chip's classes in order."""

    def __init__(self, text: str):
        super().__init__()
        self.nodes, self.order, self.tags = {}, [], {}  # tags: data-node -> element (None: the target's)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "tree-node" in a.get("class", "").split():
            if "tree-root" not in a["class"].split():
                self.tags[a.get("data-node")] = tag
            self.order.append((a["class"].split(), a.get("data-node")))
            if a.get("data-node") is not None:
                self.nodes[int(a["data-node"])] = (set(a["class"].split()), a.get("title", ""))


def test_the_constructed_tree_is_a_valid_tree():
    check(TREE)


def test_each_node_carries_its_fate_in_its_class_and_a_refused_one_is_a_deletion():
    chips = Chips(treeview.round_html(tree_round(), pieces))
    classes = {i: c for i, (c, _) in chips.nodes.items()}
    assert set(classes) == set(range(6))
    assert classes[0] >= {"tok", "accepted"}
    assert "rejected" in classes[2] and "rejected" in classes[3]
    assert all("unreached" in classes[i] for i in (1, 4, 5))
    # assistive technology hears a refused node as deleted, the target's recovered one as inserted
    assert chips.tags == {"0": "span", "1": "span", "2": "del", "3": "del", "4": "span", "5": "span",
                          None: "ins"}
    # The target's own token hangs under "def", before its refused children, in the recovered colour.
    order = [(c, n) for c, n in chips.order if "tree-root" not in c]
    assert [n for _, n in order] == ["0", None, "2", "5", "3", "1", "4"]
    assert "recovered" in order[1][0]


def test_tooltips_show_the_hand_computed_p_q_and_cumulative_probability():
    chips = Chips(treeview.round_html(tree_round(), pieces))
    title = {i: t for i, (_, t) in chips.nodes.items()}
    assert title[0] == "accepted: 'def' at depth 1; p=0.5000  q=0.6000  cumulative q=0.6000"
    assert title[3] == "refused: ':' at depth 2; p=0.3000  q=0.2500  cumulative q=0.1500"
    assert title[1] == "never reached: ' x' at depth 1; p=0.2000  q=0.3000  cumulative q=0.3000"
    # Under a node that was not kept the rule never looked: p is not shown.
    assert title[4] == ("never reached: '\\n' at depth 2; p: not computed (its parent was not kept)  "
                        "q=0.9000  cumulative q=0.2700")
    assert title[5] == (f"never reached: {XSS!r} at depth 3; p: not computed (its parent was not kept)  "
                        "q=0.5000  cumulative q=0.1500")  # its parent "(" was refused: not tried either
    assert treeview.prob(3e-6) == "3.0e-06" and treeview.prob(0.0) == "0.0000"


def test_token_text_is_escaped_in_chips_titles_and_the_overview():
    event = tree_round(token=15)  # the attacker's text as the target's own token too
    text = treeview.round_html(event, pieces) + treeview.overview_html([event], pieces)
    assert "<img" not in text and "&lt;img src=x …" in text  # the chip clips at 12 characters
    assert "&#x27;&lt;img src=x onerror=1&gt;&#x27;" in text  # the full text in the title
    assert "onerror=1&gt;" in text and "↵" in text  # "\n" shows as ↵ on its chip


def test_a_huge_token_text_is_clipped_in_tooltips_too():
    """An opened trace's token text can be 1,000 × "&": 5,000 characters once escaped, in each of
    64 nodes' titles. Titles clip it as the run text does (render.shown)."""
    from specviz.render import SHOWN_TOKEN_CHARS

    def huge(context, tokens):
        return ["&" * 1000 for _ in tokens]

    page = treeview.round_html(tree_round(), huge)
    assert page.count("&amp;" * SHOWN_TOKEN_CHARS) == 0 and page.count("&amp;" * (SHOWN_TOKEN_CHARS - 1)) == 7
    assert len(page) < 7 * 5 * SHOWN_TOKEN_CHARS + 4000


def test_a_64_round_run_gets_one_overview_line_a_round_with_hand_computed_totals():
    events = [tree_round(i) for i in range(1, 65)]
    text = treeview.overview_html(events, pieces, current=17)
    body = text.split("<tbody>")[1]
    assert body.count("<tr") == 64 and body.count('class="tree-current"') == 1
    assert "<tr class=\"tree-current\"><td>17</td><td>6</td><td>3</td><td>1</td>" in body
    # 64 rounds × 6 nodes; 64 kept; 128 tokens in 64 passes.
    assert ("64 of 64 rounds verified a tree: 384 nodes (6.0 a tree round), 64 accepted (16.7% of the "
            "nodes), 2.00 tokens per target pass.") in text
    row = body.split("</tr>")[0]  # one kept (green), two more levels of depth, then the target's token
    assert row.count("tree-bar accepted") == 1 and row.count("tree-bar refused") == 2
    assert row.count("tree-bar recovered") == 1
    # the bars in words, for a screen reader and a pointer: alone they were empty elements, told
    # apart by colour
    words = "1 accepted, 2 more of depth 3 not kept, then the target&#x27;s token (recovered)"
    assert f'<span class="tree-path" role="img" aria-label="{words}" title="{words}">' in row
    stats = RunStats.of(events)
    assert stats.nodes_verified == 384 and stats.accepted_per_node == pytest.approx(1 / 6)


def test_a_one_round_one_node_overview_says_round_and_node():
    """"1 of 1 rounds verified a tree: 1 nodes" (the real pair, a one-node tree): singular now."""
    one = TreeNode(parent=-1, token=10, depth=1, q=0.9, score=0.9, p=1.0, fate="accepted")
    event = replace(tree_round(1, tree=(one,)), k=1, draft_tokens=[10], target_probs=[1.0], draft_probs=[0.9],
                    kind="bonus")
    assert "1 of 1 round verified a tree: 1 node (1.0 a tree round), 1 accepted" in \
        treeview.overview_html([event], pieces)


def test_the_overviews_plural_counts_the_runs_rounds_not_its_tree_rounds():
    """One tree round and a last one that verified none: "1 of 2 rounds", the plural by the 2
    rounds of the run (counted by the one tree round, it read "1 of 2 round")."""
    plain = replace(tree_round(2), tree=(), k=0, draft_tokens=[], accepted=0, new_tokens=[16], stop="length",
                    target_probs=[], draft_probs=[], target_top2=[])
    # 6 nodes over 1 tree round and 2 passes; 1 of the 6 kept; 2 + 1 tokens in 2 passes
    text = treeview.overview_html([tree_round(1), plain], pieces)
    assert ("1 of 2 rounds verified a tree: 6 nodes (6.0 a tree round, 3.0 a target pass), 1 accepted "
            "(16.7% of the nodes), 1.50 tokens per target pass.") in text


def test_a_few_nodes_over_many_passes_never_read_as_none_a_target_pass():
    """One tree round of one node among 30 rounds: 1 / 30 = 0.033 nodes a target pass, which one
    decimal printed as "0.0" beside "1 node"."""
    one = (replace(TREE[0], fate="rejected"),)
    plain = [replace(tree_round(i), tree=(), k=0, draft_tokens=[], accepted=0, new_tokens=[16],
                     target_probs=[], draft_probs=[], target_top2=[]) for i in range(2, 31)]
    text = treeview.overview_html([tree_round(1, one, accepted=0), *plain], pieces)
    assert "1 of 30 rounds verified a tree: 1 node (1.0 a tree round, 0.03 a target pass)" in text


def test_a_long_runs_overview_lists_the_opened_round_though_older_than_the_newest():
    """250 rounds, the panel opened on round 10 (the fullest): the overview lists the newest 200
    (51-250) and, first and marked, round 10, saying so; a round among the newest is not doubled."""
    events = [tree_round(i) for i in range(1, 251)]
    body = treeview.overview_html(events, pieces, current=10).split("<tbody>")[1]
    rounds = [int(row.split("<td>")[1].split("<")[0]) for row in body.split("</tr>")[:-1]]
    assert rounds == [10, *range(51, 251)]
    assert body.startswith('<tr class="tree-current"><td>10</td>') and body.count("tree-current") == 1
    text = treeview.overview_html(events, pieces, current=10)
    assert "The newest 200 rounds are listed, after round 10, the one shown." in text
    recent = treeview.overview_html(events, pieces, current=60)
    assert recent.count("<td>60</td>") == 1 and "The newest 200 rounds are listed." in recent


def test_a_tree_round_that_kept_none_of_its_drafts_reads_0_accepted_not_nothing_drafted():
    """Both of the root's candidates refused: the round drafted a tree of depth 1 and kept none of
    it. Its bar in words says so; "nothing drafted" is for a round that verified no tree."""
    refused = (replace(TREE[0], fate="rejected"), replace(TREE[1], fate="rejected"))
    event = replace(tree_round(1, tree=refused, accepted=0), k=1, draft_tokens=[10], target_probs=[0.5],
                    draft_probs=[0.6], new_tokens=[16])
    row = treeview.overview_html([event], pieces).split("<tbody>")[1]
    assert row.count("tree-bar accepted") == 0 and row.count("tree-bar refused") == 1
    words = "0 accepted, 1 more of depth 1 not kept, then the target&#x27;s token (recovered)"
    assert f'aria-label="{words}" title="{words}"' in row


def test_playback_shows_the_last_round_by_default_and_refuses_a_round_out_of_range():
    events = [tree_round(i) for i in range(1, 4)]
    round_text, overview = treeview.tree_views(events, pieces)
    assert 'data-round="3"' in round_text and "Round 3 of 3" in round_text
    assert 'class="tree-current"><td>3</td>' in overview
    assert 'data-round="2"' in treeview.tree_views(events, pieces, 2)[0]
    with pytest.raises(ValueError, match=r"pick a round in 1\.\.3"):
        treeview.tree_views(events, pieces, 4)


def test_a_kept_run_opens_on_its_fullest_round_not_a_budget_cut_last_one():
    """Most nodes first, then most tokens kept, then the latest: rounds of 6, 6 (2 kept), 6 and a
    last round the budget cut to 2 nodes open on round 2."""
    small = (replace(TREE[0], fate="accepted"), replace(TREE[1], fate="unreached"))
    two_kept = replace(tree_round(2, tree=TREE, accepted=2), new_tokens=[10, 12, 16])
    events = [tree_round(1), two_kept, tree_round(3), tree_round(4, tree=small)]
    assert [e.nodes for e in events] == [6, 6, 6, 2] and [e.kept for e in events] == [1, 2, 1, 1]
    assert treeview.fullest_round(events) == 2
    assert treeview.fullest_round(events[:1] + events[2:]) == 2  # a tie: the later, second listed
    assert treeview.fullest_round([]) == 1
    # nodes come before tokens kept: 6 nodes keeping 1 opens before 4 nodes keeping 2
    four = tuple(replace(n, fate="accepted") if i == 2 else n for i, n in enumerate(TREE[:4]))
    small_two = replace(tree_round(2, tree=four, accepted=2), new_tokens=[10, 12, 16])
    assert (small_two.nodes, small_two.kept) == (4, 2)
    assert treeview.fullest_round([tree_round(1), small_two]) == 1


def test_a_chain_run_shows_the_note_instead_of_a_tree():
    chain = [replace(tree_round(i), tree=(), source="draft") for i in (1, 2)]
    round_text, overview = treeview.tree_views(chain, pieces)
    assert "Token trees appear when the drafter is &#x27;token tree&#x27;" in round_text and overview == ""


def test_a_round_that_drafted_nothing_shows_only_the_target_token():
    event = replace(tree_round(), tree=(), k=0, draft_tokens=[], accepted=0, target_probs=[],
                    draft_probs=[], new_tokens=[16], kind="bonus")
    text = treeview.round_html(event, pieces)
    assert "drafted nothing" in text and "tok target tree-node" in text


def test_tree_figures_and_stats_match_hand_computations():
    events = [tree_round(1), tree_round(2, accepted=1),
              replace(tree_round(3), tree=TREE[:3], k=2, draft_tokens=[10, 12], target_probs=[0.5, 0.1],
                      draft_probs=[0.6, 0.5])]
    spec = RunStats.of(events)  # nodes 6, 6, 3: accepted 1 each
    fig = figures.tree_nodes(spec)
    points = sorted(zip(fig.data[0].x, fig.data[0].y, fig.data[0].text, strict=True))
    assert points == [(3, 1, "1 round"), (6, 1, "2 rounds")]
    chain = RunStats.of([replace(tree_round(i), tree=(), source="draft", new_tokens=[10, 11, 16])
                         for i in (1, 2, 3)])  # 9 tokens in 3 passes
    bars = figures.tree_vs_chain(spec, chain, 3).data[0]
    # deepest nodes 3, 3 and 2 (TREE[:3]): the tree drafted 8/3 deep a round, the chain its k=3
    assert spec.draft_depth == pytest.approx(8 / 3) and chain.draft_depth == 3.0
    alone = replace(tree_round(4), tree=(), k=0, draft_tokens=[], accepted=0, target_probs=[],
                    draft_probs=[], new_tokens=[16])  # a budget's last round, which drafts nothing
    assert RunStats.of([*events, alone]).draft_depth == pytest.approx(8 / 3)  # rounds that drafted
    assert list(bars.y) == [2.0, 3.0]
    assert list(bars.x) == ["token tree (depth 2.7 a round)", "chain (draft model, k=3)"]
    assert spec.predicted_tokens_per_pass is None
    k_fig = figures.k_prediction(spec, chain, 3)  # no i.i.d. curve for a tree run: two measured points
    assert [(d.x[0], d.y[0]) for d in k_fig.data] == [(pytest.approx(8 / 3), 2.0), (3, 3.0)]
    assert "2.7 deep a round" in k_fig.data[0].name and "3.0 deep" in k_fig.data[1].name
    assert k_fig.data[0].name.startswith("this tree run (k=3 caps its depth)")
    assert k_fig.layout.title.text == "Tokens per pass at k=3: measured"
    unknown = figures.k_prediction(spec, chain)  # a trace without settings.k: no cap is named
    assert unknown.layout.title.text == "Tokens per pass: measured"  # not the deepest walk's 3
    assert unknown.data[0].name == "this tree run: 2.7 deep a round on average"
    table = stats_html(spec, None, chain)
    assert "<th>chain (draft model, same\u00a0k)</th>" in table and "— (not for trees)" in table
    assert "<td>2.00</td><td></td><td>3.00</td>" in table  # tokens per pass: tree, -, chain
    assert "<td>15</td><td></td><td>9</td>" in table  # tokens verified: 6 + 6 + 3; the chain's 3 × 3
    assert f"<td>{3 / 15:.1%}</td><td></td><td>{3 / 9:.1%}</td>" in table
    assert "<td>2.7</td><td></td><td>3.0</td>" in table  # depth drafted a round: 8/3, the chain's k
    assert set(figures.all_figures(spec, None, chain, 3)) >= {"tree_nodes", "tree_chain"}


def test_a_character_split_over_two_tokens_shows_whole_on_the_node_that_completes_it(tmp_path):
    from conftest import make_tokenizer

    from specviz.service import token_text

    tok = make_tokenizer(tmp_path)
    e_hi, e_lo = tok.encode("é")  # byte-level: two tokens, neither a character on its own
    x, y = tok.encode("x")[0], tok.encode("y")[0]
    assert "\ufffd" in tok.decode([e_hi]) + tok.decode([e_lo])  # what one-token decoding showed
    # Root -> é's first byte (kept) -> its second byte (kept) -> "x" (refused); root -> "y" (unreached).
    tree = (TreeNode(-1, e_hi, 1, q=0.6, score=0.6, p=0.9, fate="accepted"),
            TreeNode(-1, y, 1, q=0.2, score=0.2, fate="unreached"),
            TreeNode(0, e_lo, 2, q=0.9, score=0.54, p=0.9, fate="accepted"),
            TreeNode(2, x, 3, q=0.5, score=0.27, p=0.1, fate="rejected"))
    check(tree)
    event = replace(tree_round(), tree=tree, k=3, draft_tokens=[e_hi, e_lo, x], accepted=2, token=y,
                    new_tokens=[e_hi, e_lo, y], target_probs=[0.9, 0.9, 0.1], draft_probs=[0.6, 0.9, 0.5])
    pieces_of = token_text(tok, vocab_size=len(tok))
    text = treeview.round_html(event, pieces_of)
    title = {i: t for i, (_, t) in Chips(text).nodes.items()}
    assert "\ufffd" not in text
    assert title[0].startswith("accepted: '' at depth 1")  # the first byte adds nothing yet
    assert title[2].startswith("accepted: 'é' at depth 2") and title[3].startswith("refused: 'x'")
    assert "Committed: <code>éy</code>" in text
    # A round whose context ended inside the character: its first node completes it.
    rounds = [replace(event, tree=(), k=0, draft_tokens=[], accepted=0, target_probs=[], draft_probs=[],
                      new_tokens=[e_hi], kind="bonus", token=e_hi),
              replace(event, round=2, tree=(replace(tree[2], parent=-1, depth=1),),
                      k=1, draft_tokens=[e_lo], accepted=1, new_tokens=[e_lo, y],
                      target_probs=[0.9], draft_probs=[0.9], token=y, kind="bonus")]
    round_text, overview = treeview.tree_views(rounds, pieces_of)
    assert "accepted: &#x27;é&#x27; at depth 1" in round_text and "\ufffd" not in round_text + overview
    assert "<code>éy</code>" in overview


def test_token_text_says_an_unreached_tree_node_has_no_p(pair):
    import specviz
    from specviz.render import REJECTED, all_spans

    ids = pair.encode("def f")
    events = list(specviz.generate(pair, ids, proposer="tree", k=4, nodes=12, max_new_tokens=40))
    spans = all_spans(events, pair.tokenizer, ids)
    walked = [(e, s) for e in events for s in spans if s.round == e.round and s.position]
    assert any(s.position > e.accepted + 1 for e, s in walked)  # some walked branch ran past a refusal
    for e, s in walked:
        if s.position <= e.accepted + 1:  # the kept path and the first refused child: p computed
            assert s.p == e.target_probs[s.position - 1] and "p(x)=" in s.tooltip
        else:
            assert s.fate == REJECTED and s.p is None and s.q == e.draft_probs[s.position - 1]
            assert "never tested" in s.tooltip and s.keep is None and "kept with" not in s.tooltip


def test_a_tree_round_that_drafted_nothing_shows_the_target_token_as_the_run_text_does():
    """Its kind is "bonus" (0 of 0 drafts kept), but the token is the target's alone: grey
    "target" in the Run text and the legend, so the tree panel and its bar say the same."""
    from specviz.render import TARGET, round_spans

    empty = replace(tree_round(2, tree=()), k=0, draft_tokens=[], accepted=0, target_probs=[],
                    draft_probs=[], kind="bonus", new_tokens=[16], token=16)

    class Tok:
        def decode(self, ids, **_):
            return "".join(TEXT.get(i, "?") for i in ids)

    assert [s.fate for s in round_spans(empty, Tok(), [10])] == [TARGET]
    panel = treeview.round_html(empty, pieces)
    assert 'class="tok target tree-node"' in panel and "bonus" not in panel
    row = treeview.overview_html([tree_round(1), empty], pieces).split("<tbody>")[1].split("</tr>")[1]
    assert row.count("tree-bar target") == 1 and "tree-bar bonus" not in row
    assert 'aria-label="nothing drafted, then the target&#x27;s token (target)"' in row


def test_a_tree_runs_rates_count_nodes_and_refused_candidates():
    """The hand tree: 6 nodes verified, "def" kept, its children "(" and ":" both refused. The
    acceptance rate is over the nodes (1/6, not 1 over the walked branch's 3), α over the tested
    candidates (1 / (1 + 2)), and depth 3 along the branch was never reached (no bar, not 0)."""
    stats = RunStats.of([tree_round(1)])
    assert stats.rejections == 2 and stats.alpha == pytest.approx(1 / 3)
    assert stats.acceptance_rate == pytest.approx(1 / 6) == stats.accepted_per_node
    assert stats.acceptance_by_position == [1.0, 0.0, None]
    table = stats_html(stats, None, chain=RunStats.of([]))
    assert "33.3%" in table and "16.7%" in table and "accepted / drafted" not in table


def test_a_round_whose_output_ended_inside_its_accepted_path_says_so():
    """EOS as the kept "def": the round commits it and nothing after, so the header must not say
    the target's token followed."""
    ended = replace(tree_round(), new_tokens=[10], stop="eos")
    assert "1 accepted, then the target's token (recovered)" in treeview.round_html(tree_round(), pieces)
    head = treeview.round_html(ended, pieces)
    assert "1 accepted, 1 of them committed: the output ended at EOS, before the target's token" in head
    assert "then the target's token" not in head
    assert "6 nodes verified in one target pass, depth 3;" in head  # the deepest node: XSS, at 3
    chips = Chips(head)  # "def" was committed, and no target token chip follows it
    assert "not committed" not in chips.nodes[0][1] and None not in chips.tags
    # "def" and "(" kept, the EOS at "def": "(" is accepted but not committed
    two = tuple(replace(n, fate="accepted") if i == 2 else n for i, n in enumerate(TREE))
    cut = Chips(treeview.round_html(replace(tree_round(tree=two, accepted=2), new_tokens=[10], stop="eos"),
                                    pieces))
    assert cut.nodes[2][1] == ("accepted (not committed: the run stopped before it): '(' at depth 2; "
                               "p=0.1000  q=0.5000  cumulative q=0.3000")
    assert "not committed" not in cut.nodes[0][1] and None not in cut.tags


def test_a_tree_rounds_timeline_row_counts_the_drafts_its_output_kept_not_those_past_its_eos():
    """The walk kept "def" and "(", but "def" was an EOS: the row says 1 of the 6 nodes kept (as
    α and the overview count it), then where the EOS fell and what the rule accepted."""
    from specviz.views import timeline_html

    two = tuple(replace(n, fate="accepted") if i == 2 else n for i, n in enumerate(TREE))
    eos = replace(tree_round(1, tree=two, accepted=2), new_tokens=[10], stop="eos")
    row = timeline_html([], RunStats.of([eos])).split("<tbody>")[1]
    assert "<td>1 of 6&#160;nodes, EOS at draft&#160;1 (the rule accepted&#160;2)</td>" in row
    assert "<td>1 of 6&#160;nodes</td>" in timeline_html([], RunStats.of([tree_round(1)]))


def test_the_overview_counts_nodes_a_tree_round_and_stops_counting_at_an_eos():
    """5 tree rounds of 6 nodes and a last round that verified none: 6.0 a tree round, 5.0 a
    target pass. A round whose EOS came after 1 of its accepted drafts: that one kept, none past."""
    plain = replace(tree_round(6), tree=(), k=0, draft_tokens=[], accepted=0, new_tokens=[16], stop="length",
                    target_probs=[], draft_probs=[], target_top2=[])
    text = treeview.overview_html([tree_round(i) for i in range(1, 6)] + [plain], pieces)
    assert "5 of 6 rounds verified a tree: 30 nodes (6.0 a tree round, 5.0 a target pass), 5 accepted" in text
    assert "<tr><td>6</td><td>\u2014</td><td>\u2014</td><td>0</td>" in text  # no tree: no nodes, no depth
    # the walked branch kept "def" and "(" (2 accepted), but "def" was an EOS: 1 kept, 1 token
    two = tuple(replace(n, fate="accepted") if i == 2 else n for i, n in enumerate(TREE))
    eos = replace(tree_round(2, tree=two, accepted=2), new_tokens=[10], stop="eos")
    stats = RunStats.of([tree_round(1), eos])
    assert (stats.accepted, stats.new_tokens) == (2, 3)  # by hand: 1 + 1
    assert stats.rejections == 2 + 0  # round 1's refused "(" and ":"; round 2's ":" lies past its EOS
    overview = treeview.overview_html(stats.events, pieces)
    assert "2 accepted (16.7% of the nodes), 1.50 tokens per target pass" in overview
    row = overview.split("<tbody>")[1].split("</tr>")[1]  # round 2: 1 kept, the walk's 2 past the EOS
    assert "<td>2</td><td>6</td><td>3</td><td>1</td>" in row and row.count("tree-bar accepted") == 1
    assert row.count("tree-bar refused") == 2  # the rest of depth 3 past the 1 kept
    assert 'aria-label="1 accepted, 2 more of depth 3 not kept"' in row  # no target's token: the EOS
    # both rounds verified 6 nodes and kept 1 (round 2's second accepted lies past its EOS): one
    # point of 2 rounds, and a mean of (1 + 1) / 2
    f = figures.tree_nodes(stats)
    assert (list(f.data[0].x), list(f.data[0].y), list(f.data[0].text)) == ([6], [1], ["2 rounds"])
    assert f.layout.shapes[0].y0 == 1.0 and f.data[1].name == "mean accepted 1.00"
    # a round that verified no tree (plain: the last, drafted nothing) is no point and no part of the mean
    f = figures.tree_nodes(RunStats.of([tree_round(1), eos, replace(plain, round=3)]))
    assert list(f.data[0].x) == [6] and f.layout.shapes[0].y0 == 1.0
    assert f.data[1].name == "mean accepted 1.00"
    line = next(s for s in figures.acceptance_by_position(stats).layout.shapes)
    assert line.y0 == pytest.approx(2 / 4)
    note = figures.acceptance_by_position(stats).data[1].name
    assert note == "per-candidate α = 50.0%"  # a depth tries its candidates in turn


def test_a_tree_run_that_verified_no_tree_shows_its_round_not_the_chain_note(pair):
    """max_new_tokens=1 leaves a tree run no room to draft: the panel said "Token trees appear when
    the drafter is 'token tree'" to a run of the token tree, and the overview gave 0 accepted as
    "0.0% of the nodes" of none. A round mid-run that drafted nothing was put down to the budget
    whatever its cause."""
    from dataclasses import replace

    import specviz
    from specviz import treeview
    from specviz.service import token_text

    events = list(specviz.generate(pair, "The quick brown fox", proposer="tree", k=4, max_new_tokens=1))
    assert [(e.k, e.tree, e.source) for e in events] == [(0, (), "tree")]
    round_view, overview = treeview.tree_views(events, token_text(pair.tokenizer))
    assert "Round 1 of 1</b> drafted nothing (only the target's token fitted the budget)" in round_view
    assert "Token trees appear" not in round_view and "0 nodes" in overview and "of the nodes" not in overview
    assert "0 nodes (no tree verified)" in overview and "a tree round" not in overview  # no "0.0" mean
    middle = replace(events[0], stop=None)  # a round that drafted nothing with tokens still to come
    shown = treeview.round_html(middle, token_text(pair.tokenizer))
    assert "drafted nothing (the draft cannot read a token of the context)" in shown
    ended = treeview.round_html(replace(events[0], stop="eos"), token_text(pair.tokenizer))  # the budget too
    assert "context, or only the target's token fitted the budget)" in ended


def test_a_tree_round_with_room_drafts_its_best_node_however_high_the_bar(pair, monkeypatch):
    """What the empty round's words rest on: with no node worth its verify cost (the bar at 10^9),
    every round with room still verifies one node; only the budget's last drafts nothing."""
    import specviz
    from specviz.treedraft import TreeProposer

    monkeypatch.setattr(TreeProposer, "bar", lambda self: 1e9)
    events = list(specviz.generate(pair, "The quick brown fox", proposer="tree", k=4, max_new_tokens=8))
    assert all(e.nodes == 1 for e in events[:-1]) and len(events) > 2
    assert events[-1].nodes <= 1 and (events[-1].nodes or events[-1].stop == "length")


def test_the_overviews_first_listed_round_reads_its_text_after_the_rounds_before_the_list():
    """201 rounds, the newest 200 listed: round 1 (not listed) commits a character's first byte,
    round 2 (the first listed) its second. Round 2 still reads after round 1: "é", not a broken
    character."""
    from specviz.detok import token_pieces

    def plain(n, token):
        return replace(tree_round(n), tree=(), k=0, draft_tokens=[], accepted=0, new_tokens=[token],
                       target_probs=[], draft_probs=[], target_top2=[])

    events = [plain(1, 0xC3), plain(2, 0xA9)] + [plain(n, ord("a")) for n in range(3, 202)]
    text = treeview.overview_html(events, lambda context, ids: token_pieces(Bytes(), context, ids))
    assert "The newest 200 rounds are listed." in text
    first = text.split("<tbody>")[1].split("</tr>")[0]
    assert first.startswith("<tr><td>2</td>") and "<code>\u00e9</code>" in first
