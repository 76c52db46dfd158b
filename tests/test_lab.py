"""The exactness lab: exact masses on the built-in example, and each variant's bias detected."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import finished

from specviz import lab
from specviz.tree import children

P, Q = torch.tensor(lab.EXAMPLE_P, dtype=torch.float64), torch.tensor(lab.EXAMPLE_Q, dtype=torch.float64)


def test_example_masses_are_exact():
    m = lab.Masses(P, Q)
    assert torch.allclose(m.accepted, torch.tensor([0.2, 0.3, 0.1], dtype=torch.float64))
    assert torch.allclose(m.residual, torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64))
    assert m.expected_acceptance == pytest.approx(0.6) == 1 - lab.tv(P, Q)
    assert m.accept_probability(0) == pytest.approx(1 / 3) and m.accept_probability(1) == 1.0


def test_the_lab_prints_the_example_masses_and_never_rounds_a_refusal_onto_certain():
    from specviz.labview import masses_html

    # p = (0.2, 0.5, 0.3), q = (0.6, 0.3, 0.1): drafting A, min(1, 0.2/0.6) = 1/3; Σ min(p, q) =
    # 0.2 + 0.3 + 0.1 = 0.6
    text = masses_html(P, Q, 0, "A")
    assert "p(x)=0.2000, q(x)=0.6000, accept probability min(1, p/q) = <b>0.3333</b>" in text
    assert "1 − TV(p, q) = <b>0.6000</b>" in text
    near = torch.tensor([0.99996, 0.00004], dtype=torch.float64)  # kept with 0.99996, not "1.0000"
    text = masses_html(near, torch.tensor([1.0, 0.0], dtype=torch.float64), 0, "A")
    assert "min(1, p/q) = <b>0.99996</b>" in text and "1 − TV(p, q) = <b>0.99996</b>" in text


def test_predicted_distributions_of_the_variants():
    close = lambda a, b: torch.allclose(a, torch.tensor(b, dtype=torch.float64), atol=1e-12)  # noqa: E731
    assert close(lab.predicted("exact", P, Q), lab.EXAMPLE_P)
    assert close(lab.predicted("poor_q", P, Q), lab.EXAMPLE_P)
    assert close(lab.predicted("correction_from_p", P, Q), [0.28, 0.50, 0.22])
    # argmax draft: always proposes A (q=0.6), kept with 0.2/0.6, else residual [0, .5, .5].
    assert close(lab.predicted("argmax_draft", P, Q), [1 / 3, 1 / 3, 1 / 3])
    # accept only the target's argmax B (q(B)=0.3), else sample p.
    assert close(lab.predicted("accept_if_target_argmax", P, Q), [0.14, 0.65, 0.21])
    q_draw = torch.tensor([1 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    mism = lab.predicted("mismatched_q", P, Q, q_draw)
    assert abs(float(mism.sum()) - 1) < 1e-12 and lab.tv(mism, P) > 0.05


# N = 10^6 trials: the sampling noise in TV is ~1e-3, so exact variants stay under 0.005 and
# the wrong ones (biases 0.08..0.15) are each detected with a chi-square p-value < 1e-9.
N = 1_000_000


@pytest.mark.parametrize("variant", ["exact", "poor_q"])
def test_exact_variants_reproduce_p(variant):
    r = lab.check(variant, P, Q, N, seed=1)
    assert r.tv_to_p < 0.005 and r.pvalue_vs_p > 1e-4


@pytest.mark.parametrize("variant, q_draw", [
    ("correction_from_p", None), ("argmax_draft", None), ("accept_if_target_argmax", None),
    ("mismatched_q", (1 / 3, 1 / 3, 1 / 3)),
])
def test_wrong_variants_are_detected_and_match_their_prediction(variant, q_draw):
    r = lab.check(variant, P, Q, N, seed=2, q_draw=q_draw)
    assert r.tv_to_p > 0.05 and r.pvalue_vs_p < 1e-9
    assert lab.tv(r.empirical, r.predicted) < 0.005


def _verdicts(p, q, n, variants) -> dict[str, str]:
    import re

    from specviz import labview

    _, table = labview.monte_carlo(p, q, ["A", "B", "C"][: len(p)], n, variants)
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    return {cells[0]: cells[4] for cells in rows} | {"note": table.rsplit("<p>", 1)[1]}


def test_a_wrong_variant_that_a_point_mass_q_makes_exact_is_not_called_wrong_by_the_page():
    # an n-gram round's q is one-hot on the drafted A: its argmax is A, q^1/2 is q, and A is not
    # p's argmax, so these three variants draw exactly what the rule does: p
    p, q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64), torch.tensor([1.0, 0, 0], dtype=torch.float64)
    for v in ("argmax_draft", "mismatched_q", "accept_if_target_argmax"):
        assert lab.tv(lab.predicted(v, p, q, q_draw=q), p) < 1e-12
    shown = _verdicts(p, q, 20_000, ["exact", "argmax_draft", "mismatched_q", "accept_if_target_argmax",
                                      "correction_from_p"])
    # "matches p" unbroken (a no-break space): its "p" stood alone on a line, at 375 and 1400 px
    assert shown["exact"] == "matches\u00a0p"
    assert {shown[v] for v in ("argmax_draft", "mismatched_q", "accept_if_target_argmax")} == \
        {"matches\u00a0p: exact for this q"}
    assert shown["correction_from_p"] == "<b>biased</b>" and "q is a point mass" in shown["note"]
    assert "point mass" not in _verdicts(P, Q, 1_000, ["exact"])["note"]


def test_a_point_mass_p_is_the_reason_wrong_variants_match_and_the_lab_says_so():
    """With p one-hot (top-k 1, a tight top-p, a confident target) every rule emits its one token:
    the wrong variants read "exact for this q", where q had nothing to do with it."""
    p = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    shown = _verdicts(p, q, 2_000, ["exact", "correction_from_p", "accept_if_target_argmax"])
    assert shown["exact"] == "matches\u00a0p"
    assert {shown["correction_from_p"], shown["accept_if_target_argmax"]} == \
        {"matches\u00a0p: exact for this p (one token)"}


def test_the_masses_say_what_the_rule_does_where_q_or_the_residual_is_zero():
    """Where q(x) = 0 the rule keeps x whenever p(x) > 0 (u·0 < p(x)), as lab.predicted does: the
    page said 0. Where p <= q everywhere there is no residual (never drawn): the plot showed p,
    1.0 on a drafted token the rule always keeps."""
    from specviz import labview

    m = lab.Masses(torch.tensor([0.2, 0.5, 0.3]), torch.tensor([0.5, 0.5, 0.0]))
    assert m.accept_probability(2) == 1.0 and m.accept_probability(0) == pytest.approx(0.4)
    assert lab.Masses(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0])).accept_probability(0) == 0.0
    assert m.shown_residual.tolist() == pytest.approx([0.0, 0.0, 1.0])  # (0, 0, 0.3) / 0.3
    kept = lab.Masses(torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 0.0]))  # an n-gram's draft
    assert kept.shown_residual.tolist() == [0.0, 0.0, 0.0]
    fig = labview.masses_figure(kept.p, kept.q, ["A", "B", "C"])
    bar = next(t for t in fig.data if t.name.startswith("normalize(max(0, p - q))"))
    assert bar.name.endswith("(none: p ≤ q everywhere)") and max(bar.y) == 0
    assert "accept probability min(1, p/q) = <b>1" in labview.masses_html(m.p, m.q, 2, "C")


def test_a_bias_too_small_for_the_trials_is_not_called_a_match():
    # p = (0.5, 0.5), q = (0.49, 0.51): correcting from p emits (0.495, 0.505), 0.005 from p in TV,
    # which 1,000 trials cannot see (the test's noise there is about 0.013)
    p, q = torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([0.49, 0.51], dtype=torch.float64)
    assert lab.tv(lab.predicted("correction_from_p", p, q), p) == pytest.approx(0.005)
    shown = _verdicts(p, q, 1_000, ["correction_from_p"])["correction_from_p"]
    assert shown == ("no bias detected at this N (its exact output is 0.005 from p in TV, too little for "
                     "these trials to show: more may, a bias this small can need more than a page draws)")
    # a bias of 0.0004 in TV is one too: only an output exact to rounding matches p
    from specviz import labview

    r = replace(lab.check("exact", P, Q, 100, seed=0), pvalue_vs_p=0.5,
                predicted=torch.tensor([0.5004, 0.2996, 0.2], dtype=torch.float64))
    assert labview._verdict("exact", r, torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)).startswith(
        "no bias detected at this N (its exact output is 0.0004 from p")


def test_the_page_calls_no_exact_rule_biased_and_promises_no_trials_a_small_bias_needs():
    """The draws are seeded by N: at some N (27,000 on the example) an exact rule's sample is one of
    the 1 in 1,000 the test flags, and the row read "biased" on the page meant to show it exact. A bias of
    5e-4 in TV (p = (.5, .3, .2), q = (.001, .5, .499), accepting only the target's argmax) needs
    about 1.4e7 trials; the page said "more trials show it", and it draws at most 1e6."""
    from specviz import labview

    p, q, labels, _ = labview.example()
    for variant in ("exact", "poor_q", "tree_exact"):  # seeded draws the test flagged
        flagged = replace(lab.check(variant, p, q, 1_000), pvalue_vs_p=2e-4)
        assert labview._verdict(variant, flagged, p).startswith(
            "flagged (p < 0.001), yet its exact output is p: a false alarm")
    wrong = lab.check("argmax_draft", p, q, 1_000)
    assert labview._verdict("argmax_draft", replace(wrong, pvalue_vs_p=2e-4), p) == "<b>biased</b>"
    p2 = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q2 = torch.tensor([0.001, 0.5, 0.499], dtype=torch.float64)
    r = lab.check("accept_if_target_argmax", p2, q2, 1_000)
    assert lab.tv(r.predicted, p2) == pytest.approx(5e-4, rel=1e-3)
    text = labview._verdict("accept_if_target_argmax", replace(r, pvalue_vs_p=0.5), p2)
    assert "more may, a bias this small can need more than a page draws" in text
    assert "more trials show it" not in text


def test_the_joint_two_sample_test_flags_samples_apart_at_every_k_and_holds_its_level():
    """The end-to-end check's k + 1 histograms in one permutation test: each of them alone has a
    p-value floor of 1 / 2001, so the smallest of five times five (Bonferroni) could not fall below
    0.0025, and samples apart at every position read "consistent" at k = 4. One test keeps the floor
    at 1 / 2001; under one distribution its p-value stays level (share below 0.05 near 5%)."""
    gen = torch.Generator().manual_seed(0)
    for parts in (1, 3, 5, 17):
        a = torch.randint(0, 3, (200, parts), generator=gen)
        t = lab.joint_two_sample_tv(a, a + 3)  # apart in every histogram: TV 1 each
        assert t.pvalue == 1 / 2001 and t.tvs == pytest.approx([1.0] * parts) and len(t.pvalues) == parts
    alike = lab.joint_two_sample_tv(a[:100], a[100:])
    assert alike.pvalue > 0.01 and all(0 < n < 0.5 for n in alike.noises)
    low = 0
    for rep in range(100):  # two samples of one distribution over four histograms
        both = torch.randint(0, 4, (80, 4), generator=gen)
        low += lab.joint_two_sample_tv(both[:40], both[40:], permutations=199, seed=rep).pvalue < 0.05
    assert 1 <= low <= 12, low


def test_chi_square_pvalue_matches_scipy():
    from scipy.stats import chisquare

    counts = torch.tensor([210.0, 480.0, 310.0])
    ours = lab.chi_square_pvalue(counts, P)
    theirs = chisquare(counts.numpy(), (P * 1000).numpy()).pvalue
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_chi_square_sees_a_one_percent_bias_over_a_real_vocabulary():
    """151,936 cells with p > 0 (Qwen's vocabulary) and 200,000 trials: one degree of freedom a
    cell would need a statistic near 153,000 to flag anything; pooling the cells that expect
    fewer than 5 counts leaves the test its power."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 151_936, 200_000
    logits = torch.randn(vocab, generator=g, dtype=torch.float64) * 2.5
    p = logits.softmax(-1)
    q = (logits + torch.randn(vocab, generator=g, dtype=torch.float64)).softmax(-1)
    wrong = lab.predicted("accept_if_target_argmax", p, q)
    assert 0.005 < lab.tv(wrong, p) < 0.02

    def draws(dist):
        return torch.bincount(torch.multinomial(dist, n, replacement=True, generator=g), minlength=vocab)

    assert lab.chi_square_pvalue(draws(p).double(), p) > 1e-3
    biased = draws(wrong).double()
    assert lab.chi_square_pvalue(biased, p) < 1e-9 and lab.chi_square_pvalue(biased, wrong) > 1e-3
    # 3 cells expecting 1, 1 and 8 of 10 trials: the two small ones join the big one, one cell
    # holding all 10 is no evidence (unpooled: statistic 2.5 on 2 degrees of freedom, p = 0.29)
    assert lab.chi_square_pvalue(torch.tensor([0.0, 0.0, 10.0]), torch.tensor([0.1, 0.1, 0.8])) \
        == pytest.approx(1.0)


def test_a_p_value_of_a_pooled_and_a_grouped_test_is_twice_the_smaller_but_at_most_1():
    """1,000 draws exactly as p expects, p = 0.6 on one token and 0.004 on 100 others: the 100
    expect 4 each, so they are pooled (400, a cell) and also tested in 20 groups of 5 tokens
    (20 each). Each test reads 1 (a statistic of 0), twice the smaller is 2: the lab's table
    shows 1, as its footnote says ("at most 1")."""
    p = torch.tensor([0.6] + [0.004] * 100, dtype=torch.float64)
    assert lab.chi_square_pvalue(p * 1000, p) == 1.0


def test_lab_on_a_round_of_a_real_run(pair):
    import specviz
    from specviz import labview
    from specviz.render import all_spans
    from specviz.store import pair_models
    from specviz.trace import Trace

    ids = pair.encode("def f")
    events = tuple(specviz.generate(pair, ids, k=3, max_new_tokens=12, temperature=0.8, seed=1))
    t = Trace({"temperature": 0.8, "top_k": 0, "top_p": 1.0}, pair_models(pair), ids, events,
              tuple(all_spans(events, pair.tokenizer, ids)))
    p, q, labels, drafted, note = finished(labview.from_round_steps(pair, t, 1))
    assert drafted == events[0].draft_tokens[0] and "temperature 0.8" in note
    # p(x) and q(x) recomputed from the prefix equal what the run recorded for that draft.
    assert float(p[drafted]) == pytest.approx(events[0].target_probs[0], rel=1e-4)
    assert float(q[drafted]) == pytest.approx(events[0].draft_probs[0], rel=1e-4)
    _, table = labview.monte_carlo(p, q, labels, 20_000, ["exact"], tokenizer=pair.tokenizer)
    assert "matches\u00a0p" in table
    with pytest.raises(ValueError, match="round in 1.."):
        finished(labview.from_round_steps(pair, t, 99))
    # The same pair on another device, or a trace from before numerics were written, is this pair
    # (the lab refused both, naming two identical pairs); another dtype is not.
    models = pair_models(pair)
    for other in ({**models, "device": "cuda:0", "numerics": models["numerics"].replace("cpu", "cuda:0")},
                  {name: v for name, v in models.items() if name != "numerics"}):
        p2, q2, *_ = finished(labview.from_round_steps(pair, replace(t, models=other), 1))
        assert torch.equal(p2, p) and torch.equal(q2, q)
    dtype = "bfloat16" if models["dtype"] != "bfloat16" else "float32"
    refused = rf"made with .*\({dtype}\), but the loaded pair is .*one pair at a time.*run it here"
    with pytest.raises(ValueError, match=refused):
        finished(labview.from_round_steps(pair, replace(t, models={**models, "dtype": dtype}), 1))
    # a greedy run's settings may hold a top-k and top-p it never used: the lab applies them at
    # temperature 1, and its note says so (it named the temperature only)
    greedy = replace(t, settings={"temperature": 0.0, "top_k": 5, "top_p": 0.5})
    p3, _, _, _, note = finished(labview.from_round_steps(pair, greedy, 1))
    assert "temperature 1, top-k 5, top-p 0.5 (the run was greedy" in note
    assert "with the top-k and top-p its settings hold" in note and 1 <= int((p3 > 0).sum()) <= 5
    # top-k 0 and top-p 1 are off: a note names neither, greedy or not
    assert "top-" not in finished(labview.from_round_steps(pair, t, 1))[4]
    plain = finished(labview.from_round_steps(pair, replace(t, settings={**greedy.settings, "top_k": 0,
                                                                           "top_p": 1.0}), 1))[4]
    assert "temperature 1 (the run was greedy: one-hot p and q, so the lab looks at temperature 1)" in plain


def test_the_lab_tells_two_folders_of_the_same_last_name_apart(model_dirs, tmp_path):
    """A trace names a local folder by its last part (no server path in a saved file): two
    checkpoints' …/final read as one pair, and the lab showed the loaded one's p and q as the
    trace's round. Such names carry a hash of the full ones; hub names and presets carry none."""
    import shutil

    import specviz
    from specviz import labview
    from specviz.loading import load_pair
    from specviz.render import all_spans
    from specviz.store import made_here, pair_models
    from specviz.trace import Trace

    pairs = []
    for run in ("run1", "run2"):
        folder = tmp_path / run / "final"
        shutil.copytree(model_dirs["target"], folder)
        pairs.append(load_pair(str(folder), str(model_dirs["draft"]), device="cpu", dtype="float32"))
    a, b = pairs
    assert pair_models(a)["target"] == pair_models(b)["target"] == "…/final"
    assert pair_models(a)["source"] != pair_models(b)["source"]
    ids = a.encode("def f")
    events = tuple(specviz.generate(a, ids, k=3, max_new_tokens=6))
    t = Trace({"temperature": 0.0}, pair_models(a), ids, events, tuple(all_spans(events, a.tokenizer, ids)))
    assert made_here(t, a) and not made_here(t, b)
    with pytest.raises(ValueError, match=r"loaded pair is …/final with …/draft .*\(float32\) from other "
                                         "folders of the same names"):
        finished(labview.from_round_steps(b, t, 1))
    older = replace(t, models={name: v for name, v in t.models.items() if name != "source"})
    with pytest.raises(ValueError, match="this trace is older than specviz's marks of which folder"):
        finished(labview.from_round_steps(a, older, 1))  # before the marks: no folder told apart
    hub = replace(a, target_name="Qwen/Qwen2.5-Coder-1.5B-Instruct", draft_name="Qwen/Qwen2.5-Coder-0.5B")
    assert "source" not in pair_models(hub)  # the same name on every machine: nothing to tell apart


def test_the_lab_refuses_a_round_whose_context_holds_an_id_the_draft_cannot_read(pair, monkeypatch):
    """A draft with fewer input rows than the target's vocabulary drafted nothing where the context
    held an id past them (engine: it reads every id below its rows); the lab says so rather than
    index past the draft's embedding. An id of exactly its row count is already past it."""
    import specviz
    from specviz import labview
    from specviz.render import all_spans
    from specviz.store import pair_models
    from specviz.trace import Trace

    ids = pair.encode("def f")
    events = tuple(specviz.generate(pair, ids, k=3, max_new_tokens=6, temperature=0.8, seed=1))
    t = Trace({"temperature": 0.8, "top_k": 0, "top_p": 1.0}, pair_models(pair), ids, events,
              tuple(all_spans(events, pair.tokenizer, ids)))
    highest = max(ids)  # round 1's context is the prompt
    monkeypatch.setattr(labview, "input_rows", lambda model: highest)  # rows 0..highest-1
    with pytest.raises(ValueError, match=r"the draft cannot read this round's context \(an id past its "
                                         r"vocabulary\): it drafted nothing there; pick another round"):
        finished(labview.from_round_steps(pair, t, 1))
    monkeypatch.setattr(labview, "input_rows", lambda model: highest + 1)  # reads it: the round's q
    assert float(finished(labview.from_round_steps(pair, t, 1))[1].sum()) == pytest.approx(1.0)


# ---- token trees at depth 1 -------------------------------------------------------------------
# The hand example: p = [0.5, 0.3, 0.2], candidates [1, 2] tried in that order.
TREE_P, TREE_C = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), [1, 2]


def test_tree_variants_closed_form_on_the_hand_example():
    close = lambda a, b: torch.allclose(a, torch.tensor(b, dtype=torch.float64), atol=1e-12)  # noqa: E731
    assert close(lab.predicted_tree("tree_exact", TREE_P, TREE_C), [0.5, 0.3, 0.2])
    # no renormalisation: R = (1 - 0.3)(1 - 0.2) = 0.56 of the rounds refuse both and draw from p:
    # c1 = 1: 0.3 + 0.56 * 0.3 = 0.468; c2 = 2: 0.7 * 0.2 + 0.56 * 0.2 = 0.252; token 0: 0.56 * 0.5
    assert close(lab.predicted_tree("tree_no_renormalise", TREE_P, TREE_C), [0.28, 0.468, 0.252])
    # through `predicted`, the candidates default to the draft's top-3 under q: on the built-in
    # example A, B, C in q's order (0.6, 0.3, 0.1), R = 0.8 * 0.5 * 0.7 = 0.28:
    # A: 0.2 + 0.28 * 0.2; B: 0.8 * 0.5 + 0.28 * 0.5; C: 0.8 * 0.5 * 0.3 + 0.28 * 0.3
    assert lab.tree_candidates(Q) == [0, 1, 2] and lab.tree_candidates(Q, 2) == [0, 1]
    assert close(lab.predicted("tree_no_renormalise", P, Q), [0.256, 0.54, 0.204])
    assert close(lab.predicted("tree_exact", P, Q), lab.EXAMPLE_P)
    assert lab.tree_candidates(torch.tensor([0.0, 0.7, 0.3])) == [1, 2]  # q = 0 is never drafted
    with pytest.raises(ValueError, match="distinct token ids"):
        lab.predicted_tree("tree_exact", TREE_P, [1, 1])
    assert lab.TREE_BRANCHING == __import__("specviz.treedraft").treedraft.BRANCHING


# N = 10^6 vectorised trials, as for the chain variants: TV noise ~1e-3; the wrong tree rule's
# bias here is TV 0.22 (0.096 on the built-in example), each detected with p-value < 1e-9.
@pytest.mark.parametrize("p, q, candidates", [(TREE_P, TREE_P, TREE_C), (P, Q, None)])
def test_tree_rule_simulation_reproduces_p_and_the_wrong_one_is_detected(p, q, candidates):
    exact = lab.check("tree_exact", p, q, N, seed=3, candidates=candidates)
    assert exact.tv_to_p < 0.005 and exact.pvalue_vs_p > 1e-4
    wrong = lab.check("tree_no_renormalise", p, q, N, seed=4, candidates=candidates)
    assert wrong.tv_to_p > 0.05 and wrong.pvalue_vs_p < 1e-9
    assert lab.tv(wrong.empirical, wrong.predicted) < 0.005


def test_tree_walk_itself_follows_p_at_depth_one():
    """tree.walk (the engine's rule) on the hand example, 10,000 rounds: chi-square p-value above
    1e-3 against p; tree.wrong_walk (5,000 rounds) is rejected against p (p-value < 1e-9) and
    matches its own prediction (p-value above 1e-3)."""
    from specviz.tree import TreeNode, walk

    nodes = (TreeNode(-1, 1, 1, 0.6, 0.6), TreeNode(-1, 2, 1, 0.4, 0.4))
    rows = torch.stack([TREE_P, torch.full((3,), 1 / 3, dtype=torch.float64),
                        torch.full((3,), 1 / 3, dtype=torch.float64)])  # [1 + 2 nodes, vocab]
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(3, dtype=torch.float64)
    for _ in range(10_000):
        v = walk(nodes, rows, gen, greedy=False)
        counts[nodes[v.path[0]].token if v.path else v.token] += 1  # the first committed token
    assert lab.chi_square_pvalue(counts, TREE_P) > 1e-3
    wrong = torch.zeros(3, dtype=torch.float64)
    for _ in range(5_000):
        wrong[wrong_walk(nodes, rows, gen)] += 1
    assert lab.chi_square_pvalue(wrong, TREE_P) < 1e-9
    assert lab.chi_square_pvalue(wrong, lab.predicted_tree("tree_no_renormalise", TREE_P, TREE_C)) > 1e-3


def test_lab_on_a_tree_round_of_a_real_run(pair):
    import html

    import specviz
    from specviz import labview
    from specviz.render import all_spans
    from specviz.store import pair_models
    from specviz.trace import Trace

    ids = pair.encode("def f")
    events = tuple(specviz.generate(pair, ids, proposer="tree", k=3, nodes=8, branching=2,
                                    max_new_tokens=12, temperature=0.8, seed=1))
    t = Trace({"temperature": 0.8, "top_k": 0, "top_p": 1.0}, pair_models(pair), ids, events,
              tuple(all_spans(events, pair.tokenizer, ids)))
    p, q, labels, drafted, note = finished(labview.from_round_steps(pair, t, 1))
    root = labview.tree_root(t, 1)
    assert root == [n.token for n in events[0].tree if n.parent == -1] and len(root) == 2
    assert labview.tree_root(t, 99) == [] and labview.tree_root(t, True) == []
    # the walk tries the root's candidates one at a time as one-hot drafts: the masses show the
    # first, kept with p(x1) (not the soft draft's min(1, p/q)), and its residual is the walk's
    assert drafted == root[0] and float(q[drafted]) == 1.0 and float(q.sum()) == 1.0
    assert "a tree round" in note and f"{float(p[root].sum()):.4f}" in note
    assert lab.Masses(p, q).accept_probability(drafted) == pytest.approx(float(p[drafted]))
    _, table = labview.monte_carlo(p, q, labels, 20_000, ["tree_exact"], tokenizer=pair.tokenizer,
                                   candidates=root)
    named = ", ".join(repr(pair.tokenizer.decode([c])) for c in root)
    assert "matches\u00a0p" in table and html.escape(f"candidates: {named}") in table


def two_sample(a, b, permutations: int = 2_000):
    """lab.joint_two_sample_tv on one histogram given as counts a [m] and b [m]."""
    def rows(counts):
        return torch.repeat_interleave(torch.arange(len(counts)), torch.as_tensor(counts))[:, None]

    t = lab.joint_two_sample_tv(rows(a), rows(b), permutations)
    return SimpleNamespace(tv=t.tvs[0], noise=t.noises[0], pvalue=t.pvalue)


def test_two_sample_test_on_hand_enumerated_splits():
    # {x, x, y, y} split 2 + 2: 6 equally likely splits, 2 of them {x, x | y, y} or {y, y | x, x}
    # (TV 1), 4 of them {x, y | x, y} (TV 0): mean TV 1/3, P(TV >= 1) = 1/3. 20,000 random splits:
    # standard error 0.0033, tolerance 0.015.
    t = two_sample(torch.tensor([2, 0]), torch.tensor([0, 2]), permutations=20_000)
    assert t.tv == 1.0 and t.noise == pytest.approx(1 / 3, abs=0.015)
    assert t.pvalue == pytest.approx(1 / 3, abs=0.015)
    # sizes 1 and 3: every split has TV 2/3 (a's one sample x: |1 - 1/3| + |0 - 2/3|, halved; y
    # alike), so the noise is 2/3 and every split is at least as far apart as the observed one
    t = two_sample(torch.tensor([1, 0]), torch.tensor([1, 2]), permutations=500)
    assert t.tv == pytest.approx(2 / 3) and t.noise == pytest.approx(2 / 3) and t.pvalue == 1.0


def test_two_sample_noise_is_the_tv_of_two_exact_samplers():
    """The noise the end-to-end check states is the mean TV of two independent samples of N from
    one distribution: 400 pairs of N=200 from a uniform p over 20 outcomes measure it (standard
    error ~1%; tolerance 8%). The old rule of thumb, √(20/200) = 0.32, was 1.8x too large.
    A sample from correction_from_p's output against one from p is told apart (p < 0.001)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.full((20,), 1 / 20)
    draws = [torch.multinomial(p, 200, True, generator=gen).bincount(minlength=20) for _ in range(800)]
    measured = sum(lab.tv(draws[i] / 200, draws[i + 1] / 200) for i in range(0, 800, 2)) / 400
    estimated = two_sample(draws[0], draws[1])
    assert estimated.noise == pytest.approx(measured, rel=0.08) and estimated.pvalue > 1e-3
    wrong = lab.predicted("correction_from_p", P, Q)  # [0.28, 0.5, 0.22] against p [0.2, 0.5, 0.3]
    a = torch.multinomial(wrong, 1000, True, generator=gen).bincount(minlength=3)
    b = torch.multinomial(P, 1000, True, generator=gen).bincount(minlength=3)
    assert two_sample(a, b).pvalue < 1e-3


def test_a_rounds_long_context_is_read_a_pass_at_a_time_with_the_deadline_between(pair, monkeypatch):
    """The lab read a round's whole context (up to 2,560 tokens) in one pass per model, where
    neither Stop nor the job's time limit could act: now a pass of lm.PREFILL_CHUNK at a time."""
    import time

    from specviz import labview, lm
    from specviz.engine import generate
    from specviz.store import pair_models
    from specviz.trace import Trace

    monkeypatch.setattr(lm, "PREFILL_CHUNK", 8)
    ids = pair.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    events = tuple(generate(pair, ids, k=3, max_new_tokens=8, temperature=1.0, seed=1))
    t = Trace({"k": 3, "temperature": 1.0}, pair_models(pair), ids, events, ())
    steps = list(labview.from_round_steps(pair, t, 2))
    n = len(ids) + len(events[0].new_tokens) - 1
    marks = [*range(8, n, 8), n]
    assert steps == [f"Reading the round's context into the {m}: {r} of {n} tokens"
                     for m in ("target", "draft") for r in marks]
    p, q, _, drafted, _ = finished(labview.from_round_steps(pair, t, 2))  # the same masses as one pass gives
    monkeypatch.setattr(lm, "PREFILL_CHUNK", 10_000)
    p1, q1, _, _, _ = finished(labview.from_round_steps(pair, t, 2))
    assert torch.allclose(p, p1, atol=1e-5) and torch.allclose(q, q1, atol=1e-5)
    monkeypatch.setattr(lm, "PREFILL_CHUNK", 8)
    with pytest.raises(ValueError, match="time limit per job while reading the round's context"):
        list(labview.from_round_steps(pair, t, 2, deadline=time.monotonic() - 1))


def test_the_lab_plots_only_tokens_with_mass_and_never_prints_a_p_value_of_0():
    """A top-k round's p and q have two tokens with mass: the other six of the top 8 were zero-mass
    ids that took most of the axis. A p-value that underflows float64 printed as "0"."""
    from specviz import labview

    p, q = torch.zeros(50, dtype=torch.float64), torch.zeros(50, dtype=torch.float64)
    p[[3, 9]], q[[9, 20]] = torch.tensor([0.7, 0.3], dtype=torch.float64), 0.5
    ids, names = labview._top(p, q, [f"t{i}" for i in range(50)])
    assert ids == [9, 3, 20] and names == ["t9", "t3", "t20"]  # by p + q: 0.8, 0.7, 0.5
    assert labview.pvalue_text(0.0) == "< 1e-300" and labview.pvalue_text(0.5) == "0.5"
    assert labview.pvalue_text(0.0009996) == "0.0009996"  # never rounded onto the bar


def test_the_lab_sums_the_tokens_past_its_top_8_into_an_other_bar():
    # 12 tokens, q uniform: by p + q the top 8 are ids 0-7, so "other" holds ids 8-11: p 0.03 +
    # 0.02, q 4/12, min(p, q) 0.03 + 0.02, and no residual (there p < q). The residual is p - q
    # on ids 0-3 over its mass there, 0.69 - 4/12
    from specviz import labview

    p = torch.tensor([0.3, 0.2, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.03, 0.02, 0.0, 0.0], dtype=torch.float64)
    q = torch.full((12,), 1 / 12, dtype=torch.float64)
    fig = labview.masses_figure(p, q, [f"t{i}" for i in range(12)])
    assert list(fig.data[0].x) == [f"t{i}" for i in range(8)] + ["other"]
    assert [bar.y[-1] for bar in fig.data] == pytest.approx([0.05, 4 / 12, 0.05, 0.0], abs=1e-12)
    residual = (0.3 - 1 / 12) / (0.69 - 4 / 12)
    assert [bar.y[0] for bar in fig.data] == pytest.approx([0.3, 1 / 12, 1 / 12, residual])
    nine = labview.masses_figure(p[:9] / 0.98, torch.full((9,), 1 / 9, dtype=torch.float64),
                                 [f"t{i}" for i in range(9)])  # one token past the top 8 gets "other" too
    assert list(nine.data[0].x)[-1] == "other" and nine.data[0].y[-1] == pytest.approx(0.03 / 0.98)


def test_an_other_bar_of_no_mass_is_zero_not_a_rounding_below_it():
    """A top-k run's p and q hold no mass past their top 8 tokens: "other" is their sum's rounding
    (float32 p summed as a tensor, less its 8 bars summed one by one), here -9e-8 for p, a bar
    below the axis. It is 0 in both the masses plot and the Monte Carlo check's."""
    from specviz import labview

    p = torch.cat([torch.softmax(torch.randn(8, generator=torch.Generator().manual_seed(3)) * 2, 0),
                   torch.zeros(4)])
    assert float(p.sum()) < sum(float(x) for x in p[:8])  # the rounding this is about
    q = torch.cat([torch.full((8,), 1 / 8), torch.zeros(4)])
    labels = [f"t{i}" for i in range(12)]
    masses = labview.masses_figure(p, q, labels)
    checked, _ = labview.monte_carlo(p, q, labels, 1_000, ["exact"])
    for fig in (masses, checked):
        assert all(list(bar.x)[-1] == "other" and bar.y[-1] >= 0 for bar in fig.data)
    assert masses.data[0].y[-1] == 0.0


def test_the_lab_names_every_token_on_its_own_bar_and_shows_tags_as_text():
    from specviz import labview

    class Pieces:  # ids 1 and 2: halves of one character, each decoding to U+FFFD alone
        def decode(self, ids):
            return {0: "<b>x</b>", 1: "\ufffd", 2: "\ufffd"}[ids[0]]

    fig, _ = labview.monte_carlo(P, Q, None, 1_000, ["exact"], tokenizer=Pieces())
    x = list(fig.data[0].x)
    assert sorted(x) == sorted(["'\ufffd' #1", "'\ufffd' #2", "'&lt;b&gt;x&lt;/b&gt;'"])
    assert list(fig.data[0].y) == [float(P[int(n[-1])]) if "#" in n else 0.2 for n in x]

    class Named(Pieces):  # ... with byte-level names (as the embedded pair's): " \\xf0\\x9f" and "\\x9a"
        def convert_ids_to_tokens(self, i):
            from specviz.detok import _BYTE_OF

            char_of = {b: c for c, b in _BYTE_OF.items()}
            return {0: "x", 1: "".join(char_of[b] for b in b" \xf0\x9f"), 2: char_of[0x9A]}[i]

        def decode(self, ids):
            return {0: "<b>x</b>", 1: " \ufffd", 2: "\ufffd"}[ids[0]]

    fig, _ = labview.monte_carlo(P, Q, None, 1_000, ["exact"], tokenizer=Named())
    assert sorted(fig.data[0].x) == sorted(["' \\xf0\\x9f'", "'\\x9a'", "'&lt;b&gt;x&lt;/b&gt;'"])
    assert list(labview.masses_figure(P, Q, None, Named()).data[0].x)[:3] == list(fig.data[0].x)
    # the tree variant's row names its candidates so too: it read "candidates: ' �', '�'"
    _, table = labview.monte_carlo(P, Q, None, 1_000, ["tree_exact"], tokenizer=Named(), candidates=[1, 2])
    assert "(candidates: &#x27; \\xf0\\x9f&#x27;, &#x27;\\x9a&#x27;)" in table


def wrong_walk(nodes, p: torch.Tensor, generator: torch.Generator) -> int:
    """A known-wrong tree rule for the exactness lab, depth 1 only: every child is tried against
    the unchanged p (no renormalisation after a refusal) and a full refusal draws from p.
    It over-produces the drafted candidates. Returns the first committed token."""
    for c in children(nodes).get(-1, []):
        if float(torch.rand(1, generator=generator)) < float(p[0, nodes[c].token]):
            return nodes[c].token
    return int(torch.multinomial(p[0], 1, generator=generator))


def test_a_mismatched_draw_onto_tokens_q_never_drafts_is_kept_as_the_rule_keeps_it():
    """predicted() gave such a token a keep chance of 0, where the rule (u·q(x) < p(x)) keeps it
    whenever p(x) > 0: with q all on A and draws 0.2/0.4/0.4 it said B 0.54, C 0.36 where the
    rule gives 0.46, 0.44. Hand: A drawn 0.2, kept w.p. 0.5: 0.1; B and C drawn and always kept:
    0.4 each; A's refusals (0.1) go to the residual, p less q clamped: B 0.6, C 0.4."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    q_draw = torch.tensor([0.2, 0.4, 0.4], dtype=torch.float64)
    want = torch.tensor([0.1, 0.4 + 0.1 * 0.6, 0.4 + 0.1 * 0.4], dtype=torch.float64)
    assert torch.allclose(lab.predicted("mismatched_q", p, q, q_draw), want)
    r = lab.check("mismatched_q", p, q, 100_000, seed=0, q_draw=q_draw)
    assert lab.chi_square_pvalue(r.empirical * 100_000, want) > 1e-3


def looks(fig) -> list[tuple]:
    """What tells a figure's series apart without colour: type, mode, dash, symbol and pattern."""
    def look(t):
        line, marker = getattr(t, "line", None), t.marker
        pattern = getattr(marker, "pattern", None)
        return (t.type, getattr(t, "mode", None), getattr(line, "dash", None) or "solid",
                getattr(marker, "symbol", None), pattern and (pattern.shape or "", pattern.fillmode))
    return [look(t) for t in fig.data]


def test_every_lab_and_run_plot_tells_its_series_apart_without_colour():
    """Under colour blindness (or in grey) the cumulative plot's speculative and baseline lines,
    the lab's variants and its masses were told apart by colour alone."""
    from test_metrics import run

    from specviz import figures, labview
    from specviz.metrics import RunStats

    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    fig, _ = labview.monte_carlo(p, q, ["A", "B", "C"], 1_000, list(lab.VARIANTS))
    assert len(fig.data) == len(lab.VARIANTS) + 1 and len(set(looks(fig))) == len(fig.data)
    masses = labview.masses_figure(p, q, ["A", "B", "C"])
    assert len(masses.data) == 4 and len(set(looks(masses))) == 4
    spec, base = run([(4, 2), (4, 4), (4, 1)]), run([(0, 0)] * 3)
    assert isinstance(base, RunStats)
    for name, fig in figures.all_figures(spec, base).items():
        assert len(set(looks(fig))) == len(fig.data), (name, looks(fig))


def test_the_time_plot_draws_no_markers_so_its_baseline_is_told_by_its_dash():
    """The cumulative plot tells its runs apart by dash and by marker; the time plot draws lines
    alone, so there only the baseline's dash tells it from the speculative run in grey."""
    from test_metrics import run

    from specviz import figures

    spec, base = run([(4, 2), (4, 4), (4, 1)]), run([(0, 0)] * 3)
    shown = figures.all_figures(spec, base)
    assert [(t.name, t.mode, t.line.dash) for t in shown["time"].data] == [
        ("speculative", "lines", "solid"), ("baseline", "lines", "dash")]
    assert [(t.name, t.line.dash, t.marker.symbol) for t in shown["cumulative"].data] == [
        ("speculative", "solid", "circle"), ("baseline", "dash", "square")]


def test_a_tree_runs_k_plot_tells_its_point_from_the_chains_without_colour():
    """The tree run's point and the chain's at the same k: a diamond and a square, not two
    diamonds told apart by colour alone."""
    from test_metrics import run

    from specviz import figures

    spec = run([(4, 2), (4, 4), (4, 1)])
    fig = figures._tree_points(spec, spec, 4)
    assert [t.marker.symbol for t in fig.data] == ["diamond", "square"]
    assert len(set(looks(fig))) == len(fig.data) == 2


def test_every_plots_title_fits_its_plot_on_a_375_px_phone():
    """Plotly never wraps a title: the lab's "Monte Carlo: 200,000 one-token rounds per variant"
    (386 px, chromium) ran 92 px past its 309 px plot's right edge on a 375 px phone, its end cut
    off. Each title's longest line, at the widest numbers it can show (N = 1,000,000, k = 16),
    fits a phone's plot (figures.TITLE_CHARS; the token tree's panel TREE_TITLE_CHARS)."""
    from test_metrics import run

    from specviz import explorer, figures, labview

    fig, _ = labview.monte_carlo(P, Q, list(lab.EXAMPLE_LABELS), 1_000_000, ["exact"])
    rec = explorer.Recording("draft", [1, 2], list(range(10, 24)), list(range(10, 24)), 0.05, 0.1, 14,
                             confidences=[0.3] * 14, verify_line=(0.1, 0.0))
    spec, base = run([(4, 2), (4, 4), (4, 1)]), run([(0, 0)] * 3)
    shown = {"monte carlo": fig, "masses": labview.masses_figure(P, Q, list(lab.EXAMPLE_LABELS)),
             "explorer": labview.explorer_views(rec, 16, True, None, None)[2],
             **figures.all_figures(spec, base, k=16),
             "k_prediction (tree)": figures._tree_points(spec, spec, 16),
             "tree_nodes": figures.tree_nodes(spec), "tree_chain": figures.tree_vs_chain(spec, spec, 16)}
    for name, fig in shown.items():
        most = figures.TREE_TITLE_CHARS if name.startswith("tree_") else figures.TITLE_CHARS
        lines = fig.layout.title.text.split("<br>")
        assert max(len(line) for line in lines) <= most, (name, fig.layout.title.text)
    assert shown["monte carlo"].layout.title.text == "Monte Carlo: 1,000,000 rounds each"


def test_a_titles_room_is_the_phone_plots_width_less_the_5_percent_it_starts_in():
    """A title starts 5% into its plot: of a 375 px phone's 309 px plot, 0.95 × 309 / 8.2 = 35.8
    characters fit (35 whole), of the token tree panel's 283 px 32.8 (32). Counted over the whole
    width (37), a 37-character title would start 15 px in and end at 319 px, past the plot's edge."""
    from specviz import figures

    assert (figures.TITLE_CHARS, figures.TREE_TITLE_CHARS) == (35, 32)


def f64(*xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_the_chi_square_p_value_by_hand_at_its_pooling_edges():
    chi = lab.chi_square_pvalue
    # p forbids the third outcome: none seen is a perfect fit, one seen refutes p
    assert chi(f64(50., 50., 0.), f64(.5, .5, 0.)) == 1.0 and chi(f64(50., 50., 1.), f64(.5, .5, 0.)) == 0.0
    # two cells expecting exactly MIN_EXPECTED (5) each stay cells: 25/5 + 25/5 = 10, 1 df, erfc(sqrt 5)
    assert chi(f64(10., 0.), f64(.5, .5)) == pytest.approx(math.erfc(math.sqrt(5)), rel=1e-9)
    # a pool expecting exactly 5 (2.5 + 2.5) is a cell: 25/75 + 25/5 = 16/3, 1 df
    assert chi(f64(70., 10., 0.), f64(.9375, .03125, .03125)) == \
        pytest.approx(math.erfc(math.sqrt(8 / 3)), rel=1e-9)
    # a pool expecting 1 joins the smallest big cell (19 -> 20 expected, 25 seen): 25/50 + 0 + 25/20 =
    # 1.75 on 2 df, exp(-1.75 / 2). The pool is also tested alone, and the p-value is the smaller of
    # the two, doubled: seen 3 times, P(Poisson(1) >= 3) = 1 - 5/(2e) = 0.080 against the merged
    # table's p = 0.81 (statistic 9/50 + 1/30 + 4/20 = 0.41 on 2 df): 0.16
    poisson_tail = lambda r, lam: 1 - sum(math.exp(-lam) * lam**i / math.factorial(i) for i in range(r))  # noqa: E731
    assert chi(f64(47., 31., 19., 3.), f64(.5, .3, .19, .01)) == pytest.approx(
        2 * min(lab._pearson(f64(50., 30., 20.), f64(47., 31., 22.)), poisson_tail(3, 1.0)), rel=1e-9)
    # ... and seen 6 times, the pool alone is the evidence (P(Poisson(1) >= 6) = 0.00059), where
    # merged it read exp(-0.875) = 0.42
    assert lab._pearson(f64(50., 30., 20.), f64(45., 30., 25.)) == pytest.approx(math.exp(-0.875), rel=1e-9)
    assert chi(f64(45., 30., 19., 6.), f64(.5, .3, .19, .01)) == pytest.approx(2 * poisson_tail(6, 1.0),
                                                                               rel=1e-9)
    # every draw on a token p gives 0.001: merged into the big cell it read 1, "no bias"
    assert chi(f64(0., 1000.), f64(.999, .001)) < 1e-300
    # every cell small (a flat p over many tokens at few trials): one pooled cell, no evidence
    assert chi(f64(1., 1.), f64(.5, .5)) == 1.0


def test_the_permutation_p_value_counts_the_observed_split():
    # 5 of one outcome against 5 of the other: of 10 random splits none is as far apart (1 in 252),
    # and the observed split counts itself: (1 + 0) / (1 + 10)
    assert two_sample(torch.tensor([5, 0]), torch.tensor([0, 5]), permutations=10).pvalue == 1 / 11


def test_a_tree_rounds_note_prints_the_probability_a_candidate_is_kept_as_a_probability(pair):
    """The note's Σ p(x) over the root's candidates (the walk keeps one of them with that
    probability), printed to 4 decimals, read 1.0000 for 0.9999996 at a low temperature: a
    candidate always kept. And a sum of float32 probabilities can pass 1 by rounding: it was
    printed 1.0000000000007703. It reads in [0, 1], and 1 only where it is 1 but for rounding."""
    import re

    import specviz
    from specviz import labview
    from specviz.render import all_spans
    from specviz.store import pair_models
    from specviz.trace import Trace

    ids, near = pair.encode("def f"), []
    for temperature in (0.01, 0.02):
        events = tuple(specviz.generate(pair, ids, proposer="tree", k=3, nodes=8, branching=2,
                                        max_new_tokens=6, temperature=temperature, seed=1))
        t = Trace({"temperature": temperature, "top_k": 0, "top_p": 1.0}, pair_models(pair), ids, events,
                  tuple(all_spans(events, pair.tokenizer, ids)))
        for number, event in enumerate(events, 1):
            if not event.tree:
                continue
            p, _, _, _, note = finished(labview.from_round_steps(pair, t, number))
            kept = float(p[labview.tree_root(t, number)].sum())
            (printed,) = re.findall(r"over the candidates = ([0-9.]+) ", note)
            assert 0 <= float(printed) <= 1 and (float(printed) < 1 or kept > 1 - 1e-9), (kept, printed)
            near.append(1 - 1e-4 < kept < 1)
    assert any(near)  # a sum that 4 decimals round onto 1 is among them


def test_tree_candidates_up_to_the_widest_branching_and_within_the_vocabulary():
    p = torch.full((10,), 0.1, dtype=torch.float64)
    assert torch.equal(lab.predicted_tree("tree_exact", p, list(range(8))), p)  # 8 = MAX_BRANCHING
    for bad in (list(range(9)), [10], [3, 3]):
        with pytest.raises(ValueError, match="tree candidates must be 1..8 distinct token ids in 0..9"):
            lab.predicted_tree("tree_exact", p, bad)


def test_a_draw_q_never_drafts_and_an_unnormalised_q_by_hand():
    # p = q = (.5, .5, 0); the draw puts .5 on token 2, which q never drafts and p forbids: refused
    # there, and the target's correction (p less q is nothing: p itself) restores p exactly
    out = lab.predicted("mismatched_q", f64(.5, .5, 0.), f64(.5, .5, 0.), q_draw=f64(.25, .25, .5))
    assert torch.allclose(out, f64(.5, .5, 0.), atol=1e-12)
    # check() normalises q as it does p: a q given as weights is still a q, and the rule still gives p
    result = lab.check("exact", [.2, .5, .3], [1.2, .6, .2], 100_000)
    assert result.tv_to_p < 0.01 and result.pvalue_vs_p > 1e-3


def test_simulate_takes_1_to_10_million_trials():
    p = torch.tensor([.5, .3, .2], dtype=torch.float64)
    q = torch.tensor([.2, .3, .5], dtype=torch.float64)
    assert lab.simulate("exact", p, q, 10_000_000, torch.Generator().manual_seed(0)).sum() == 10_000_000
    for n in (0, 10_000_001):
        with pytest.raises(ValueError, match=r"trials must be in 1\.\.10\^7, got"):
            lab.simulate("exact", p, q, n, torch.Generator())


def test_the_lab_prints_a_drafted_tokens_p_and_q_off_0_and_1_when_they_are_not():
    """A drafted token the target finds unlikely (p(x) = 2e-5) read "p(x)=0.0000" beside an accept
    probability of 0.0001; one the draft rarely samples read "q(x)=0.0000", a token it never
    drafts; p(x) = 0.99996 read "1.0000" beside an accept probability below 1."""
    from specviz.labview import masses_html

    text = masses_html(f64(2e-5, 1 - 2e-5), f64(0.3, 0.7), 0, "A")
    assert "p(x)=0.00002, q(x)=0.3000" in text and "min(1, p/q) = <b>0.0001</b>" in text
    text = masses_html(f64(0.6, 0.4), f64(3e-5, 1 - 3e-5), 0, "A")
    assert "p(x)=0.6000, q(x)=0.00003" in text and "min(1, p/q) = <b>1.0000</b>" in text
    text = masses_html(f64(0.99996, 0.00004), f64(0.99997, 0.00003), 0, "A")
    assert "p(x)=0.99996, q(x)=0.99997" in text and "min(1, p/q) = <b>0.99999</b>" in text


def test_chi_square_sees_every_trial_on_one_token_of_a_flat_p():
    """Every cell of a flat p over 400 tokens expects fewer than 5 of 1,000 trials: pooled into
    one cell, the test had a p-value of 1 whatever the counts, so the lab called a draft of the
    argmax (99% of its trials on one token) "no bias detected" at the page's smallest N. Grouped
    by p into cells that expect 5 or more, the exact rule still passes at the stated rate."""
    from specviz import labview

    g = torch.Generator().manual_seed(0)
    p = (torch.randn(400, generator=g, dtype=torch.float64) * 0.2).softmax(-1)
    q = (torch.randn(400, generator=g, dtype=torch.float64) * 0.2).softmax(-1)
    assert float(p.max()) * 1_000 < lab.MIN_EXPECTED
    one = torch.zeros(400, dtype=torch.float64)
    one[int(p.argmax())] = 1_000
    assert lab.chi_square_pvalue(one, p) < 1e-9
    _, table = labview.monte_carlo(p, q, [], 1_000, ["exact", "argmax_draft"])
    assert table.count("<b>biased</b>") == 1 and "<td>argmax_draft</td>" in table.split("<b>biased</b>")[0]
    pvalues = torch.tensor([lab.chi_square_pvalue(torch.bincount(torch.multinomial(
        p, 1_000, replacement=True, generator=g), minlength=400).double(), p) for _ in range(500)])
    assert 0.02 <= float((pvalues < 0.05).double().mean()) <= 0.09 and int((pvalues < 1e-3).sum()) <= 3


def test_chi_square_sees_draws_piled_on_rare_tokens_and_an_exact_sampler_still_passes():
    """One token expects 997 of 1,000 draws and 400 share the other 3: the pool of the 400 merged
    into the big cell left one cell, so ten times the rare draws (30 in place of 3) read p-value 1,
    "no bias". Tested alone as well (a Poisson tail; Bonferroni over the two), such a sampler is
    flagged, and an exact one is flagged no more often than the stated rate."""
    g = torch.Generator().manual_seed(0)
    p = torch.cat([torch.tensor([0.997]), torch.full((400,), 0.003 / 400)]).double()
    biased = torch.cat([torch.tensor([0.97]), torch.full((400,), 0.03 / 400)]).double()

    def pvalues(dist, trials):
        return torch.tensor([lab.chi_square_pvalue(torch.bincount(torch.multinomial(
            dist, 1_000, replacement=True, generator=g), minlength=401).double(), p) for _ in range(trials)])

    exact = pvalues(p, 1_000)
    assert float((exact < 0.05).double().mean()) <= 0.06 and int((exact < 1e-3).sum()) <= 3
    assert float((pvalues(biased, 50) < 1e-3).double().mean()) == 1.0


def test_the_same_round_and_n_draw_the_same_and_another_n_draws_anew():
    """The table says so: a flag on the exact rule (once in 1,000) comes back on pressing again
    with the same N, and another N draws anew."""
    from specviz import labview

    seeds = []
    real = lab.check
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lab, "check", lambda *a, seed, **kw: seeds.append(seed) or real(*a, seed=seed, **kw))
        tables = [labview.monte_carlo(P, Q, list(lab.EXAMPLE_LABELS), n, ["exact"])[1] for n in (1_000, 1_000,
                                                                                              1_001)]
    assert seeds[0] == seeds[1] != seeds[2]  # a stream of its own (1,001 draws were 1,000 and one more)
    drop_time = lambda t: t.split("</td><td>")[:-1]  # noqa: E731
    assert drop_time(tables[0]) == drop_time(tables[1])


def test_draws_piled_on_one_rare_token_show_beside_a_big_pool():
    """Half of p on one token and the rest flat over 400 tokens (each expecting 1.25 of 1,000
    draws): the rare ones pooled expect 500, one cell of their own, so 500 draws all on one rare
    token read p-value 1, "no bias"; the pool's tokens grouped (by p and N only) see it."""
    p = torch.cat([torch.tensor([0.5]), torch.full((400,), 0.5 / 400)]).double()
    counts = torch.zeros(401, dtype=torch.float64)
    counts[0], counts[1] = 500, 500
    assert lab.chi_square_pvalue(counts, p) < 1e-3
    even = torch.cat([torch.tensor([500.0]), torch.tensor([2.0, 1.0, 1.0, 1.0]).repeat(100)]).double()
    assert lab.chi_square_pvalue(even, p) > 0.5  # the rare draws spread as p expects: no alarm
