"""Each field of a round's event and each cache, where the chain tests do not reach: tree rounds,
stops at an EOS, a compiled pass that fails part way, acceptance by position. Every test here
failed under a mutation of the code that the rest of the suite let through (a review in clones:
17 of 39 survived before these)."""
import pytest
import torch
from conftest import fails_once, hf_greedy

import specviz
from specviz.lm import CachedLM
from specviz.loading import Pair
from specviz.proposers import Draft
from specviz.sampling import SamplingParams, process
from specviz.tree import ACCEPTED, ancestors
from specviz.treedraft import TreeProposer
from specviz.verifycost import fit_line, spans_widths, split_step

PROMPT = "def fibonacci(n):\n    if n < 2:"


def toks(events):
    return [t for e in events for t in e.new_tokens]


def target_greedy(pair, n: int) -> list[int]:
    """The target alone's first n greedy tokens after PROMPT, EOS or not."""
    pair.target.generation_config.eos_token_id = None
    try:
        return hf_greedy(pair, PROMPT, n)
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id


def test_an_oracle_proposer_is_asked_for_what_the_budget_can_use_and_one_past_it_is_refused(pair):
    """The engine asks for at most the tokens the budget can still use (the target adds one), so
    a proposer that keeps to its k ends exactly at max_new_tokens; one that ignores k was cut to
    the budget here, and near the model's last position ran past its position table (an
    IndexError from inside the model): it is refused, naming the fix."""
    want = target_greedy(pair, 10)
    n = len(pair.encode(PROMPT))

    def oracle(obeys: bool):
        class Oracle:
            name = "oracle"

            def propose(self, ids, k, params, generator):
                return Draft(want[len(ids) - n:len(ids) - n + (k if obeys else 6)], None, source="oracle")
        return Oracle()

    events = list(specviz.generate(pair, PROMPT, proposer=oracle(True), k=2, max_new_tokens=5))
    assert toks(events) == want[:5] and events[-1].stop == "length"
    assert [e.k for e in events] == [2, 1]  # 3 tokens, then 1 draft and the target's: the budget's 2
    with pytest.raises(ValueError, match="drafted 6 tokens deep, more than the 2 it was asked for"):
        list(specviz.generate(pair, PROMPT, proposer=oracle(False), k=2, max_new_tokens=3))


def test_a_tree_rounds_fields_describe_the_walked_branch(pair):
    seen = beyond = 0
    events = [e for prompt in (PROMPT, "The quick brown fox")  # the second walks past a refusal
              for e in specviz.generate(pair, prompt, proposer="tree", k=4, nodes=12, max_new_tokens=30)]
    for e in events:
        if not e.tree:
            continue
        beyond += e.k > e.accepted + 1  # the branch goes on below its first refused node
        path = [i for i, x in enumerate(e.tree) if x.fate == ACCEPTED]
        chain, node = list(path), (path[-1] if path else -1)
        while kids := [i for i, x in enumerate(e.tree) if x.parent == node]:
            node = min(kids)
            chain.append(node)
        assert e.draft_tokens == [e.tree[i].token for i in chain] and e.k == len(chain)
        # greedy: the target's argmax at each walked position is the token committed there
        assert [row[0][0] for row in e.target_top2[: len(e.new_tokens)]] == e.new_tokens
        seen += len(e.new_tokens) > 1
    assert seen and beyond


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_rollback_after_a_tree_pass_drops_its_nodes(pair, cache):
    ids = pair.encode(PROMPT)
    lm = CachedLM(pair.target, pair.vocab_size, cache=cache, max_len=128)
    lm.forward_tree(ids, [7, 9, 3], [-1, -1, 0])
    lm.rollback(ids + [11])
    assert lm.slots == [] and lm.cache_length == len(ids)
    fresh = CachedLM(pair.target, pair.vocab_size)
    assert torch.allclose(lm.forward(ids + [11])[0], fresh.forward(ids + [11])[0], atol=1e-4)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_kept_path_rolls_back_like_committed_tokens(pair, cache):
    ids = pair.encode(PROMPT)
    lm = CachedLM(pair.target, pair.vocab_size, cache=cache, max_len=128)
    lm.forward_tree(ids, [7, 9, 3, 4, 5], [-1, -1, 0, 0, 2])
    lm.keep([0, 2, 4])  # 7 -> 3 -> 5
    lm.rollback(ids + [7, 3, 99])  # keeps ids + [7, 3]
    fresh = CachedLM(pair.target, pair.vocab_size)
    assert torch.allclose(lm.forward(ids + [7, 3, 99])[0], fresh.forward(ids + [7, 3, 99])[0], atol=1e-4)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(0.7, top_k=5)])
def test_every_tree_nodes_q_is_the_drafts_processed_probability_after_its_path(float_pair, params):
    """On a float32 draft (float_pair), so that the recomputation can agree to 1e-4."""
    pair = float_pair
    ids = pair.encode(PROMPT)
    drafter = TreeProposer(pair.draft, pair.vocab_size, nodes=16, branching=3)
    tree = drafter.propose(ids, 4, params, torch.Generator().manual_seed(0)).tree
    assert max(x.depth for x in tree) >= 3
    for i, x in enumerate(tree):
        path = [tree[j].token for j in ancestors(tree, i)][:-1]
        with torch.no_grad():
            logits = pair.draft(torch.tensor([ids + path])).logits[0, -1, : pair.vocab_size]
        q = logits.softmax(-1) if params.greedy else process(logits, params)
        assert abs(float(q[x.token]) - x.q) < 1e-4, (i, x)


def test_a_tree_pass_that_fails_part_way_keeps_the_earlier_nodes_and_counts_one_pass(pair):
    from specviz import fastpath

    ids = pair.encode("def fibonacci(n):")
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    eager = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    for m in (lm, eager):
        m.forward(ids)
        m.forward_tree(ids, [7, 9], [-1, -1])
    lm._step = fastpath.step  # stands in for the compiled step
    with fails_once(pair.target.model.layers[0]) as failed:
        rows = lm.forward_tree(ids, [3, 4], [0, 1])
    assert failed and lm._step is None
    assert torch.allclose(rows, eager.forward_tree(ids, [3, 4], [0, 1]), atol=1e-5)
    assert lm.passes == eager.passes == 3


def test_the_target_cache_holds_committed_minus_last_after_an_eos_stop(pair):
    base = toks(specviz.generate(pair, PROMPT, proposer="none", max_new_tokens=20))
    n = len(pair.encode(PROMPT))
    for eos in dict.fromkeys(base[3:12]):
        stop_pair = Pair(pair.target, pair.tokenizer, pair.draft)
        object.__setattr__(stop_pair, "eos_ids", frozenset([eos]))
        for proposer in ("draft", "tree", "ngram"):
            events = list(specviz.generate(stop_pair, PROMPT, proposer=proposer, k=4, max_new_tokens=20))
            assert events[-1].stop == "eos"
            assert events[-1].target_cache_length == n + len(toks(events)) - 1, (eos, proposer)


def test_tree_rounds_time_their_target_pass(pair):
    events = list(specviz.generate(pair, PROMPT, proposer="tree", k=3, nodes=8, max_new_tokens=12))
    assert all(e.tree for e in events[:-1])
    assert all(e.target_seconds > 0 for e in events)


def test_a_verify_line_needs_rounds_at_both_ends_and_its_step_is_never_negative():
    assert not spans_widths([1, 9, 9, 9, 9, 9])
    # sizes 1..5, midpoint 3: a round at the midpoint counts with the narrow end, so 5, 5 are two
    # wide rounds, one too few; one more wide round makes the line
    assert not spans_widths([1, 1, 1, 3, 5, 5]) and spans_widths([1, 1, 1, 3, 5, 5, 5])
    assert spans_widths([1, 1, 1, 5, 5, 5]) and not spans_widths([1, 1, 1, 4, 4, 4])  # spread 3 < 4
    # a line through (1, 1) and (2, 2) has intercept 0: it says nothing about a pass's cost
    assert fit_line([1.0, 2.0], [1.0, 2.0]) is None
    assert fit_line([1.0, 2.0], [2.0, 3.0]) == pytest.approx((1.0, 1.0))
    assert split_step((0.30, 0.02), 0.365) == (0.365, 0.0, 0.02)


def test_rounds_that_drafted_fewer_reach_no_later_position_and_no_histogram_bin():
    from test_metrics import run

    stats = run([(2, 2), (4, 3), (0, 0)])  # position 3 is reached by round 2 only (kept)
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0, 0.0]
    assert stats.accepted_histogram == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_events_fields_agree_in_length(pair, temperature):
    for seed in range(3):
        for e in specviz.generate(pair, PROMPT, proposer="tree", k=4, nodes=10, branching=3,
                                  max_new_tokens=30, temperature=temperature, seed=seed):
            assert e.k == len(e.draft_tokens) == len(e.target_probs) == len(e.draft_probs) \
                == len(e.target_top2) - 1, e


def test_a_tree_rounds_k_is_its_walked_branchs_length(pair):
    from specviz.tree import TreeNode

    want = target_greedy(pair, 6)
    x = (want[0] + 1) % pair.vocab_size
    tree = (TreeNode(-1, x, 1, 0.5, 0.5), TreeNode(-1, want[0], 1, 0.4, 0.4),
            TreeNode(1, want[1], 2, 0.9, 0.36), TreeNode(2, want[2], 3, 0.9, 0.32))

    class Fixed:
        name = "mine"

        def propose(self, ids, k, params, generator):
            return Draft([x], None, source="mine", tree=tree)  # tokens: the first branch

    e = next(iter(specviz.generate(pair, PROMPT, proposer=Fixed(), k=3, max_new_tokens=6)))
    assert e.accepted == 3 and e.draft_tokens == want[:3] and e.k == 3


def test_seeded_sampled_tree_runs_reproduce(pair):
    def go(seed):
        return [(e.new_tokens, [x.fate for x in e.tree]) for e in specviz.generate(
            pair, PROMPT, proposer="tree", k=3, nodes=8, max_new_tokens=20, temperature=1.0, seed=seed)]
    assert go(7) == go(7) and go(7) != go(8)


def test_a_tree_rounds_draft_passes_are_one_a_depth(pair):
    drafter = TreeProposer(pair.draft, pair.vocab_size, nodes=16, branching=2)
    draft = drafter.propose(pair.encode(PROMPT), 4, SamplingParams(), None)
    assert draft.passes == max(x.depth for x in draft.tree) == 4


@pytest.fixture(scope="module")
def float_pair(model_dirs):
    """The tiny pair with its draft as saved, in float32 (draft_quant="none"). The `pair` fixture's
    draft is int4 on CPU, whose kernel reads and writes bfloat16: a recomputed pass differs from
    the run's cached one in float32 rounding, which a bfloat16 logit can turn into a step of 2**-6
    (q 0.358 against 0.354 at seed 2 on an AVX-512 Xeon)."""
    return specviz.load_pair(str(model_dirs["target"]), str(model_dirs["draft"]), device="cpu",
                             dtype="float32", draft_quant="none")


@pytest.mark.parametrize("proposer", ["draft", "adaptive", "hybrid"])
def test_a_sampled_chains_probabilities_are_the_processed_p_and_q_of_its_drafted_tokens(float_pair, proposer):
    """Each drafted x_i's q(x_i) and p(x_i), as the event shows them, recomputed from the models
    on the round's context. A drafter that passed its sampled draft as one-hot (q=None) stays
    exact in distribution (for one drafted token a point mass is as valid a q as any), so the
    distribution tests let it through; its events showed q = 1 and its acceptance fell. On a
    float32 draft (float_pair), so that the recomputation can agree to 1e-4."""
    pair = float_pair
    params = SamplingParams(0.7, top_k=5)
    context = pair.encode("The dog. The dog. The dog")  # the hybrid copies, then drafts
    sources, checked = set(), 0
    for seed in range(3):
        ids = list(context)
        for e in specviz.generate(pair, context, proposer=proposer, k=4, max_new_tokens=24,
                                  temperature=params.temperature, top_k=params.top_k, seed=seed):
            sources.add(e.source)
            if e.k:
                rows = torch.tensor([ids + e.draft_tokens])
                with torch.no_grad():
                    q = process(pair.draft(rows).logits[0, len(ids) - 1:-1, : pair.vocab_size], params)
                    p = process(pair.target(rows).logits[0, len(ids) - 1:-1, : pair.vocab_size], params)
                drafted = torch.tensor(e.draft_tokens)
                idx = torch.arange(e.k)
                want_q = [1.0] * e.k if e.source == "ngram" else q[idx, drafted].tolist()
                assert e.draft_probs == pytest.approx(want_q, abs=1e-4), (proposer, e.round)
                assert e.target_probs == pytest.approx(p[idx, drafted].tolist(), abs=1e-4)
                checked += e.source != "ngram"
            ids += e.new_tokens
    assert checked >= 10 and sources == ({"ngram", "draft"} if proposer == "hybrid" else {proposer})
