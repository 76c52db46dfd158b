"""Greedy comparison: identical, near-tie, or unexplained; and escaping in rendered tokens."""

import torch

from specviz.compare import NEAR_TIE_ULPS, compare, first_difference, ulp
from specviz.engine import RoundEvent
from specviz.metrics import RunStats
from specviz.render import Span, to_html


def event(position, tokens, top2, k=0):
    return RoundEvent(round=position + 1, k=k, draft_tokens=[], accepted=0, token=tokens[-1],
                      kind="bonus", new_tokens=tokens, target_probs=[], draft_probs=[],
                      target_passes=position + 1, draft_passes=0, draft_seconds=0.0,
                      target_seconds=0.0, round_seconds=0.0, elapsed=0.0, position=position,
                      source="none", target_cache_length=0, stop=None, target_top2=[top2])


def runs(margin_spec, margin_base):
    first = event(0, [5], [(5, 20.0), (6, 19.0)])
    spec = RunStats.of([first, event(1, [7], [(7, 20.0 + margin_spec), (8, 20.0)])])
    base = RunStats.of([first, event(1, [8], [(8, 20.0 + margin_base), (7, 20.0)])])
    return spec, base


def test_ulp_of_bf16_and_fp32():
    assert ulp(20.0, torch.bfloat16) == 0.125 and ulp(20.0, torch.float32) == 2.0 ** -19
    assert ulp(20.0, torch.float16) == 2.0 ** -6  # 10 mantissa bits: 16 * 2^-10


def verdict_at(spec_top2, base_top2):
    """The comparison of runs that differ at position 1 with these top-2 rows there (bf16)."""
    first = event(0, [5], [(5, 20.0), (6, 19.0)])
    spec = RunStats.of([first, event(1, [spec_top2[0][0]], spec_top2)])
    base = RunStats.of([first, event(1, [base_top2[0][0]], base_top2)])
    return compare(spec, base, torch.bfloat16, "cpu")


def test_the_near_tie_bound_by_hand():
    """bf16: a logit in [16, 32) has ulp 0.125 (bound 8 ulp = 1.0), one in [32, 64) 0.25 (2.0)."""
    near = "near-tie flipped by floating point"
    # a margin of exactly the bound is within it
    assert verdict_at([(7, 21.0), (8, 20.0)], [(8, 21.0), (7, 20.0)]).verdict == near
    # a near-tie in one run alone does not: the other's margin of 3.0 is 24 ulps from the tie, a
    # move of logit 7 - logit 8 by 3.125 between the runs that no reordered sum makes
    one_sided = verdict_at([(7, 20.125), (8, 20.0)], [(8, 23.0), (7, 20.0)])
    assert one_sided.verdict == "unexplained: please report"
    assert verdict_at([(7, 20.125), (8, 20.0)], [(8, 21.0), (7, 20.0)]).verdict == near  # both within 1.0
    # the bound scales with the larger top logit of the two runs (33 > 32), not the smaller one or a
    # runner-up's: margin 1.5 is within 2.0
    c = verdict_at([(7, 31.5), (8, 30.0)], [(8, 33.0), (7, 31.5)])
    assert (c.threshold, c.verdict) == (2.0, near)
    c = verdict_at([(7, 33.0), (8, 31.5)], [(8, 33.0), (7, 31.5)])
    assert (c.threshold, c.verdict) == (2.0, near)
    # by magnitude: top logits of -40 and -20 scale it by 40
    c = verdict_at([(7, -40.0), (8, -41.5)], [(8, -20.0), (7, -21.5)])
    assert (c.threshold, c.verdict) == (2.0, near)
    wide = verdict_at([(7, 21.125), (8, 20.0)], [(8, 21.125), (7, 20.0)])  # one step past it
    assert wide.verdict == "unexplained: please report"


def test_identical_runs():
    spec, _ = runs(0.5, 0.5)
    assert compare(spec, spec, torch.bfloat16, "cpu").verdict == "identical"


def test_difference_within_a_few_ulps_is_a_near_tie():
    spec, base = runs(0.125, 0.0)  # one bf16 step apart at 20: a tie flipped by rounding
    c = compare(spec, base, torch.bfloat16, "cpu")
    assert (c.position, c.verdict) == (1, "near-tie flipped by floating point")
    assert c.threshold == NEAR_TIE_ULPS * 0.125


def test_wide_margin_difference_is_unexplained():
    spec, base = runs(3.0, 3.0)
    assert compare(spec, base, torch.bfloat16, "cpu").verdict == "unexplained: please report"
    spec, base = runs(0.01, 0.01)  # in float32 even 0.01 is thousands of ulps
    assert compare(spec, base, torch.float32, "cpu").verdict == "unexplained: please report"


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_tokens_are_html_escaped():
    html = to_html([Span('<script>alert("x")</script>', "accepted", 1, 1, 1, 0.5, 0.25)])
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_verdict_reads_the_row_computed_on_the_committed_context():
    # Round 1 drafts [5, 9, 4] and keeps only 5, then the target says 7: its rows 2..3 were
    # computed after the refused draft 9. Round 2 commits position 2 from its own row 0.
    def round_(position, drafts, accepted, new, top2):
        return RoundEvent(round=position + 1, k=len(drafts), draft_tokens=drafts, accepted=accepted,
                          token=new[-1], kind="recovered", new_tokens=new,
                          target_probs=[1.0] * len(drafts), draft_probs=[1.0] * len(drafts),
                          target_passes=position + 1, draft_passes=0, draft_seconds=0.0,
                          target_seconds=0.0, round_seconds=0.0, elapsed=0.0, position=position,
                          source="draft", target_cache_length=0, stop=None, target_top2=top2)

    stale = [(3, 25.0), (8, 10.0)]  # what the target said at position 2 after the refused 9
    first = round_(0, [5, 9, 4], 1, [5, 7],
                   [[(5, 20.0), (6, 1.0)], [(7, 20.0), (9, 19.0)], stale, [(1, 5.0), (2, 4.0)]])
    spec = RunStats.of([first, round_(2, [], 0, [8], [[(8, 20.0), (3, 19.9375)]])])
    base = RunStats.of([first, round_(2, [], 0, [3], [[(3, 20.0), (8, 19.9375)]])])
    c = compare(spec, base, torch.bfloat16, "cpu")
    assert c.position == 2 and c.spec_top2 == [(8, 20.0), (3, 19.9375)]
    assert c.verdict == "near-tie flipped by floating point"  # the stale row's margin is 15
