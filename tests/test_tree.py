"""Token trees: the mask, the gather, the rule, the sizing, and the engine's two promises."""

from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import hf_greedy
from scipy.stats import chisquare

import specviz
from specviz.lm import CachedLM
from specviz.sampling import SamplingParams, process
from specviz.tree import ACCEPTED, REJECTED, UNREACHED, TreeNode, ancestors, check, mask, walk
from specviz.treedraft import MAX_BRANCHING, TreeProposer
from specviz.verifycost import VerifyCost

PROMPTS = ["def fibonacci(n):\n    if n < 2:", "The quick brown fox", "for i in range(10):\n",
           "class Stack:\n    def push(self, x):"]


def tokens(events):
    return [t for e in events for t in e.new_tokens]


def node(parent, token, depth, q=0.5, score=0.5):
    return TreeNode(parent, token, depth, q, score)


# A hand-made tree: root -> 7 (0), 9 (1); 7 -> 3 (2), 4 (3); 3 -> 5 (4)
TREE = (node(-1, 7, 1), node(-1, 9, 1), node(0, 3, 2), node(0, 4, 2), node(2, 5, 3))


def test_mask_lets_each_node_see_the_context_its_ancestors_and_itself():
    parents = [n.parent for n in TREE]
    m = mask(parents, 0, 4, 4 + 5, torch.float32, tail=2)[0, 0] == 0  # [2 + 5, 9] visible
    assert m[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]  # tail rows are causal
    assert m[1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    for i in range(5):
        seen = {4 + j for j in ancestors(TREE, i)}
        assert m[2 + i].tolist() == [j < 4 or j in seen for j in range(9)], i
    # Nodes fed later see earlier slots as ancestors: feed slot 4 alone after slots 0..3.
    later = mask(parents, 4, 4, 16, torch.float32)[0, 0] == 0  # [1, 16]
    assert later[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 6, 8]


@pytest.mark.parametrize("which", ["pair", "gpt2_pair"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_tree_pass_gives_each_node_the_logits_of_its_own_path(which, cache, request):
    pair = request.getfixturevalue(which)
    ids = pair.encode(PROMPTS[0])
    lm = CachedLM(pair.target, pair.vocab_size, cache=cache, max_len=128)
    lm.forward(ids[:-3])  # a cached context, then a 3-token tail and the tree in one pass
    rows = lm.forward_tree(ids, [n.token for n in TREE], [n.parent for n in TREE])  # [1 + 5, vocab]
    fresh = CachedLM(pair.target, pair.vocab_size)
    assert torch.allclose(rows[0], fresh.forward(ids)[0], atol=1e-4)
    for i in range(len(TREE)):
        path = [TREE[j].token for j in ancestors(TREE, i)]
        expected = CachedLM(pair.target, pair.vocab_size).forward(ids + path)[0]
        assert torch.allclose(rows[1 + i], expected, atol=1e-4), i


def test_a_compiled_tree_pass_pads_to_a_fixed_shape_and_gives_the_unpadded_rows(compiled_pair):
    from specviz.lm import bucket

    pair = compiled_pair
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 9, 33, 64)] == [1, 2, 4, 4, 8, 16, 64, 64]
    ids = pair.encode(PROMPTS[0])
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", steps="compiled", max_len=128)
    eager = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=128)
    tokens, parents = [n.token for n in TREE], [n.parent for n in TREE]
    for m in (lm, eager):
        m.forward(ids[:-1])  # the round's shape: one uncached token, then the tree
    rows = lm.forward_tree(ids, tokens, parents)  # 1 + 5 nodes, padded to 1 + 8
    assert lm.compiled_passes == 1 and rows.shape[0] == 1 + len(TREE)
    assert len(lm.slots) == 8 and lm.cache_length == len(ids) + 8
    assert torch.allclose(rows, eager.forward_tree(ids, tokens, parents), atol=1e-5)
    # a frontier pass (nothing uncached, nodes after earlier slots) is padded alike: 2 -> 2
    more = lm.forward_tree(ids, [11, 12], [4, 2])
    assert lm.compiled_passes == 2 and torch.allclose(more, eager.forward_tree(ids, [11, 12], [4, 2]),
                                                      atol=1e-5)
    lm.keep([0, 2, 4, 8])  # 7 -> 3 -> 5 -> 11: the pads go with the other unkept slots
    assert lm.tokens == ids + [7, 3, 5, 11] and lm.cache_length == len(ids) + 4
    after = lm.forward(ids + [7, 3, 5, 11, 13])[0]
    assert torch.allclose(after, CachedLM(pair.target, pair.vocab_size).forward(ids + [7, 3, 5, 11, 13])[0],
                          atol=1e-4)
    # a long uncached tail (a round's first pass over the prompt) stays eager and unpadded
    fresh = CachedLM(pair.target, pair.vocab_size, cache="static", steps="compiled", max_len=128)
    fresh.forward_tree(ids, tokens, parents)
    assert fresh.compiled_passes == 0 and len(fresh.slots) == len(TREE)


def test_a_narrower_compiled_chain_pass_is_padded_to_a_captured_width_and_gives_plain_rows(compiled_pair):
    """A verify of fewer than k + 1 tokens (a short n-gram match, a budget-cut round) runs through
    the compiled (k + 1)-token step, pads after its tokens, and leaves the cache as a plain pass."""
    pair = compiled_pair
    ids = pair.encode(PROMPTS[0])
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", steps="compiled", max_len=len(ids) + 8)
    lm.compiled_widths = {1, 5}
    eager = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=len(ids) + 8)
    for m in (lm, eager):
        m.forward(ids[:-1])
    for drafts, passes in (([7, 3], 1), ([7, 3, 5, 11], 2), ([9], 3)):  # 3 -> 5, 5, 2 -> 5
        rows = lm.forward(ids + drafts, last=len(drafts) + 1)
        assert lm.compiled_passes == passes and rows.shape[0] == len(drafts) + 1
        assert lm.tokens == ids + drafts and lm.cache_length == len(ids) + len(drafts)
        assert torch.allclose(rows, eager.forward(ids + drafts, last=len(drafts) + 1), atol=1e-5)
        lm.rollback(ids)
    # wider than every captured width, or no room for the pads at the cache's end or the model's
    # positions (256 here; its cache holds more): unpadded, eager
    assert lm._chain_pad(6, 50) == 0 and lm._chain_pad(1, 50) == 0
    assert lm.max_len > 256 == pair.target.config.max_position_embeddings
    assert lm._chain_pad(2, 256 - 3) == 3 and lm._chain_pad(2, 256 - 2) == 0
    max_len, lm.max_len = lm.max_len, 100
    assert lm._chain_pad(2, 100 - 3) == 3 and lm._chain_pad(2, 100 - 2) == 0
    lm.max_len = max_len
    rows = lm.forward(ids + [7, 3, 5, 11, 13, 2], last=6)
    assert lm.compiled_passes == 3 and lm.cache_length == len(ids) + 6
    assert torch.allclose(rows, eager.forward(ids + [7, 3, 5, 11, 13, 2], last=6), atol=1e-5)
    assert not eager._chain_pad(2, 50)  # no compiled step, no pads


def test_a_padded_pass_that_wants_fewer_rows_than_it_feeds_reuses_its_widths_step(compiled_pair):
    """Round 1 over a short prompt feeds prompt + drafts and wants only the drafts' rows: padded
    to a captured width, it asks the step for every row, so it replays that width's graph (with
    `last` fixed per graph, asking for fewer rows compiled a graph per prompt length)."""
    pair = compiled_pair
    ids = pair.encode(PROMPTS[0])
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", steps="compiled", max_len=len(ids) + 8)
    lm.compiled_widths = {1, 5}
    eager = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=len(ids) + 8)
    asked, step = [], lm._step
    lm._step = lambda model, cache, input_ids, last, *a, **kw: asked.append((input_ids.shape[1], last)) \
        or step(model, cache, input_ids, last, *a, **kw)
    head = ids[:-3]
    for m in (lm, eager):
        m.forward(head)
    tail = ids[-3:]  # 3 tokens fed (pads to 5), 2 rows wanted
    rows = lm.forward(head + tail, last=2)
    assert asked == [(5, 5)] and lm.compiled_passes == 1 and rows.shape[0] == 2
    assert lm.tokens == ids and lm.cache_length == len(ids)
    assert torch.allclose(rows, eager.forward(head + tail, last=2), atol=1e-5)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_keeping_a_path_leaves_the_cache_a_plain_forward_would(pair, cache):
    ids = pair.encode(PROMPTS[1])
    lm = CachedLM(pair.target, pair.vocab_size, cache=cache, max_len=128)
    lm.forward_tree(ids, [n.token for n in TREE], [n.parent for n in TREE])
    lm.keep([0, 2, 4])  # 7 -> 3 -> 5
    assert lm.tokens == ids + [7, 3, 5] and lm.slots == []
    assert lm.cache_length == len(ids) + 3
    after = lm.forward(ids + [7, 3, 5, 11])[0]  # feeds only 11 on the gathered cache
    expected = CachedLM(pair.target, pair.vocab_size).forward(ids + [7, 3, 5, 11])[0]
    assert torch.allclose(after, expected, atol=1e-4)


def test_greedy_walk_follows_the_targets_argmax_down_the_tree():
    logits = torch.full((6, 12), -1.0)  # rows: root, then each node
    for row, best in [(0, 7), (1, 3), (3, 8), (5, 2)]:
        logits[row, best] = 1.0
    verdict = walk(TREE, logits, None, greedy=True)
    assert verdict.path == (0, 2) and verdict.token == 8 and verdict.kind == "recovered"
    # children are tried in turn until one is kept: 9 and 4, after the kept 7 and 3, never are
    assert [n.fate for n in verdict.nodes] == [ACCEPTED, UNREACHED, ACCEPTED, UNREACHED, REJECTED]
    assert [n.p for n in verdict.nodes] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert verdict.display_chain() == [0, 2, 4]  # the path, then the refused first child
    logits[3, 5], logits[3, 8] = 2.0, -1.0  # now 5 is the target's choice: a leaf, bonus
    verdict = walk(TREE, logits, None, greedy=True)
    assert verdict.path == (0, 2, 4) and verdict.token == 2 and verdict.kind == "bonus"
    assert verdict.nodes[3].fate == UNREACHED and verdict.nodes[1].fate == UNREACHED
    # the first child refused, the second kept: the refused one counts, the untried third not
    three = (node(-1, 1, 1), node(-1, 2, 1), node(-1, 3, 1))
    logits = torch.full((4, 5), -10.0)
    logits[0, 2], logits[1:, 0] = 5.0, 5.0
    assert [n.fate for n in walk(three, logits, None, greedy=True).nodes] == [REJECTED, ACCEPTED, UNREACHED]


def test_greedy_and_sampled_walks_give_one_hot_p_the_same_fates():
    """Greedy is the sampled rule on a one-hot p (the target's argmax): the same path, token and
    fate for every node, so α and the tree view mean the same in both."""
    gen = torch.Generator().manual_seed(0)
    reached, paths = set(), set()
    for trial in range(50):
        best = torch.randint(0, 12, (6,), generator=gen)  # the target's choice at each row
        logits = torch.randn(6, 12, generator=gen)
        logits[torch.arange(6), best] = 10.0
        one_hot = torch.nn.functional.one_hot(best, 12).float()  # [6, 12]
        shape = [(-1, 1), (-1, 1), (0, 2), (0, 2), (2, 3)]  # TREE's parents and depths
        coin = torch.rand(5, generator=gen) < 0.5  # half the nodes are the target's choice
        pick = torch.randint(0, 12, (5,), generator=gen)
        tree = tuple(node(parent, int(best[parent + 1] if coin[i] else pick[i]), depth)
                     for i, (parent, depth) in enumerate(shape))
        if len({(n.parent, n.token) for n in tree}) < len(tree):
            continue  # siblings must differ
        reached.update(n.fate for n in walk(tree, logits, None, greedy=True).nodes)
        greedy = walk(tree, logits, None, greedy=True)
        sampled = walk(tree, one_hot, torch.Generator().manual_seed(trial), greedy=False)
        assert (greedy.path, greedy.token, greedy.kind) == (sampled.path, sampled.token, sampled.kind)
        assert [n.fate for n in greedy.nodes] == [n.fate for n in sampled.nodes], trial
        paths.add(greedy.path)
    assert reached == {ACCEPTED, REJECTED, UNREACHED} and len(paths) >= 4  # the trials vary


def test_sampled_walk_marks_tried_refused_and_untried_children():
    p = torch.zeros(6, 12)
    p[0, 9] = 1.0  # the root's first child (7) has p = 0: refused for sure; 9 then has all the mass
    p[2, 6] = 1.0
    verdict = walk(TREE, p, torch.Generator().manual_seed(0), greedy=False)
    assert verdict.path == (1,) and verdict.token == 6 and verdict.kind == "bonus"
    assert [n.fate for n in verdict.nodes] == [REJECTED, ACCEPTED, UNREACHED, UNREACHED, UNREACHED]
    assert [n.p for n in verdict.nodes][:2] == [0.0, 1.0]


def test_refusing_every_child_draws_from_p_without_them():
    # 2000 walks at the root of children 7 and 9, p = 0.25 each; the rest, 0.5 on 1 and 0.0 on 2.
    # Output: 7 w.p. 0.25, 9 w.p. 0.75 * (0.25 / 0.75) = 0.25, 1 w.p. 0.5. Chi-square p > 0.001.
    tree = (node(-1, 7, 1), node(-1, 9, 1))
    p = torch.zeros(3, 12)
    p[0, [7, 9, 1]] = torch.tensor([0.25, 0.25, 0.5])
    p[1:, 0] = 1.0  # after an accepted child (a leaf): the bonus token
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(12)
    for _ in range(2000):
        v = walk(tree, p, gen, greedy=False)
        counts[v.path and tree[v.path[0]].token or v.token] += 1
    assert counts[[7, 9, 1]].sum() == 2000
    stat = chisquare(counts[[7, 9, 1]].numpy(), [500, 500, 1000])
    assert stat.pvalue > 0.001, stat


def test_a_sampled_walk_commits_two_levels_with_the_targets_joint_distribution():
    # Depth 2: root -> 7 (0), 9 (1); 7 -> 3 (2), 4 (3); 9 -> 3 (4). Each row is the target's p
    # after that node: the walk's first two tokens must follow p0(t1) * p_t1(t2) (a tree child
    # t1), or p0(t1) alone (the target's own t1 ends the walk). 4000 walks, 6 cells, the least
    # likely expecting 120: chi-square p > 0.001. A second level tried against the root's row,
    # or starting with the mass its parent's refusals left, fails.
    tree = (node(-1, 7, 1), node(-1, 9, 1), node(0, 3, 2), node(0, 4, 2), node(1, 3, 2))
    p = torch.zeros(6, 12)
    p[0, [7, 9, 1]] = torch.tensor([0.3, 0.2, 0.5])
    p[1, [3, 4, 5]] = torch.tensor([0.4, 0.1, 0.5])  # after 7
    p[2, [3, 6]] = torch.tensor([0.5, 0.5])  # after 9
    p[3:, 0] = 1.0  # after a leaf: the bonus token
    want = {(7, 3): 0.12, (7, 4): 0.03, (7, 5): 0.15, (9, 3): 0.1, (9, 6): 0.1, (1,): 0.5}
    gen = torch.Generator().manual_seed(2)
    counts = Counter()
    for _ in range(4000):
        v = walk(tree, p, gen, greedy=False)
        committed = [tree[i].token for i in v.path] + [v.token]
        counts[tuple(committed[:2])] += 1
        assert v.kind == ("bonus" if len(v.path) == 2 else "recovered")
    assert set(counts) == set(want)
    stat = chisquare([counts[c] for c in want], [want[c] * 4000 for c in want])
    assert stat.pvalue > 0.001, stat


def test_children_covering_all_of_p_leave_no_rounding_remainder(monkeypatch):
    # float32 p whose float32 total rounds to 1 although its entries sum to 1 - 2^-26: after
    # child 0 is refused (u = 1), what is left is exactly child 1's mass, so r(child 1) = 1 and it
    # is kept; had the remainder come from the float32 total, r(child 1) would be 0.75, and
    # refusing it would leave a draw from nothing (multinomial raised).
    tree = (node(-1, 0, 1), node(-1, 1, 1))
    p = torch.zeros(3, 4)
    p[0, :2] = torch.tensor([1 - 2**-24, 3 * 2**-26])
    p[1:, 3] = 1.0  # after a kept leaf: the bonus token 3
    rand = torch.rand

    def tries(*u):  # the walk's uniforms, one per node
        monkeypatch.setattr(torch, "rand", lambda n, **kw: torch.tensor(u) if n == len(u) else rand(n, **kw))

    tries(1.0, 0.9)
    v = walk(tree, p, torch.Generator().manual_seed(0), greedy=False)
    assert v.path == (1,) and v.token == 3 and v.kind == "bonus"
    # refusing both (u = 1 for child 1 too) draws from p again rather than from no mass at all
    tries(1.0, 1.0)
    v = walk(tree, p, torch.Generator().manual_seed(0), greedy=False)
    assert v.path == () and v.token in (0, 1) and v.kind == "recovered"


def test_verify_cost_fits_a_line_and_falls_back_to_the_prior():
    cost = VerifyCost(prior_slope=0.04)
    assert cost.fit() is None and cost.slope() == 0.04
    cost.observe(4, 0.30)
    assert cost.fit() == pytest.approx((0.30 / 1.16, 0.04 * 0.30 / 1.16))  # one size: the prior
    cost.observe(5, 0.28)  # two rounds a node apart: still the prior, not a line through noise
    assert cost.slope() == 0.04
    cost.drafted.clear()
    for n in (1, 9, 4, 1, 9):  # two rounds above the span's middle (5): still the prior
        cost.observe(n, 0.2 + 0.05 * n)
    assert cost.slope() == 0.04 and not cost.measured
    cost.observe(8, 0.2 + 0.05 * 8)  # three at each end: the line
    assert cost.fit() == pytest.approx((0.2, 0.05)) and cost.slope() == pytest.approx(0.25)
    # a drafter that learnt to draft one or two tokens: the window loses its spread, and the
    # fitted slope holds (not the prior), a = mean t / (1 + 0.25 * mean n) = 0.275 / 1.375
    for i in range(40):
        cost.observe(1 + i % 2, 0.2 + 0.05 * (1 + i % 2))
    assert {n for n, _ in cost.drafted} == {1, 2} and cost.measured
    assert cost.fit() == pytest.approx((0.2, 0.05)) and cost.slope() == pytest.approx(0.25)


def test_verify_cost_fits_the_step_to_a_drafted_pass_apart_from_each_drafted_token():
    """float32 on oneDNN here: a one-token pass 365 ms, any wider one 620 ms + 20 ms a drafted
    token. The drafted rounds' own line gives b = 20 ms and a + s = 620 ms; the target alone's
    rounds give a = 365 ms."""
    cost = VerifyCost()
    for n in (0, 4, 8, 0, 4, 8, 0, 4, 8):
        cost.observe(n, 0.365 if n == 0 else 0.62 + 0.02 * n)
    assert cost.pieced and cost.slope() == pytest.approx(0.02 / 0.365)
    assert cost.step == pytest.approx((0.62 - 0.365) / 0.365)
    assert cost.fit() == pytest.approx((0.365, 0.02))
    # the target alone's 64 rounds fill its window, and leave the drafted rounds' line alone
    for _ in range(64):
        cost.observe(0, 0.365)
    assert len(cost.alone) == cost.WINDOW and len(cost.drafted) == 6
    assert cost.slope() == pytest.approx(0.02 / 0.365) and cost.fit() == pytest.approx((0.365, 0.02))


def test_a_line_through_the_target_alone_and_one_chain_size_holds_until_drafts_spread():
    """Rounds at n = 0 and n = 4 alone cannot tell the step from the slope: a straight line,
    priced (s + 4 b) / 4 a token, stands in (step 0) and is not `pieced`. Drafted rounds that
    then spread replace it with the two pieces; once pieced, rounds of one size re-estimate the
    step under the held slope."""
    cost = VerifyCost()
    for n in (0, 4) * 4:
        cost.observe(n, 0.365 if n == 0 else 0.62 + 0.02 * n)
    assert cost.measured and not cost.pieced and cost.step == 0.0
    assert cost.slope() == pytest.approx((0.70 - 0.365) / 4 / 0.365)
    for n in (8, 8, 8):  # four rounds at 4 and three at 8: the drafted rounds span 4 sizes
        cost.observe(n, 0.62 + 0.02 * n)
    assert cost.pieced and cost.slope() == pytest.approx(0.02 / 0.365)
    assert cost.step == pytest.approx(0.255 / 0.365)
    # a chain at k = 6 only, on a machine whose step grew to 0.3 s: its mean excess over
    # a + b n, with a from the alone rounds and the held slope
    cost.drafted.clear()
    for _ in range(5):
        cost.observe(6, 0.365 + 0.3 + 0.02 * 6)
    assert cost.slope() == pytest.approx(0.02 / 0.365) and cost.step == pytest.approx(0.3 / 0.365)
    # no alone rounds and drafted rounds that spread: a from their intercept and the held step
    bare = VerifyCost()
    bare.step = 0.5
    for n in (2, 6) * 3:
        bare.observe(n, 0.6 + 0.02 * n)
    assert bare.pieced and bare.fit() == pytest.approx((0.4, 0.02)) and bare.step == 0.5
    # one-token rounds that measured no time say nothing about the step
    for _ in range(3):
        bare.observe(0, 0.0)
    assert bare.step == 0.5 and bare.slope() == pytest.approx(0.05)


def test_an_unmeasured_verify_cost_alternates_two_small_sizes_then_lifts_the_cap(pair):
    cost = VerifyCost()
    proposer = TreeProposer(pair.draft, pair.vocab_size, cost=cost)
    caps = []
    for n in (4, 8, 4, 8, 4, 8):  # a = 0.3 s a pass, b = 0.15 s a node
        caps.append(proposer.cap(4))
        cost.observe(n, 0.3 + 0.15 * n)
    assert caps == [4, 8, 4, 8, 4, 8] and cost.measured and proposer.cap(4) == 64
    assert cost.slope() == pytest.approx(0.5)
    assert TreeProposer(pair.draft, pair.vocab_size, nodes=10, cost=VerifyCost()).cap(4) == 10
    assert VerifyCost.of(pair.target) is VerifyCost.of(pair.target)  # kept across runs


def test_the_tree_explores_sizes_after_a_chain_and_the_target_alone_fitted_a_straight_line(pair):
    """A chain's full window of k = 4 rounds and a baseline's measure a line, not the two
    pieces: the tree still alternates 4 and 8 nodes, at the prior's bar, until its own rounds
    span, then lifts the cap and prices a node at the drafted rounds' slope."""
    cost = VerifyCost()
    for _ in range(cost.WINDOW):
        cost.observe(4, 0.70)
        cost.observe(0, 0.365)
    assert cost.measured and not cost.pieced and len(cost.drafted) == cost.WINDOW
    proposer = TreeProposer(pair.draft, pair.vocab_size, cost=cost)
    assert proposer.bar() == pytest.approx(0.04)  # the prior's, not the line's 0.23
    caps = []
    for _ in range(3):
        for _ in range(2):
            caps.append(proposer.cap(4))
            cost.observe(caps[-1], 0.62 + 0.02 * caps[-1])
    assert caps == [4, 8] * 3 and cost.pieced and proposer.cap(4) == 64
    assert proposer.bar() == pytest.approx(cost.slope())  # R = 1 until a round of this run
    # 29 rounds at 4 nodes (0.70 s) and 3 at 8 (0.78 s): b = 20 ms, a + s = 0.62 s, a = 0.365 s
    assert cost.slope() == pytest.approx(0.02 / 0.365) and cost.step == pytest.approx(0.255 / 0.365)


def test_the_node_bar_is_the_runs_rate_times_the_verify_slope(pair):
    cost = VerifyCost()
    proposer = TreeProposer(pair.draft, pair.vocab_size, cost=cost)
    assert proposer.bar() == pytest.approx(0.04)  # nothing measured: R = 1 (the target alone), prior
    for n in (4, 8, 4, 8, 4, 8):  # a = 0.3 s a pass, b = 0.15 s a node: slope 0.5
        cost.observe(n, 0.3 + 0.15 * n)
    assert proposer.bar() == pytest.approx(0.5)  # still no round of this run: R = 1
    proposer.tokens, proposer.seconds = 6, 0.9  # 6 tokens in 3 one-token passes' time: R = 2
    assert proposer.bar() == pytest.approx(1.0)


def test_the_tree_sizes_by_the_engines_measured_verify_times_not_its_callers(pair):
    import time

    cost = VerifyCost()
    drafter = TreeProposer(pair.draft, pair.vocab_size, cost=cost)
    events = []
    for e in specviz.generate(pair, PROMPTS[0], proposer=drafter, k=3, max_new_tokens=20):
        events.append(e)
        time.sleep(0.05)  # a caller drawing the page between rounds: no part of a verify pass
    trees = [e for e in events[1:] if e.tree]
    assert trees and list(cost.drafted) == [(e.nodes, e.target_seconds) for e in trees][-cost.WINDOW:]
    assert drafter.tokens == sum(len(e.new_tokens) for e in trees)
    assert drafter.seconds == pytest.approx(sum(e.draft_seconds + e.target_seconds for e in trees))


def test_a_round_that_captured_a_shape_is_no_sample_of_the_trees_rate(compiled_pair, monkeypatch):
    """On a GPU a pass of a shape new to a model compiles or captures it (0.1-0.5 s against a few
    ms): summed into R's seconds it would lower the node bar for the rest of the run. A real
    compiled draft marks its capturing drafts; their rounds, and those whose verify pass captured
    (the engine pauses the line), add neither tokens nor seconds."""
    from specviz import fastpath
    from specviz.engine import RoundEvent, make_proposer

    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())  # fresh slots: every shape is new
    drafter = make_proposer(compiled_pair, "tree", nodes=4, branching=2, max_len=64)
    uses, marks, trees = drafter.lm.first_uses, [], []
    for e in specviz.generate(compiled_pair, "def add(a, b):", proposer=drafter, k=2, max_new_tokens=12):
        marks.append((drafter.captured, drafter.lm.first_uses > uses))
        uses, trees = drafter.lm.first_uses, trees + [e.tree]
    assert all(captured == grew for captured, grew in marks)
    assert marks[0] == (True, True) and (False, False) in marks
    node = replace(next(t for t in trees if t)[0], fate=ACCEPTED)
    drafter.cost, drafter.tokens, drafter.seconds = (cost := VerifyCost()), 0, 0.0

    def observe(n):
        drafter.observe_round(RoundEvent(n, 1, [node.token], 1, 5, "bonus", [node.token, 5], [1.0], [1.0],
                                         n, n, 0.01, 0.02, 0.03, 0.0, 0, "tree", 0, None, tree=(node,)))

    drafter.captured = False

    observe(2)
    assert (drafter.tokens, drafter.seconds) == (2, pytest.approx(0.03))
    drafter.captured = True
    observe(3)
    drafter.captured = False
    with cost.unobserved():
        observe(4)
    assert (drafter.tokens, drafter.seconds) == (2, pytest.approx(0.03))
    assert len(cost.drafted) == 2  # the draft's capture: the target's pass still a sample of its line
    observe(5)
    assert (drafter.tokens, drafter.seconds) == (4, pytest.approx(0.06))


def test_node_budget_keeps_the_best_scores_with_their_parents(pair):
    proposer = TreeProposer(pair.draft, pair.vocab_size, nodes=3)
    drafted = [node(-1, 1, 1, score=0.5), node(-1, 2, 1, score=0.3), node(0, 3, 2, score=0.45),
               node(2, 4, 3, score=0.05), node(1, 5, 2, score=0.29)]
    assert proposer._choose(drafted, bar=0.0) == [0, 1, 2]
    sized = TreeProposer(pair.draft, pair.vocab_size)  # unset budget: the calibrated score pays
    assert sized._choose(drafted, bar=0.295) == [0, 1, 2]
    assert sized._choose(drafted, bar=0.4) == [0, 2]
    assert sized._choose(drafted, bar=0.9) == [0]  # at least the best node


def test_an_unset_width_widens_while_the_tree_keeps_a_last_child_and_narrows_back(pair):
    from specviz.treedraft import BRANCHING, MAX_BRANCHING

    drafter = TreeProposer(pair.draft, pair.vocab_size)
    assert (drafter.branching, drafter.auto_width) == (BRANCHING, True) == (3, True)
    # root -> 0, 1, 2 (ranks 0, 1, 2); 0 -> 3, 4, 5 (ranks 0, 1, 2)
    drafted = [node(-1, 10 + i, 1, score=0.3 - 0.1 * i) for i in range(3)] + \
              [node(0, 20 + i, 2, score=0.1 - 0.01 * i) for i in range(3)]
    drafter.widen(drafted, [0, 1, 3])  # widest kept rank 1 < 2: width 3 stays (never below 3)
    assert drafter.branching == 3
    drafter.widen(drafted, [0, 3])  # none of the last two kept, but 3 is the narrowest
    assert drafter.branching == 3
    drafter.widen(drafted, [0, 3, 4, 5])  # node 5 is the last of the 3 children offered
    assert drafter.branching == 4
    drafter.widen(drafted, [0, 1, 2])  # at width 4 a kept rank 2 is not a last child: stays
    assert drafter.branching == 4
    drafter.widen(drafted, [0, 1, 3])  # none of the last two (ranks 2, 3) kept: one fewer
    assert drafter.branching == 3
    drafter.branching = MAX_BRANCHING
    wide = [node(-1, 30 + i, 1, score=0.1) for i in range(MAX_BRANCHING)]
    drafter.widen(wide, list(range(MAX_BRANCHING)))  # a last child at the widest: stays at 8
    assert drafter.branching == MAX_BRANCHING
    fixed = TreeProposer(pair.draft, pair.vocab_size, branching=3)
    fixed.widen(drafted, [0, 3, 4, 5])
    assert (fixed.branching, fixed.auto_width) == (3, False)


def tree_shapes(events) -> tuple[list[int], list[int]]:
    """Each tree round's node count and its widest family (the most children of one parent)."""
    trees = [e.tree for e in events if e.tree]
    return [len(t) for t in trees], [max(Counter(n.parent for n in t).values()) for t in trees]


def test_an_unset_width_lets_a_tree_fill_a_budget_three_children_cannot(pair):
    """At width 3 a depth-4 tree holds at most 3 + 9 + 9 + 9 = 30 nodes; a budget of 64 with the
    width unset widens until the tree fills it (where verification is nearly free the sized tree
    asks for that many), and a fixed width of 3 never passes 30."""
    def shapes(branching):
        return tree_shapes(specviz.generate(pair, PROMPTS[0], proposer="tree", k=4, nodes=64,
                                            branching=branching, max_new_tokens=40))

    sizes, children = shapes(None)
    assert sizes[0] == 30 and max(sizes) == 64 and max(children) > 3, (sizes, children)
    sizes, children = shapes(3)
    assert max(sizes) == 30 and max(children) == 3


def test_where_verification_is_free_the_default_tree_grows_to_its_cap_and_stays_exact(pair):
    """The default tree (no nodes, no branching) on a target whose verify line is flat: every node
    pays (bar 0), so the tree widens past 3 children and fills the 64-node cap, as on a GPU where
    a pass over dozens of tokens costs one pass; its greedy output is still the target's own."""
    from specviz.treedraft import MAX_NODES

    cost = VerifyCost()
    for n in (4, 8) * 3:  # drafted rounds at two sizes, each as costly as the other: slope 0
        cost.observe(n, 0.3)
    cost.observe = lambda nodes, seconds: None  # held flat: this CPU's own times are not
    drafter = TreeProposer(pair.draft, pair.vocab_size, cost=cost)
    assert cost.pieced and drafter.bar() == 0.0
    pair.target.generation_config.eos_token_id = None
    try:
        expected = hf_greedy(pair, PROMPTS[0], 40)
        events = list(specviz.generate(pair, PROMPTS[0], proposer=drafter, k=4, max_new_tokens=40))
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id
    assert tokens(events) == expected
    sizes, widths = tree_shapes(events)
    assert sizes[0] == 30 and max(sizes) == MAX_NODES and max(widths) > 3, (sizes, widths)


@pytest.mark.parametrize("which", ["pair", "gpt2_pair", "static_pair", "compiled_pair"])
def test_greedy_tree_output_is_the_targets_own(which, request):
    pair = request.getfixturevalue(which)
    pair.target.generation_config.eos_token_id = None  # run the full budget in both
    try:
        for prompt in PROMPTS:
            ids = pair.encode(prompt)
            expected = pair.target.generate(torch.tensor([ids]), max_new_tokens=30, do_sample=False,
                                            min_new_tokens=30)[0, len(ids):].tolist()
            for k, nodes, branching in [(1, None, None), (2, 4, 2), (4, None, 3), (4, 64, 4),
                                        (4, 64, None), (6, 12, 1), (3, 1, 8)]:
                events = list(specviz.generate(pair, prompt, proposer="tree", k=k, nodes=nodes,
                                               branching=branching, max_new_tokens=30))
                assert tokens(events) == expected, (prompt, k, nodes, branching)
                assert all(len(e.tree) <= (nodes or 64) for e in events)
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id


def token_path(drafted: list[TreeNode], i: int) -> list[int]:
    """The tokens from the root down to drafted node i."""
    return [drafted[j].token for j in ancestors(drafted, i)]


def assert_plain_forward_cache(lm: CachedLM) -> None:
    """Every layer's keys and values in lm's cache are what one plain causal pass over its
    committed tokens computes: no node of another branch (a cousin) was kept in their place."""
    n = lm.cache_length
    with torch.no_grad():
        plain = lm.model(torch.tensor([lm.tokens]), use_cache=True).past_key_values
    for mine, theirs in zip(lm.cache.layers, plain.layers, strict=True):
        for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
            assert torch.allclose(a[:, :, :n], b, atol=1e-4)


@pytest.mark.parametrize("which", ["pair", "static_pair", "compiled_pair"])
@pytest.mark.parametrize("prompt, nodes, branching, temperature", [
    (PROMPTS[0], 10, None, 1.0),
    (PROMPTS[1], 64, 8, 0.0),  # wide: a walked node has a cousin of its token drafted before it
])
def test_both_caches_hold_exactly_the_committed_path_every_round(which, prompt, nodes, branching,
                                                                   temperature, request, monkeypatch):
    pair = request.getfixturevalue(which)
    ids = pair.encode(prompt)
    drafter = specviz.engine.make_proposer(pair, "tree", max_len=256, nodes=nodes, branching=branching)
    from specviz.engine import _rounds

    made = []  # the target's CachedLM, to count its compiled passes
    monkeypatch.setattr(specviz.engine, "CachedLM",
                        lambda *a, **kw: made.append(CachedLM(*a, **kw)) or made[-1])
    events = _rounds(pair, drafter, ids, 4, 25, SamplingParams(temperature), 3, 256)
    done, cousins = [], 0
    for e in events:
        done += e.new_tokens
        assert e.target_cache_length == len(ids) + len(done) - 1
        check(e.tree)
        assert [e.tree[i].token for i in range(len(e.tree)) if e.tree[i].fate == ACCEPTED] \
            == e.draft_tokens[: e.accepted] == e.new_tokens[: e.accepted]
        lm = drafter.lm  # before learning: the context it drafted from, then its fed nodes
        assert lm.tokens == (ids + done)[: len(lm.tokens)]
        assert lm.cache_length == len(lm.tokens) + len(lm.slots)
        before, drafted, slot_of, _ = drafter.last or (lm.tokens, [], {}, [])
        widest = max(Counter(drafted[i].depth for i in slot_of).values(), default=0)
        # a set width expands that many nodes a depth at most; unset, the width it widens to
        assert widest <= (branching or MAX_BRANCHING)
        grown = (ids + done)[len(before):]
        way = [i for i in slot_of if token_path(drafted, i) == grown[: drafted[i].depth]]  # fed, walked
        fed = max((drafted[i].depth for i in way), default=0)  # the draft keeps all of them
        cousins += sum(any(n.token == drafted[i].token and n.depth == drafted[i].depth for n in drafted[:i])
                       for i in way)  # an earlier node of its token and depth, on another branch
        drafter._learn(ids + done)  # what its next propose does first (then a no-op there)
        assert lm.slots == [] and lm.tokens == (ids + done)[: len(before) + fed]
        assert lm.cache_length == len(lm.tokens)
        assert_plain_forward_cache(lm)
    if branching is not None:  # the wide run walks past a cousin, so the check bites
        assert cousins
    if which == "compiled_pair":  # every round after the first: padded, through the compiled steps
        assert made[0].compiled_passes == made[0].passes - 1 == e.round - 1
        assert drafter.lm.compiled_passes > 0


def exact_three_token_distribution(pair, ids, params):
    """P(t1, t2, t3) of the target alone under params (top-k support): {(t1, t2, t3): prob}."""
    out = {(): 1.0}
    with torch.no_grad():
        for _ in range(3):
            prefixes = list(out)
            batch = torch.tensor([ids + list(x) for x in prefixes])
            probs = process(pair.target(batch).logits[:, -1, : pair.vocab_size], params)
            out = {x + (t,): out[x] * float(probs[r, t]) for r, x in enumerate(prefixes)
                   for t in probs[r].nonzero().flatten().tolist()}
    return out


def three_token_chi_square(pair, params, runs, **generate):
    """Chi-square of `runs` seeded 3-token outputs of specviz.generate against the target alone's
    exact joint distribution under params (top-k support: at most 27 outcomes)."""
    prompt = "The dog. The dog"
    joint = exact_three_token_distribution(pair, pair.encode(prompt), params)
    if params.top_p < 1:  # the nucleus must cut somewhere, or it is not tested
        assert len(joint) < len(exact_three_token_distribution(pair, pair.encode(prompt),
                                                               replace(params, top_p=1.0)))
    cells = sorted(joint)
    counts = dict.fromkeys(cells, 0)
    for seed in range(runs):
        out = tokens(specviz.generate(pair, prompt, max_new_tokens=3, temperature=params.temperature,
                                      top_k=params.top_k, top_p=params.top_p, seed=seed, **generate))
        counts[tuple(out)] += 1
    assert sum(counts.values()) == runs
    total = sum(joint.values())
    return chisquare([counts[c] for c in cells], [joint[c] / total * runs for c in cells])


@pytest.mark.parametrize("which, temperature, top_p", [
    ("pair", 1.0, 1.0), ("static_pair", 1.0, 1.0),
    ("pair", 0.7, 0.8),  # the temperature and the nucleus reach p in the tree's verify too
])
def test_sampled_tree_runs_follow_the_targets_distribution(which, temperature, top_p, request):
    # 1600 runs of 3 tokens, top_k=3 (27 outcomes), depth 2, 6 nodes, branching 2: chi-square
    # p > 0.001. The wrong tree rule is shown to fail in tests/test_lab.py.
    stat = three_token_chi_square(request.getfixturevalue(which), SamplingParams(temperature, 3, top_p),
                                  1600, proposer="tree", k=2, nodes=6, branching=2)
    assert stat.pvalue > 0.001, stat


def test_sampled_tree_runs_with_an_adapting_width_follow_the_targets_distribution(pair, monkeypatch):
    """The width unset: a round's width comes from the rounds before it. top_k=4 (64 outcomes),
    so a widened round offers a fourth child; depth 2, 6 nodes; 2400 runs of 3 tokens (the least
    likely outcome expects 11.6): chi-square p > 0.001. Second rounds must have drafted at width 4."""
    widths = []  # the width each round drafted at
    widen = TreeProposer.widen

    def recorded(self, drafted, chosen):
        widths.append(self.branching)
        widen(self, drafted, chosen)

    monkeypatch.setattr(TreeProposer, "widen", recorded)
    stat = three_token_chi_square(pair, SamplingParams(1.0, 4, 1.0), 2400, proposer="tree", k=2, nodes=6)
    assert stat.pvalue > 0.001, stat
    assert set(widths) == {3, 4}, sorted(set(widths))  # round 1 at 3; a round 2 at 4


@pytest.mark.parametrize("kwargs, match", [
    ({"nodes": 0}, "tree nodes"), ({"nodes": 65}, "tree nodes"), ({"branching": 0}, "branching"),
    ({"branching": 9}, "branching"), ({"nodes": 2.5}, "tree nodes"),
])
def test_bad_tree_settings_are_clear_value_errors(pair, kwargs, match):
    with pytest.raises(ValueError, match=match):
        list(specviz.generate(pair, PROMPTS[0], proposer="tree", **kwargs))


@pytest.mark.parametrize("proposer", ["draft", "ngram", "hybrid", "none", "tree-object"])
def test_a_tree_shape_given_to_another_drafter_is_refused_not_ignored(pair, proposer):
    if proposer == "tree-object":  # an object carries its own shape: nodes= went unread
        proposer = specviz.engine.make_proposer(pair, "tree", nodes=8)
    for shape in ({"nodes": 16}, {"branching": 2}):
        with pytest.raises(ValueError, match="nodes and branching shape the token tree"):
            specviz.generate(pair, PROMPTS[0], proposer=proposer, **shape)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_round_reads_the_device_back_once_a_depth_and_twice_more(pair, temperature):
    from conftest import read_backs_per_round

    # the drafter reads each depth's top candidates once (it picks the frontier on the host),
    # the rule reads once (greedy) or twice (sampled: the tries, then the target's token),
    # the target's top-2 once
    for depth in (2, 5):
        counts = read_backs_per_round(specviz.generate(pair, PROMPTS[0], proposer="tree", k=depth,
                                                       nodes=12, max_new_tokens=24,
                                                       temperature=temperature))
        assert counts and max(counts) <= depth + 2 + (temperature > 0), (depth, counts)


@pytest.mark.parametrize("top_k", [1, 2])
def test_a_tree_drafts_no_child_the_drafts_distribution_rules_out(pair, top_k):
    """Under top-k the draft's q is zero past its k best: such a child can never be kept, and
    drafting it spends the node budget on it (a mutation that drafted them filled every tree with
    zero-q nodes, 214 of 332, and no other test saw it)."""
    events = list(specviz.generate(pair, "The quick brown fox", proposer="tree", k=3, nodes=20, branching=3,
                                   top_k=top_k, temperature=1.0, max_new_tokens=24, seed=0))
    nodes = [n for e in events for n in e.tree]
    assert nodes and all(n.q > 0 for n in nodes)  # (top-k keeps ties at its k-th value: no count)


def test_a_nodes_score_is_the_float32_product_of_its_path():
    import numpy as np

    from specviz.treedraft import float32_product

    assert float32_product(0.1, 0.3) == float(np.float32(0.1) * np.float32(0.3)) != 0.1 * 0.3
    assert float32_product(1.0, 0.25) == 0.25


def test_the_calibrated_score_is_a_probability_however_far_the_run_outdid_its_scores(pair):
    proposer = TreeProposer(pair.draft, pair.vocab_size)
    proposer.kept, proposer.predicted = 8.0, 2.0  # nodes kept 4 times as often as scored
    assert proposer.calibrated(0.1) == pytest.approx(0.4) and proposer.calibrated(0.5) == 1.0
    drafted = [node(-1, 1, 1, score=0.5), node(-1, 2, 1, score=0.4), node(0, 3, 2, score=0.3)]
    # a bar above 1 (a steep verify line at a fast rate): no node pays but the best
    assert proposer._choose(drafted, bar=1.5) == [0]
    fresh = TreeProposer(pair.draft, pair.vocab_size)  # c = 1: a node pays only above the bar
    assert fresh.calibrated(0.3) == 0.3 and fresh._choose(drafted, bar=0.3) == [0, 1]


class RecordingCache:
    """A draft cache that records which fed tree slots the drafter kept, and when it dropped them."""

    def __init__(self):
        self.kept, self.dropped = [], 0

    def keep(self, slots):
        self.kept.append(slots)

    def drop_slots(self):
        self.dropped += 1


def test_the_tree_learns_from_the_committed_path_through_all_it_drafted(pair):
    """The committed ids 7, 3, 5 walk root -> 7 (0) -> 3 (2, not the root's own 3) -> 5 (4); the
    draft's cache keeps the slots of the fed nodes on that way (0, 2; leaf 4 was never fed). From
    the second outcome on, calibration counts the kept nodes the tree verified (2: node 4 was not
    chosen) against the chosen nodes' summed scores (not their q)."""
    drafter = TreeProposer(pair.draft, pair.vocab_size)
    drafter.lm = cache = RecordingCache()
    drafted = [TreeNode(-1, 7, 1, 0.6, 0.6), TreeNode(-1, 3, 1, 0.3, 0.3), TreeNode(0, 3, 2, 0.5, 0.3),
               TreeNode(0, 4, 2, 0.4, 0.24), TreeNode(2, 5, 3, 0.9, 0.27)]
    last = ([1, 2], drafted, {0: 10, 2: 11}, [0, 1, 2, 3])
    drafter.last = last
    drafter._learn([1, 2, 7, 3, 5, 8])  # the first outcome (round 1's): the cache only
    assert cache.kept == [[10, 11]] and (drafter.kept, drafter.predicted) == (2.0, 2.0) and drafter.warm
    drafter.last = last
    drafter._learn([1, 2, 7, 3, 5, 8])
    assert drafter.kept == 4.0 and drafter.predicted == pytest.approx(2 + 0.6 + 0.3 + 0.3 + 0.24)
    drafter.last = last
    drafter._learn([1, 9, 7])  # another context: the fed slots go, nothing is learnt
    assert cache.dropped == 1 and len(cache.kept) == 2 and drafter.kept == 4.0 and drafter.last is None


def test_the_frontier_is_the_best_nodes_of_a_depth_that_can_still_make_the_tree(pair):
    # root -> 0 (0.5), 1 (0.3); 0 -> 2 (0.25), 3 (0.2); 1 -> 4 (0.15), 5 (0.12)
    drafted = [node(-1, 1, 1, score=0.5), node(-1, 2, 1, score=0.3), node(0, 3, 2, score=0.25),
               node(0, 4, 2, score=0.2), node(1, 5, 2, score=0.15), node(1, 6, 2, score=0.12)]
    budgeted = TreeProposer(pair.draft, pair.vocab_size, nodes=4, branching=2)
    # the best 2 of depth 2, each with fewer than 4 nodes above it (node 3 is the 4th best)
    assert budgeted._frontier(drafted, 2, bar=0.9, cap=4) == [2, 3]
    assert budgeted._frontier(drafted, 2, bar=0.9, cap=3) == [2]  # node 3 is 4th: cannot make 3
    assert budgeted._frontier(drafted, 1, bar=0.9, cap=4) == [0, 1]
    budgeted.branching = 3  # a third candidate, 4 only if 5 nodes may be verified
    assert budgeted._frontier(drafted, 2, bar=0.9, cap=4) == [2, 3]
    assert budgeted._frontier(drafted, 2, bar=0.9, cap=5) == [2, 3, 4]
    sized = TreeProposer(pair.draft, pair.vocab_size, branching=2)  # no budget: each must pay (c = 1)
    assert sized._frontier(drafted, 2, bar=0.2, cap=64) == [2]  # 0.2 does not clear a bar of 0.2


def test_a_drafted_tree_holds_the_cap_and_its_nodes_score_their_paths(pair):
    """With every node paying (a calibration that says all are kept), the tree is as big as the
    round's cap: k nodes and k + MIN_SPREAD in turn while the verify cost is unmeasured; a node's score
    is its parent's times its own q (float32)."""
    from specviz.treedraft import float32_product

    cost = VerifyCost()
    drafter = TreeProposer(pair.draft, pair.vocab_size, cost=cost)
    drafter.kept = 1e6
    ids, params, gen = pair.tokenizer(PROMPTS[0])["input_ids"], SamplingParams(), torch.Generator()
    sizes = []
    for k in (1, 3, 3):
        tree = drafter.propose(ids, k, params, gen).tree
        drafter.last = None
        drafter.lm.drop_slots()
        sizes.append(len(tree))
        assert all(n.score == (n.q if n.parent < 0 else float32_product(tree[n.parent].score, n.q))
                   for n in tree) and max(n.depth for n in tree) <= k
        cost.observe(len(tree), 0.3)
    assert sizes == [1, 3 + VerifyCost.MIN_SPREAD, 3]


def test_the_width_follows_the_verified_tree_not_all_the_draft_offered(pair):
    drafter = TreeProposer(pair.draft, pair.vocab_size, nodes=1)  # 3 + 3 drafted, the best one verified
    ids = pair.tokenizer(PROMPTS[0])["input_ids"]
    draft = drafter.propose(ids, 2, SamplingParams(), torch.Generator())
    assert len(draft.tree) == 1 and len(drafter.last[1]) == 6 and drafter.branching == 3
