"""Exactness lab: the rule's masses, Monte Carlo checks, and known-wrong variants beside it.

Tensors and numbers only. Every variant has a closed-form output distribution (`predicted`)
and a vectorised simulation (`simulate`), so the page and the tests compare the two.

The tree variants look at a depth-1 token tree: the root's children are b deterministic
candidates (by default the draft's top-b under q, as the tree drafter picks them), tried in
order (tree.walk; the wrong variant as a walk: tests/test_lab.py's wrong_walk). With c_1..c_b
and m_i = p(c_1) + ... + p(c_i):

    tree_exact: c_i is kept with probability p(c_i) / (1 - m_{i-1}) once c_1..c_{i-1} were
        refused, so P(c_i) = (1 - m_{i-1}) * p(c_i) / (1 - m_{i-1}) = p(c_i); all refused
        (probability 1 - m_b), the token is drawn from p without the candidates, renormalised:
        P(x) = (1 - m_b) * p(x) / (1 - m_b) = p(x). The output is p exactly.
    tree_no_renormalise: each c_i is tried against the unchanged p and a full refusal draws
        from p: with R = prod_j (1 - p(c_j)), P(c_i) = prod_{j<i} (1 - p(c_j)) p(c_i) + R p(c_i),
        P(x) = R p(x) for any other x: the candidates are over-produced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .acceptance import accepted_mass, residual

# The built-in example from our notes, over tokens A, B, C.
EXAMPLE_P = (0.2, 0.5, 0.3)
EXAMPLE_Q = (0.6, 0.3, 0.1)
EXAMPLE_LABELS = ("A", "B", "C")

VARIANTS = {
    "exact": "the rule: x ~ q, keep with prob min(1, p/q), else draw from normalize(max(0, p - q))",
    "correction_from_p": "wrong: on rejection draw from p instead of the residual",
    "argmax_draft": "wrong: the draft proposes its argmax, but the rule uses its softmax as q",
    "mismatched_q": "wrong: x drafted at twice the temperature (q^½), ratio and residual use q",
    "accept_if_target_argmax": "wrong: keep x only if it is the target's argmax, else sample p",
    "poor_q": "looks wrong, is exact: a uniform q with the right rule (only acceptance drops)",
    "tree_exact": "the tree rule at depth 1: the draft's top-b tried in order, each kept with prob r(x); "
                  "a refused x leaves r (r(x) = 0, renormalised); none kept: draw from r",
    "tree_no_renormalise": "wrong: each of the draft's top-b tried against the unchanged p; none kept: "
                           "draw from p",
}
TREE_VARIANTS = ("tree_exact", "tree_no_renormalise")
TREE_BRANCHING = 3  # candidates of a depth-1 tree by default: treedraft.BRANCHING
MAX_TREE_CANDIDATES = 8  # a tree node's most children: treedraft.MAX_BRANCHING


@dataclass(frozen=True)
class Masses:
    p: torch.Tensor  # [vocab]
    q: torch.Tensor  # [vocab]

    @property
    def accepted(self) -> torch.Tensor:
        return accepted_mass(self.p, self.q)  # [vocab]

    @property
    def residual(self) -> torch.Tensor:
        return residual(self.p, self.q)  # [vocab]

    @property
    def expected_acceptance(self) -> float:
        """sum(min(p, q)) = 1 - TV(p, q): the chance one drafted token is kept."""
        return float(self.accepted.sum())

    @property
    def shown_residual(self) -> torch.Tensor:
        """The residual as the lab plots it: zeros where p <= q everywhere (no residual, never
        drawn; acceptance.residual falls back to p there, which plotted 1.0 on a drafted token
        that is always kept)."""
        r = (self.p - self.q).clamp_min(0)  # [vocab]
        total = float(r.sum())
        return r / total if total > 1e-12 else torch.zeros_like(r)

    def accept_probability(self, x: int) -> float:
        """min(1, p(x)/q(x)); where q(x) = 0 (a re-read whose cut moved, an edited trace), the
        rule's u·q(x) < p(x) keeps x whenever p(x) > 0, as lab.predicted and acceptance.verify."""
        if self.q[x] > 0:
            return min(1.0, float(self.p[x] / self.q[x]))
        return 1.0 if self.p[x] > 0 else 0.0


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total-variation distance between two distributions [vocab]."""
    return 0.5 * float((a - b).abs().sum())


MIN_EXPECTED = 5.0  # Pearson's rule: a cell expecting fewer counts is pooled
# A big pool's tokens, grouped beside it, expect this many draws a group: at 5 the grouped test
# flagged an exact sampler 2.7 times in 1,000 at the 0.001 bar (Pearson's approximation is loose
# in the far tail of many cells that expect little); at 20, 1.5-2.0, as the pooled test alone
# (docs/lab-calibration.py)
GROUPED_BESIDE = 4 * MIN_EXPECTED


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts [vocab] against probs [vocab]. Cells expecting fewer
    than MIN_EXPECTED counts are pooled into one (into the smallest other cell, if the pool itself
    expects fewer): a real vocabulary has ~150,000 cells with p > 0, and with one degree of
    freedom each the test could not see a bias of several percent at any feasible trial count.
    A pool merged so is also tested alone, by the chance of at least its count (Poisson: the
    binomial's tail where the pool's p is this small), and the p-value is twice the smaller of the
    two (Bonferroni): merged, 1,000 draws all on a token p gives 0.001 read 1, "no bias". A pool
    big enough to be a cell is likewise also tested as its tokens in groups (GROUPED_BESIDE)."""
    mask = probs > 0
    if bool((counts[~mask] > 0).any()):
        return 0.0  # an outcome that p forbids
    n = counts.sum().double()
    expected, observed = probs[mask].double() * n, counts[mask].double()  # [cells]
    big = expected >= MIN_EXPECTED
    if not bool(big.any()):  # a flat p at few trials: one pool of every cell would test nothing
        expected, observed = _grouped(expected, observed)
        big = expected >= MIN_EXPECTED
    expected_cells, observed_cells = expected[big], observed[big]  # [m]
    rest_expected, rest_observed = expected[~big].sum(), observed[~big].sum()
    if rest_expected > 0:
        if rest_expected >= MIN_EXPECTED or not bool(big.any()):
            pooled = _pearson(torch.cat([expected_cells, rest_expected.view(1)]),
                              torch.cat([observed_cells, rest_observed.view(1)]))
            groups_expected, groups_observed = _grouped(expected[~big], observed[~big],
                                                        GROUPED_BESIDE)
            if not bool(big.any()) or len(groups_expected) < 2:
                return pooled
            # one pooled cell hides draws piled on one rare token (half of p on one token, the rest
            # flat over 400: 500 of 1,000 draws on one rare token read 1); its cells grouped see it
            grouped = _pearson(torch.cat([expected_cells, groups_expected]),
                               torch.cat([observed_cells, groups_observed]))
            return min(1.0, 2 * min(pooled, grouped))
        else:
            smallest = int(expected_cells.argmin())
            expected_cells = expected_cells.clone()
            observed_cells = observed_cells.clone()
            expected_cells[smallest] += rest_expected
            observed_cells[smallest] += rest_observed
            # P(Poisson(rest_expected) >= rest_observed): gammainc(r, λ); at least 0 is certain
            tail = float(torch.special.gammainc(rest_observed, rest_expected)) if rest_observed > 0 else 1.0
            return min(1.0, 2 * min(_pearson(expected_cells, observed_cells), tail))
    return _pearson(expected_cells, observed_cells)


def _pearson(expected: torch.Tensor, observed: torch.Tensor) -> float:
    """Pearson's chi-square p-value of observed [m] against expected [m] counts, m - 1 df."""
    stat = ((observed - expected) ** 2 / expected).sum()
    df = max(len(expected) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def _grouped(expected: torch.Tensor, observed: torch.Tensor,
             least: float = MIN_EXPECTED) -> tuple[torch.Tensor, torch.Tensor]:
    """Cells [m] that each expect fewer than MIN_EXPECTED counts, merged least likely first into
    groups expecting at least `least` each (the last few join the group before them); fewer than
    `least` in all: one cell. The groups depend on p and N only, not on the counts, so
    the test stays a chi-square test, on groups - 1 degrees of freedom. (Pooled into one cell,
    1,000 trials all on one token of a flat p over 400 tokens had a p-value of 1.)"""
    order = expected.argsort(stable=True)
    ends = expected[order].cumsum(0)  # [m]
    cut, last = [], 0.0
    for i, end in enumerate(ends.tolist()):  # a group closes once it expects `least`
        if end - last >= least:
            cut.append(i)
            last = end
    if not cut:
        return expected.sum().view(1), observed.sum().view(1)
    group = torch.zeros(len(order), dtype=torch.long)
    group[torch.tensor(cut[:-1], dtype=torch.long) + 1] = 1
    group = group.cumsum(0)  # [m]: the group of each cell in sorted order; the tail joins the last
    size = len(cut)
    return (torch.zeros(size, dtype=expected.dtype).index_add_(0, group, expected[order]),
            torch.zeros(size, dtype=observed.dtype).index_add_(0, group, observed[order]))


@dataclass(frozen=True)
class JointTwoSample:
    """Two samples seen through several histograms at once (the end-to-end check's positions),
    one permutation test for all of them: per histogram its TV, `noise` and own share `pvalues`,
    and `pvalue`, the share of splits whose largest TV / noise is at least the observed one."""
    tvs: tuple[float, ...]
    noises: tuple[float, ...]
    pvalues: tuple[float, ...]
    outcomes: tuple[int, ...]  # distinct outcomes of each histogram
    pvalue: float
    permutations: int


def joint_two_sample_tv(a: torch.Tensor, b: torch.Tensor, permutations: int = 2_000,
                        seed: int = 0) -> JointTwoSample:
    """A permutation test of two samples a [n_a, parts] and b [n_b, parts] (each row a sample,
    each column its outcome in one histogram, any integers): could one distribution have given
    both? Each split of the pooled rows into groups of a's and b's sizes is as likely as the
    observed one if so, and every histogram is split by the same rows. The statistic is the largest
    TV / noise over the histograms, noise being a histogram's mean TV over the splits (a function of
    the pooled rows, the same for every split: the test stays exact). One test, so its p-value's
    floor is 1 / (1 + permutations), where the smallest of `parts` tests' times `parts`
    (Bonferroni) could not fall below parts / 2001: at k = 4, 0.002, never under the 0.001 bar
    however far apart. (A fixed rule of thumb for the noise, such as √(m/N), is off by a factor
    that depends on the distribution: about 0.56 for a uniform one.)"""
    a, b = torch.as_tensor(a, dtype=torch.long), torch.as_tensor(b, dtype=torch.long)
    n_a, n_b, parts = a.shape[0], b.shape[0], a.shape[1]
    assert n_a > 0 and n_b > 0 and b.shape[1] == parts >= 1
    pooled = torch.cat([a, b])  # [n, parts]
    inverses = [pooled[:, j].unique(return_inverse=True)[1] for j in range(parts)]  # [n] each
    totals = [inverse.bincount() for inverse in inverses]  # [m] each: both groups of any split
    sizes = [len(total) for total in totals]
    gen, n = torch.Generator().manual_seed(seed), n_a + n_b
    rows = max(1, 2_000_000 // (n * parts))  # splits at a time: about 50 MB of buffers
    splits = []  # [r + 1, parts] blocks: the observed split first
    for start in range(0, permutations + 1, rows):
        r = min(rows, permutations + 1 - start)
        order = torch.rand(r, n, generator=gen).argsort(-1)  # [r, n]
        if start == 0:
            order[0] = torch.arange(n)  # the observed split: a's rows first
        block = []
        for inverse, both, m in zip(inverses, totals, sizes, strict=True):
            outcomes = inverse[order[:, :n_a]] + m * torch.arange(r)[:, None]  # [r, n_a]
            count_a = outcomes.flatten().bincount(minlength=r * m).view(r, m)  # [r, m]
            block.append(0.5 * (count_a.double() / n_a - (both - count_a).double() / n_b).abs().sum(-1))
        splits.append(torch.stack(block, -1))  # [r, parts]
    split = torch.cat(splits)  # [1 + permutations, parts]
    observed, others = split[0], split[1:]
    noise = others.mean(0)  # [parts]
    scaled = split / noise.clamp_min(1e-12)  # [1 + permutations, parts]
    at_least = int((scaled[1:].max(-1).values >= scaled[0].max() - 1e-9).sum())
    own = ((others >= observed - 1e-9).sum(0) + 1).double() / (1 + permutations)  # [parts]
    return JointTwoSample(tuple(observed.tolist()), tuple(noise.tolist()), tuple(own.tolist()),
                          tuple(sizes), (1 + at_least) / (1 + permutations), permutations)


def _q_for(variant: str, q: torch.Tensor) -> torch.Tensor:
    return torch.full_like(q, 1.0 / len(q)) if variant == "poor_q" else q


def tree_candidates(q: torch.Tensor, branching: int = TREE_BRANCHING) -> list[int]:
    """The draft's top-`branching` tokens under q [vocab] (those with q > 0), most likely first:
    a depth-1 tree's candidates, as the tree drafter picks them."""
    top = q.topk(min(branching, len(q)))
    return [int(i) for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True) if v > 0]


def _check_candidates(candidates, vocab: int) -> list[int]:
    out = [int(c) for c in candidates]
    if not 1 <= len(out) <= MAX_TREE_CANDIDATES or len(set(out)) != len(out) \
            or not all(0 <= c < vocab for c in out):
        raise ValueError(f"tree candidates must be 1..{MAX_TREE_CANDIDATES} distinct token ids in "
                         f"0..{vocab - 1}")
    return out


def predicted_tree(variant: str, p: torch.Tensor, candidates: list[int]) -> torch.Tensor:
    """The exact distribution [vocab] of the first token under a tree variant (module text)."""
    c = torch.tensor(_check_candidates(candidates, len(p)))  # [b]
    if variant == "tree_exact":
        return p.clone()
    if variant != "tree_no_renormalise":
        raise ValueError(f"unknown tree variant {variant!r}: choose one of {', '.join(TREE_VARIANTS)}")
    refused = 1 - p[c]  # [b]
    before = torch.cat([refused.new_ones(1), refused.cumprod(0)[:-1]])  # [b]: prod_{j<i} (1 - p(c_j))
    out = p * refused.prod()  # [vocab]: the full refusal's draw from p
    out[c] += before * p[c]
    return out


def simulate_tree(variant: str, p: torch.Tensor, candidates: list[int], n: int,
                  generator: torch.Generator) -> torch.Tensor:
    """n vectorised depth-1 tree rounds; counts [vocab] of the first committed token."""
    c = torch.tensor(_check_candidates(candidates, len(p)))  # [b]
    if variant == "tree_exact":  # r after refusing c_1..c_{i-1}: p(c_i) / (1 - m_{i-1})
        left = 1 - torch.cat([p.new_zeros(1), p[c].cumsum(0)[:-1]])  # [b]
        keep = torch.where(left > 1e-12, p[c] / left.clamp_min(1e-300), torch.ones_like(left))
        rest = p.clone()
        rest[c] = 0
        rest = rest if float(rest.sum()) > 1e-12 else p  # the candidates hold all of p: never drawn
    elif variant == "tree_no_renormalise":
        keep, rest = p[c], p
    else:
        raise ValueError(f"unknown tree variant {variant!r}: choose one of {', '.join(TREE_VARIANTS)}")
    u = torch.rand(n, len(c), generator=generator, dtype=p.dtype)  # [n, b]
    kept = u < keep  # [n, b]
    first = torch.where(kept.any(1), kept.int().argmax(1), -1)  # [n]: the first kept candidate, or -1
    fix = torch.multinomial(rest, n, replacement=True, generator=generator)  # [n]
    out = torch.where(first >= 0, c[first.clamp_min(0)], fix)  # [n]
    return torch.bincount(out, minlength=len(p)).to(p.dtype)  # [vocab]


def predicted(variant: str, p: torch.Tensor, q: torch.Tensor, q_draw: torch.Tensor | None = None,
              candidates: list[int] | None = None):
    """The exact distribution [vocab] of the emitted token under a variant. Tree variants try
    `candidates` (default: the draft's top TREE_BRANCHING under q)."""
    if variant in TREE_VARIANTS:
        return predicted_tree(variant, p, tree_candidates(q) if candidates is None else candidates)
    q = _q_for(variant, q)
    # keep iff u * q(x) < p(x): with q(x) = 0 (a mismatched draw's token q never drafts) that is
    # any p(x) > 0, as acceptance.verify and simulate decide
    keep = torch.where(q > 0, (p / q).clamp(max=1.0), (p > 0).to(p.dtype))  # [vocab]
    if variant in ("exact", "poor_q"):
        draw = q
    elif variant == "correction_from_p":
        return accepted_mass(p, q) + (1 - float(accepted_mass(p, q).sum())) * p
    elif variant == "argmax_draft":
        draw = torch.zeros_like(q).scatter_(0, q.argmax().view(1), 1.0)
    elif variant == "mismatched_q":
        draw = q if q_draw is None else q_draw
    elif variant == "accept_if_target_argmax":
        a = int(p.argmax())
        out = (1 - float(q[a])) * p
        out[a] += q[a]
        return out
    else:
        raise ValueError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    kept = draw * keep
    return kept + (1 - float(kept.sum())) * residual(p, q)


def simulate(variant: str, p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator,
             q_draw: torch.Tensor | None = None, candidates: list[int] | None = None) -> torch.Tensor:
    """n vectorised one-token rounds; returns counts [vocab] of the emitted token."""
    if not 1 <= n <= 10_000_000:
        raise ValueError(f"trials must be in 1..10^7, got {n}")
    if variant in TREE_VARIANTS:
        return simulate_tree(variant, p, tree_candidates(q) if candidates is None else candidates, n,
                             generator)
    q = _q_for(variant, q)
    vocab = len(p)
    if variant == "argmax_draft":
        x = q.argmax().expand(n)
    elif variant == "mismatched_q" and q_draw is not None:
        x = torch.multinomial(q_draw, n, replacement=True, generator=generator)
    else:
        x = torch.multinomial(q, n, replacement=True, generator=generator)  # [n]
    u = torch.rand(n, generator=generator)  # [n]
    if variant == "accept_if_target_argmax":
        keep = x == p.argmax()
        fix = torch.multinomial(p, n, replacement=True, generator=generator)
    else:
        keep = u * q[x] < p[x]
        source = p if variant == "correction_from_p" else residual(p, q)
        fix = torch.multinomial(source, n, replacement=True, generator=generator)
    return torch.bincount(torch.where(keep, x, fix), minlength=vocab).float()  # [vocab]


@dataclass(frozen=True)
class CheckResult:
    variant: str
    trials: int
    empirical: torch.Tensor  # [vocab]
    predicted: torch.Tensor  # [vocab]
    tv_to_p: float
    pvalue_vs_p: float
    seconds: float


def check(variant: str, p, q, n: int, seed: int = 0, q_draw=None, candidates=None) -> CheckResult:
    import time

    p, q = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    q_draw = None if q_draw is None else torch.as_tensor(q_draw, dtype=torch.float64)
    start = time.perf_counter()
    counts = simulate(variant, p, q, n, torch.Generator().manual_seed(seed), q_draw, candidates)
    seconds = time.perf_counter() - start
    return CheckResult(variant, n, counts / n, predicted(variant, p, q, q_draw, candidates),
                       tv(counts / n, p), chi_square_pvalue(counts, p), seconds)
