"""The rule on hand-made distributions: exact masses, and a statistical check that it returns p."""

import pytest
import torch

from specviz.acceptance import accepted_mass, residual, verify, verify_greedy

P = torch.tensor([0.2, 0.5, 0.3])
Q = torch.tensor([0.6, 0.3, 0.1])


def test_accepted_mass_and_residual_exact():
    assert torch.allclose(accepted_mass(P, Q), torch.tensor([0.2, 0.3, 0.1]))
    assert torch.allclose(residual(P, Q), torch.tensor([0.0, 0.5, 0.5]))


def test_residual_falls_back_to_p_when_empty():
    assert torch.equal(residual(P, P), P)


def test_equal_p_and_q_never_reject():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        x = torch.multinomial(P, 1, generator=gen)
        verdict = verify(x, P[None], torch.stack([P, P]), gen)
        assert verdict.accepted == 1 and verdict.kind == "bonus"


def test_greedy_rule_keeps_matching_prefix():
    v = verify_greedy(torch.tensor([5, 7, 9]), torch.tensor([5, 7, 8, 1]))
    assert (v.accepted, v.token, v.kind) == (2, 8, "recovered")
    # p and q are one-hot: the target's p(x) is 1 for a draft it agrees with, 0 for one it refuses
    # (the page shows it, and the keep chance min(1, p/q)); the draft's q(x) is 1 for each
    assert (v.target_probs, v.draft_probs) == ((1.0, 1.0, 0.0), (1.0, 1.0, 1.0))
    v = verify_greedy(torch.tensor([5, 7]), torch.tensor([5, 7, 3]))
    assert (v.accepted, v.token, v.kind) == (2, 3, "bonus")


def tv(counts, p):
    return 0.5 * (counts / counts.sum() - p).abs().sum().item()


def test_every_emitted_position_follows_its_own_rows_p_through_verify():
    """verify() with a different p and q at each position (a context-free model: row j's p and q
    do not depend on the drafts before j): the token emitted at position j, in the calls that
    reach it, follows p[j]. Same rows everywhere (below) could not tell row j from row 0, nor the
    bonus from any other row: a residual from q[0], or a bonus from p[k-1] or q, passed there.
    40,000 calls; chi-square per position p > 0.001 (seeded)."""
    from scipy.stats import chisquare

    p = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.1, 0.2, 0.7]])  # [k+1, vocab]
    q = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])  # [k, vocab]
    gen = torch.Generator().manual_seed(11)
    tally = [[0] * 3 for _ in range(3)]  # [position][token]: a tensor's += took a tenth of the time
    for _ in range(40_000):
        x = torch.stack([torch.multinomial(q[j], 1, generator=gen)[0] for j in range(2)])  # [k]
        v = verify(x, q, p, gen)
        for j, t in enumerate(x[: v.accepted].tolist() + [v.token]):
            tally[j][t] += 1
    counts = torch.tensor(tally, dtype=torch.float32)
    for j in range(3):
        n = counts[j].sum()
        assert n > 2000, j  # each position is reached often enough to be tested
        assert chisquare(counts[j].numpy(), (p[j] * n).numpy()).pvalue > 0.001, (j, counts[j] / n)


@pytest.mark.parametrize("k", [1, 3])
def test_verify_matches_p_through_the_public_function(k):
    # verify() itself, k drafts from a poor q: the first emitted token must follow p.
    # 40k calls, TV tolerance 0.015 (sampling error ~0.004 over 3 outcomes).
    gen = torch.Generator().manual_seed(3 + k)
    tally = [0] * 3
    for _ in range(40_000):
        x = torch.multinomial(Q, k, replacement=True, generator=gen)
        v = verify(x, Q.expand(k, 3), P.expand(k + 1, 3), gen)
        tally[int(x[0]) if v.accepted else v.token] += 1
    assert tv(torch.tensor(tally, dtype=torch.float32), P) < 0.015


def test_a_small_residual_is_the_residual_not_p():
    """max(0, p - q) with a total of 4e-4 is still the distribution a rejection draws from; only
    a total lost to rounding falls back to p (a fallback at 1e-3 passed every sampling test: a
    bias of that size needs about 10^7 samples to see)."""
    r = residual(torch.tensor([0.5004, 0.4996, 0.0], dtype=torch.float64),
                 torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    assert r.tolist() == [1.0, 0.0, 0.0]


def test_a_draft_the_target_forbids_is_refused_even_at_u_0(monkeypatch):
    """Accept iff u < p(x)/q(x): at u = 0 (float32 rand gives it with probability 2^-24) a token of
    p(x) = 0 must still be refused, or the output holds a token the target never produces."""
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: torch.zeros(*a[:1]))
    v = verify(torch.tensor([0]), None, p, torch.Generator().manual_seed(0))
    assert v.accepted == 0 and v.token in (1, 2)
