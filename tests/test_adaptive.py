"""Adaptive draft length: the stop rule's arithmetic, its learning, and its choices in a run."""

import types

import pytest

import specviz
from specviz.engine import RoundEvent
from specviz.proposers import AdaptiveProposer, Draft, DraftLength
from specviz.verifycost import VERIFY_SLOPE, VerifyCost


def test_rule_stops_when_one_more_token_would_not_pay():
    rule = DraftLength(draft_pass=0.03, target_pass=0.25)
    rule.observe([], 0, tokens=10, seconds=1.0)  # R = 10 tokens/s
    bar = 10 * (0.03 + VERIFY_SLOPE * 0.25)  # = 0.4 expected tokens
    assert bar == pytest.approx(0.4)
    stop = rule.stopper()  # lam = 1 (prior only): a(c) = c
    assert not stop(0.9)  # s = 0.9 > 0.4
    assert not stop(0.7)  # s = 0.63
    assert stop(0.6)  # s = 0.378 <= 0.4
    # before any round, R = 2 tokens per draft-4 round: 2 / (0.12 + 0.29) = 4.9/s, bar 0.195
    assert not DraftLength(0.03, 0.25).stopper()(0.2)
    assert DraftLength(0.03, 0.25).stopper()(0.19)


def test_calibration_learns_how_far_confidences_overstate_rejections():
    rule = DraftLength(0.03, 0.25, prior=2.0)
    # 3 drafts at confidence 0.5, first two kept: predicted rejections 3 * 0.5, seen 1
    rule.observe([0.5, 0.5, 0.5, 0.5], kept=2, tokens=3, seconds=0.4)
    assert rule.rejected / rule.predicted == pytest.approx((2 + 1) / (2 + 1.5))
    assert rule.acceptance(0.5) == pytest.approx(1 - 3 / 3.5 * 0.5)
    rule.observe([0.9, 0.9], kept=2, tokens=3, seconds=0.4)  # all kept: no rejection seen
    assert rule.rejected / rule.predicted == pytest.approx(3 / 3.7)
    assert rule.rate() == pytest.approx(6 / 0.8)


def measured_round(n: int, drafts: int, kept: int, draft_s: float, target_s: float) -> RoundEvent:
    """Round n as the engine reports it: `drafts` tokens drafted (ids 1..), `kept` of them kept."""
    tokens = list(range(1, drafts + 1))
    new = tokens[:kept] + [99]
    return RoundEvent(n, drafts, tokens, kept, 99, "bonus" if kept == drafts else "recovered", new,
                      [], [], n, 0, draft_s, target_s, draft_s + target_s, 0.0, 0, "draft", 0, None)


def test_adaptive_prices_a_token_by_the_measured_verify_line():
    """On a CPU where one more verified token costs half a one-token pass, the rule must learn
    that slope from the rounds, not keep the 4% prior, and count only the models' time."""
    line = VerifyCost()  # the target's line, as a baseline (0 drafts) and a chain (8) measured it:
    for n in (0, 8, 0, 8, 0, 8):  # the target's pass over n drafts costs 0.2 + 0.1 n
        line.observe(n, 0.2 + 0.1 * n)
    drafter = AdaptiveProposer(types.SimpleNamespace(report_confidences=False), line)
    confident = (0.9,) * 8
    # round 1 paid the prefills: it teaches nothing
    drafter.last = Draft([1, 2, 3, 4], None, 4, 9.0, confidences=confident[:4])
    drafter.observe_round(measured_round(1, 4, 4, 9.0, 9.0))
    assert drafter.rule is None and len(drafter.cost.drafted) + len(drafter.cost.alone) == 6
    # rounds 2-5: draft passes of 0.02 s; the target's pass on the same line
    lengths, kept = (4, 1, 8, 2), (4, 0, 3, 2)
    for i, (n, m) in enumerate(zip(lengths, kept, strict=True)):
        drafter.last = Draft(list(range(1, n + 1)), None, n, 0.02 * n, confidences=confident[:n])
        drafter.observe_round(measured_round(i + 2, n, m, 0.02 * n, 0.2 + 0.1 * n))
    rule = drafter.rule
    assert drafter.cost.measured and rule.target_pass == pytest.approx(0.2)
    assert rule.slope == pytest.approx(0.5) and rule.draft_pass == pytest.approx(0.02)
    assert rule.tokens == sum(m + 1 for m in kept)  # 13 tokens
    assert rule.seconds == pytest.approx(sum(0.02 * n + 0.2 + 0.1 * n for n in lengths))  # 2.6 s
    # lam: rejections seen 2 + 2 (rounds 3 and 4), predicted 2 + 0.1 * (4 + 1 + 4 + 2)
    assert rule.rejected / rule.predicted == pytest.approx(4 / 3.1)
    # bar = R * (C_D + slope * C_T) = 13 / 2.6 * (0.02 + 0.1) = 0.6; a(0.9) = 1 - 0.129 = 0.871,
    # so the round stops at the fourth draft (0.871, 0.759, 0.661 > 0.6 >= 0.576). The 4% prior's
    # bar, 5 * (0.02 + 0.008) = 0.14, would have drafted 15.
    assert rule.rate() == pytest.approx(5.0)
    stop = rule.stopper()
    assert [stop(0.9) for _ in range(4)] == [False, False, False, True]
    # a round drafted by someone else (the hybrid's n-gram) still measures the target's cost
    drafter.forget()
    drafter.observe_round(measured_round(6, 3, 3, 0.0, 0.5))
    assert drafter.cost.drafted[-1] == (3, 0.5) and rule.tokens == 13


def test_adaptive_skips_the_rounds_whose_draft_caught_up_on_context():
    """In the hybrid, the draft's first round of a run, and its first round after an n-gram
    streak, first feed it what it has not seen: those draft times are no C_D."""
    drafter = AdaptiveProposer(types.SimpleNamespace(report_confidences=False), VerifyCost())

    def round_(n, draft_s, drafted_by_model=True):
        drafter.last = Draft([1, 2], None, 2, draft_s, confidences=(0.9, 0.9)) if drafted_by_model else None
        drafter.observe_round(measured_round(n, 2, 1, draft_s, 0.3))

    round_(1, 0.0, drafted_by_model=False)  # the n-gram drafted round 1
    round_(2, 5.0)  # the draft's prefill of the prompt
    assert drafter.rule is None and drafter.draft_pass is None and len(drafter.cost.drafted) == 1
    round_(3, 0.04)
    assert drafter.draft_pass == pytest.approx(0.02) and drafter.rule.seconds == pytest.approx(0.34)
    drafter.forget()  # the n-gram drafted round 4
    round_(4, 0.0, drafted_by_model=False)
    round_(5, 3.0)  # catching up on the n-gram's tokens
    round_(6, 0.06)
    assert drafter.draft_pass == pytest.approx(0.7 * 0.02 + 0.3 * 0.03)
    assert drafter.rule.seconds == pytest.approx(0.34 + 0.36) and len(drafter.cost.drafted) == 5
    round_(1, 9.0)  # a new run whose round 1 the draft drafted (its prefill): round 2 counts
    round_(2, 0.04)
    assert drafter.rule.seconds == pytest.approx(0.34 + 0.36 + 0.34)


def test_adaptive_run_reports_its_draft_lengths(pair):
    events = list(specviz.generate(pair, "def fibonacci(n):", proposer="adaptive", k=12,
                                   max_new_tokens=60))
    assert all(0 <= e.k <= 12 and e.k == len(e.draft_tokens) for e in events)
    assert [e.k for e in events[:2]] == [4, 4]  # two measuring rounds
    assert sum(len(e.new_tokens) for e in events) == 60


def test_hybrid_uses_the_ngram_on_repeats_and_the_draft_otherwise(pair, monkeypatch):

    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps"
    events = list(specviz.generate(pair, prompt, proposer="hybrid", k=8, max_new_tokens=30))
    assert events[0].source == "ngram" and events[0].draft_tokens  # a 4+ token repeat
    assert {e.source for e in events} == {"ngram", "draft"}
    # every round after the first, n-gram or draft, measured the target's verify line
    assert list(VerifyCost.of(pair.target).drafted) == [(e.k, e.target_seconds) for e in events[1:]]


def test_ngram_proposes_only_what_its_record_says_will_pay():
    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]  # the last token, 5, occurred once before
    fresh = NgramProposer(3)
    # priors: first token kept 1/2, later ones 4/5, R = 1 token per pass: bar 0.04;
    # 0.5 * 0.8^7 = 0.105 > 0.04, so all 8 followers are proposed
    assert fresh.proposal(ids, 8) == [1, 2, 3, 4, 6, 7, 8, 9]
    burnt = NgramProposer(3)
    burnt.first, burnt.tokens, burnt.cost = {1: [0.0, 10.0]}, 10.0, 10.0
    # 1-token matches were never kept: a_1 = 1/12; 1/12 * 0.8^j > 0.04 for j <= 3 only
    assert burnt.proposal(ids, 8) == [1, 2, 3, 4]
    # the target kept 1 and 2, then said 42 instead of 3
    burnt.proposal(ids + [1, 2, 42], 8)
    assert burnt.first[1] == [1.0, 11.0] and burnt.later == [1.0, 2.0]
    assert burnt.tokens == 13.0 and burnt.cost == 11.0 + 4 * VERIFY_SLOPE
    whole = NgramProposer(3)
    whole.first, whole.tokens, whole.cost = {1: [0.0, 10.0]}, 10.0, 10.0
    assert whole.proposal(ids, 8) == [1, 2, 3, 4]
    whole.proposal(ids + [1, 2, 3, 4, 6], 8)  # all 4 kept, then the target's own 6
    # 3 tokens followed a kept one and all 3 were kept; nothing was tried after the 4th
    assert whole.first[1] == [1.0, 11.0] and whole.later == [3.0, 3.0]
    refused = NgramProposer(3)
    assert refused.proposal(ids, 8) == [1, 2, 3, 4, 6, 7, 8, 9]
    refused.proposal(ids + [42], 8)  # the first token refused: a miss for n = 1, no later record
    assert refused.first == {1: [0.0, 1.0]} and refused.later == [0.0, 0.0]
    # where a verified token costs half a pass (this CPU), the bar is 2 / 2 * 0.5 = 0.5. A fresh
    # record's first token, 1/2 + sd sqrt(1/4 / 3) = 0.789, is tried; a second, 1/2 * 0.8, is not
    steep = NgramProposer(3, slope=0.5)
    assert steep.proposal(ids, 8) == [1]
    steep.proposal(ids + [1, 2], 8)  # kept: cost 1 + 0.5 * 1 pass for 2 tokens
    assert steep.tokens == 2.0 and steep.cost == 1.5
    # 0 of 4 one-token matches kept: 1/6 + sqrt(1/6 * 5/6 / 7) = 0.308 < 0.5, nothing proposed
    shy = NgramProposer(3, slope=0.5)
    shy.first = {1: [0.0, 4.0]}
    assert shy.proposal(ids, 8) == []
    shy.proposal(ids + [9], 8)  # the target went alone: a pass, one token, no record of n = 1
    assert (shy.tokens, shy.cost, shy.first) == (1.0, 1.0, {1: [0.0, 4.0]})
    # 2 of 4 kept: 1/2 + sqrt(1/4 / 7) = 0.689 > 0.5, tried
    shy.first = {1: [2.0, 4.0]}
    assert shy.proposal(ids, 8) == [1]


def test_ngram_proposals_pay_for_the_step_to_a_drafted_pass_as_a_whole():
    """float32 on oneDNN on an AVX2 CPU: a pass that verifies any draft costs 1.7 one-token
    passes (step 0.7), each drafted token 0.05 more. Tokens are proposed while each pays its own
    0.05, and the proposal stands only if what it is expected to keep pays for the step too; a
    round that proposes anything costs the step."""
    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]
    # fresh: R = 2 / 2 = 1; hope 1/2 + sqrt(1/4 / 3) = 0.789, then 0.5 * 0.8^j > 0.05 for every
    # j <= 8: all 8, expected 0.789 * (1 - 0.8^8) / 0.2 = 3.28 kept > 0.7 + 8 * 0.05 = 1.1
    flat = NgramProposer(3, slope=0.05, step=0.7)
    assert flat.proposal(ids, 8) == [1, 2, 3, 4, 6, 7, 8, 9]
    flat.proposal(ids + [1, 2, 42], 8)  # kept 1 and 2: 3 tokens for 1 + 0.7 + 8 * 0.05 passes
    assert flat.tokens == 3.0 and flat.cost == pytest.approx(2.1)
    # 2 of 4 one-token matches kept, one token to propose: hope 1/2 + sqrt(1/4 / 7) = 0.689
    # pays for the token (0.05) but not with the step (0.75): the target goes alone, one pass
    shy = NgramProposer(3, slope=0.05, step=0.7)
    shy.first = {1: [2.0, 4.0]}
    assert shy.proposal(ids, 1) == []
    shy.proposal(ids + [1], 1)
    assert (shy.tokens, shy.cost) == (1.0, 1.0)
    # with 8 to propose the same record pays: 0.689 * 4.16 = 2.87 > 1.1 (R = 3 / 3 = 1)
    shy.first = {1: [2.0, 4.0]}
    assert shy.proposal(ids, 8) == [1, 2, 3, 4, 6, 7, 8, 9]
    # 0 of 10 kept: a_1 = 1/12, hope 0.160; 1/12 * 0.8^j > 0.05 for j <= 2: three tokens,
    # expected 0.160 * 2.44 = 0.39 < 0.7 + 3 * 0.05: nothing; without a step, all three
    burnt = NgramProposer(3, slope=0.05, step=0.7)
    burnt.first = {1: [0.0, 10.0]}
    assert burnt.proposal(ids, 8) == []
    unstepped = NgramProposer(3, slope=0.05)
    unstepped.first = {1: [0.0, 10.0]}
    assert unstepped.proposal(ids, 8) == [1, 2, 3]


def test_ngram_keeps_copying_where_the_last_kept_copy_left_off():
    from specviz.proposers import NgramProposer

    ids = [7, 1, 2, 8, 7, 3, 4, 0, 7, 1]
    lookup = NgramProposer(3)
    assert lookup.lookup(ids, 4) == [2, 8, 7, 3]  # (7, 1) occurred at 0..1
    ids += [2, 8, 9]  # the target kept 2 and 8 (read from 2..3), then said 9
    assert lookup.lookup(ids, 4) == [] and lookup.pointer == 5  # the copy would read on at 5
    ids += [7]  # 7 occurred at 0, 4 and 8: the most recent is followed by 1, 2, 8, 9
    assert NgramProposer(3).match(ids, 4)[:2] == ([1, 2, 8, 9], 1)
    assert lookup.lookup(ids, 4) == [3, 4, 0, 7]  # the first one at or after the pointer
    # with nothing to match (9 never occurred before), the drafter reads on at the pointer
    drafter = NgramProposer(3)
    assert drafter.proposal(ids[:10], 4) == [2, 8, 7, 3]
    assert drafter.proposal(ids[:13], 4) == [3, 4, 0, 7] and drafter.first == {2: [1.0, 1.0]}


def brute_match(ids, k, max_ngram, pointer, min_ngram=1):
    """The n-gram rule read off its definition: for n = max_ngram..min_ngram, the earlier copies
    of the last n tokens; the first starting at or after the pointer, else the most recent."""
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        starts = [e + 1 for e in range(n - 1, len(ids) - 1) if ids[e - n + 1:e + 1] == ids[-n:]]
        after = [a for a in starts if pointer is not None and a >= pointer]
        if starts:
            at = after[0] if after else starts[-1]
            return ids[at:at + k], n, at
    return [], 0, -1


def test_ngram_match_is_its_definition_on_random_and_repetitive_contexts():
    """The index (n-gram -> end positions) gives what a scan of the context gives, as the context
    grows one token at a time and the copy pointer moves; a context of one repeated token too
    (it once cost a scan of every earlier position per n)."""
    import random

    from specviz.proposers import NgramProposer

    rng = random.Random(0)
    for trial in range(60):
        size, vocab = rng.randint(1, 8), rng.choice([2, 3, 5, 50])
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))] if trial else [1, 1, 1, 1]
        drafter = NgramProposer(size)
        for _ in range(40):
            drafter.pointer = rng.choice([None, rng.randrange(len(ids) + 2)])
            k, low = rng.randint(1, 6), rng.randint(1, size)
            assert drafter.match(ids, k, low) == brute_match(ids, k, size, drafter.pointer, low)
            ids = ids + ([1] if trial == 0 else [rng.randrange(vocab)])
