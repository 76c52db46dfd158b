"""The exactness lab: exact masses on the built-in example, and each variant's bias detected."""

import pytest
import torch

from specviz import lab

P, Q = torch.tensor(lab.EXAMPLE_P, dtype=torch.float64), torch.tensor(lab.EXAMPLE_Q, dtype=torch.float64)


def test_example_masses_are_exact():
    m = lab.Masses(P, Q)
    assert torch.allclose(m.accepted, torch.tensor([0.2, 0.3, 0.1], dtype=torch.float64))
    assert torch.allclose(m.residual, torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64))
    assert m.expected_acceptance == pytest.approx(0.6) == 1 - lab.tv(P, Q)
    assert m.accept_probability(0) == pytest.approx(1 / 3) and m.accept_probability(1) == 1.0


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


def test_chi_square_pvalue_matches_scipy():
    from scipy.stats import chisquare

    counts = torch.tensor([210.0, 480.0, 310.0])
    ours = lab.chi_square_pvalue(counts, P)
    theirs = chisquare(counts.numpy(), (P * 1000).numpy()).pvalue
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_lab_on_a_round_of_a_real_run(pair):
    import specviz
    from specviz import labview
    from specviz.render import all_spans
    from specviz.service import pair_models
    from specviz.trace import Trace

    ids = pair.encode("def f")
    events = tuple(specviz.generate(pair, ids, k=3, max_new_tokens=12, temperature=0.8, seed=1))
    t = Trace({"temperature": 0.8, "top_k": 0, "top_p": 1.0}, pair_models(pair), ids, events,
              tuple(all_spans(events, pair.tokenizer, ids)))
    p, q, labels, drafted, note = labview.from_round(pair, t, 1)
    assert drafted == events[0].draft_tokens[0] and "temperature 0.8" in note
    # p(x) and q(x) recomputed from the prefix equal what the run recorded for that draft.
    assert float(p[drafted]) == pytest.approx(events[0].target_probs[0], rel=1e-4)
    assert float(q[drafted]) == pytest.approx(events[0].draft_probs[0], rel=1e-4)
    _, table = labview.monte_carlo(p, q, labels, 20_000, ["exact"], tokenizer=pair.tokenizer)
    assert "matches p" in table
    with pytest.raises(ValueError, match="round in 1.."):
        labview.from_round(pair, t, 99)
