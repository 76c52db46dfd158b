"""Adaptive draft length: the stop rule's arithmetic, its learning, and its choices in a run."""

import types
from dataclasses import replace

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


def test_adaptive_keeps_a_rounds_capture_out_of_its_draft_and_run_times():
    """On a GPU a pass whose shape is new to a model compiles or captures it: 0.1-0.5 s, against
    about 2 ms a draft pass. Taken in C_D's running mean (weight 0.3), one such round stopped
    drafting for a dozen rounds. Such a round (the draft's own capture, or the target's, which the
    engine marks by pausing the verify line) still teaches the rule its drafts' fate."""
    lm = types.SimpleNamespace(first_uses=0)
    captures = []

    def propose(ids, k, params, generator):
        lm.first_uses += captures.pop(0)
        return Draft([1, 2], None, 2, 0.04, confidences=(0.9, 0.9))

    inner = types.SimpleNamespace(report_confidences=False, propose=propose, lm=lm)
    drafter = AdaptiveProposer(inner, VerifyCost())

    def round_(n, capture=0, draft_s=0.04):
        captures.append(capture)
        drafter.propose([1], 4, None, None)
        drafter.last = replace(drafter.last, seconds=draft_s)
        drafter.observe_round(measured_round(n, 2, 1, draft_s, 0.3))

    round_(1)  # the prefill's round
    round_(2, capture=1, draft_s=0.6)  # the draft captured its step: no rule priced by 0.3 s a pass
    assert drafter.captured and drafter.rule is None and drafter.draft_pass is None
    round_(3)
    rule = drafter.rule
    assert not drafter.captured and drafter.draft_pass == pytest.approx(0.02)
    assert (rule.tokens, rule.seconds) == (2, pytest.approx(0.34))
    predicted = rule.predicted
    round_(4, capture=2, draft_s=0.9)  # another shape: its fate counts, its time does not
    assert drafter.draft_pass == pytest.approx(0.02)
    assert (rule.tokens, rule.seconds) == (2, pytest.approx(0.34))
    assert rule.predicted == pytest.approx(predicted + 0.2)
    with drafter.cost.unobserved():  # the engine's mark: the target's verify pass captured
        round_(5)
    assert drafter.draft_pass == pytest.approx(0.02) and rule.tokens == 2
    round_(6, draft_s=0.06)
    assert drafter.draft_pass == pytest.approx(0.7 * 0.02 + 0.3 * 0.03) and rule.tokens == 4


def test_a_compiled_adaptive_run_marks_exactly_the_rounds_whose_draft_captured(compiled_pair, monkeypatch):
    from specviz import fastpath
    from specviz.engine import make_proposer

    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())  # fresh slots: every shape is new
    drafter = make_proposer(compiled_pair, "adaptive")
    uses, marks = drafter.lm.first_uses, []
    for _ in specviz.generate(compiled_pair, "def fibonacci(n):", proposer=drafter, k=3, max_new_tokens=12):
        marks.append((drafter.captured, drafter.lm.first_uses > uses))
        uses = drafter.lm.first_uses
    assert marks and all(captured == grew for captured, grew in marks)
    assert marks[0] == (True, True) and (False, False) in marks


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


def test_ngram_reading_on_at_the_pointer_reads_on_in_its_own_copy_past_the_contexts_end():
    """1 2 3 1 2: (1, 2) matched at 0, so the copy reads 3 1 2 and on in itself, 3. The target kept
    3 and 1 and said 9; 9 never occurred before, so the drafter reads on at the pointer, 5 (past
    the kept 2 and the target's 9): 3 1 9, which reaches the context's end, then on in itself as
    the output would copy it (its period 3): 3 1 9 3, not cut at the end to 3 1 9."""
    from specviz.proposers import NgramProposer

    drafter = NgramProposer(3)
    assert drafter.proposal([1, 2, 3, 1, 2], 4) == [3, 1, 2, 3]
    assert drafter.proposal([1, 2, 3, 1, 2, 3, 1, 9], 4) == [3, 1, 9, 3] and drafter.pointer == 5
    assert drafter.last[2:] == (0, 5)  # no n-gram matched: read on at the pointer


def brute_match(ids, k, max_ngram, pointer, min_ngram=1):
    """The n-gram rule read off its definition: for n = max_ngram..min_ngram, the earlier copies
    of the last n tokens; the first starting at or after the pointer, else the most recent. Its
    k tokens are what the output would be if it went on copying from there: past the end of ids
    the copy reads on in itself (ids = a b a b: "a b" again and again, not cut after one "a b")."""
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        starts = [e + 1 for e in range(n - 1, len(ids) - 1) if ids[e - n + 1:e + 1] == ids[-n:]]
        after = [a for a in starts if pointer is not None and a >= pointer]
        if starts:
            at = after[0] if after else starts[-1]
            written = list(ids)
            for j in range(k):
                written.append(written[at + j])
            return written[len(ids):], n, at
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


def test_kept_of_counts_the_proposal_the_committed_ids_repeat_before_the_targets_own():
    from specviz.proposers import kept_of

    assert kept_of([1, 2, 3], [1, 2, 3, 9]) == 3  # all kept, then the target's bonus
    assert kept_of([1, 2, 3], [1, 5]) == 1 and kept_of([1, 2, 3], [7]) == 0 and kept_of([], [4]) == 0
    # the output cut inside the proposal: the last committed id is still the target's own
    assert kept_of([1, 2, 3, 4], [1, 2]) == 1 and kept_of([1, 2], [1]) == 0


def test_ngram_records_an_output_cut_inside_its_proposal_as_kept_up_to_the_targets_own_token():
    """The round committed 1, 2 of the proposal 1..9 and the output stopped: 1 was kept, 2 is the
    target's own token. The record: a kept first token, one later token reached and not kept; the
    copy pointer past the kept 1 and the target's 2 (at 3, where the next 3-token match starts)."""
    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]
    cut = NgramProposer(3)
    assert cut.proposal(ids, 8) == [1, 2, 3, 4, 6, 7, 8, 9]  # n = 1, copied from 1
    # (5, 1, 2) matched at 0..2: a fresh n = 3 record; a_c = 4 / 6, R = 4 / (2 + 1.32): bar 0.048,
    # and 0.5 * (2/3)^j > 0.048 for j <= 5: six tokens
    assert cut.proposal(ids + [1, 2], 8) == [3, 4, 6, 7, 8, 9]
    assert cut.first == {1: [1.0, 1.0]} and cut.later == [0.0, 1.0] and cut.pointer == 3
    assert cut.tokens == 2.0 and cut.cost == pytest.approx(1 + 8 * VERIFY_SLOPE)


@pytest.mark.parametrize("temperature, top_k", [(0.0, 0), (0.5, 3)])
def test_a_drafts_confidence_is_its_processed_top_probability_and_feeds_the_stop(pair, temperature, top_k):
    """The adaptive rule calibrates the draft's confidence, its top probability under the run's
    sampling settings: at T > 0 the max of the processed q it samples from (not the raw softmax's,
    nor the drafted token's own q). The stop test sees each one as it is drafted and ends the draft."""
    import torch

    from specviz.proposers import ModelProposer
    from specviz.sampling import SamplingParams, process

    drafter, seen = ModelProposer(pair.draft, pair.vocab_size), []
    drafter.stop = lambda c: seen.append(c) or len(seen) == 3  # the third token ends it
    ids, params = pair.tokenizer("def fibonacci(n):")["input_ids"], SamplingParams(temperature, top_k)

    def drafted(seed):
        seen.clear()
        return drafter.propose(ids, 6, params, torch.Generator().manual_seed(seed))

    def off_favourite(d) -> bool:  # a token drawn whose own q is well below the top one's
        return bool((d.q[range(3), d.tokens] < d.q.max(-1).values - 0.1).any())

    # at T > 0, the first seed whose draws tell the top q from the drafted token's own
    draft = drafted(0) if not temperature else next(filter(off_favourite, map(drafted, range(100))))
    assert len(draft.tokens) == draft.passes == 3 and list(draft.confidences) == seen
    with torch.no_grad():  # the same three contexts, read by a plain forward
        logits = pair.draft(torch.tensor([ids + draft.tokens])).logits[0, len(ids) - 1:-1]  # [3, vocab]
    raw = logits.softmax(-1).max(-1).values.tolist()
    if not temperature:
        assert draft.q is None and seen == pytest.approx(raw, abs=1e-5)
        return
    assert draft.q.shape == (3, pair.vocab_size) and seen == draft.q.max(-1).values.tolist()
    assert seen == pytest.approx(process(logits, params).max(-1).values.tolist(), abs=1e-5)
    assert all(c > 10 * r for c, r in zip(seen, raw, strict=True))  # top-3 at T = 0.5: far sharper


def test_ngram_sizes_outside_1_to_16_are_refused():
    from specviz.proposers import NgramProposer

    assert NgramProposer(16).max_ngram == 16 and NgramProposer(1).max_ngram == 1
    for size in (0, 17):
        with pytest.raises(ValueError, match="ngram size must be in 1..16"):
            NgramProposer(size)


def test_ngram_learns_only_from_the_context_it_proposed_for_and_counts_every_token_committed_since():
    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]
    other = NgramProposer(3)
    assert other.proposal(ids, 8) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert other.proposal(ids[:-1] + [6, 42], 8) == []  # not that context grown: no outcome to learn
    assert (other.first, other.later, other.pointer) == ({}, [0.0, 0.0], None)
    assert (other.tokens, other.cost) == (0.0, 0.0)
    skipped = NgramProposer(3)
    skipped.proposal(ids, 8)
    skipped.proposal(ids + [42, 43, 44], 8)  # the first refused, then two more rounds it did not see
    assert skipped.first == {1: [0.0, 1.0]} and skipped.pointer is None  # nothing kept: no copy to follow
    assert skipped.tokens == 3.0 and skipped.cost == pytest.approx(1 + 8 * VERIFY_SLOPE)
    # an index built for one context is rebuilt for another, not extended past its length
    index = NgramProposer(3)
    assert index.match([1, 2, 3, 1], 4) == ([2, 3, 1, 2], 1, 1)
    assert index.match([4, 5, 4], 4) == ([5, 4, 5, 4], 1, 1)


def test_ngram_follows_a_match_after_the_copy_pointer_over_reading_on_at_it():
    """A match wins over reading on at the pointer: that is only for when nothing matches."""
    from specviz.proposers import NgramProposer

    ids = [7, 1, 2, 8, 7, 3, 4, 0, 7, 1, 2, 8, 9]
    drafter = NgramProposer(3)
    assert drafter.proposal(ids[:10], 4) == [2, 8, 7, 3]
    assert drafter.proposal(ids, 4) == [3, 4, 0, 7]  # 9 never occurred: read on at 5
    # 3, 4 kept, then 1: the pointer moves to 8; 1 occurred at 1 and 9, the first at or after 8 wins
    assert drafter.proposal(ids + [3, 4, 1], 4) == [2, 8, 9, 3] and drafter.pointer == 8
    assert drafter.first == {2: [1.0, 1.0], 0: [1.0, 1.0]} and drafter.later == [2.0, 4.0]


def test_the_stop_rule_stops_at_the_bar_and_its_acceptance_is_never_negative():
    rule = DraftLength(draft_pass=0.25, target_pass=0.0)
    rule.observe([], 0, tokens=2, seconds=1.0)  # R = 2: bar 2 * 0.25 = 0.5, exactly
    assert rule.stopper()(0.5) and not rule.stopper()(0.5 + 1e-9)  # s = 0.5 buys no more than it costs
    rule.rejected, rule.predicted = 6.0, 2.0  # rejections three times the raw confidences' forecast
    assert rule.acceptance(0.9) == pytest.approx(0.7) and rule.acceptance(0.5) == 0.0


def test_adaptive_drafts_at_most_four_until_it_has_a_rule_then_up_to_k_with_its_stop():
    asked = []

    def propose(ids, k, params, generator):
        asked.append((k, inner.stop))
        return Draft([1] * k, None, k, 0.0, "draft")

    inner = types.SimpleNamespace(report_confidences=False, propose=propose)
    drafter = AdaptiveProposer(inner, VerifyCost())
    assert inner.report_confidences  # it learns from the draft's confidences
    assert drafter.propose([1], 2, None, None).source == "adaptive" and drafter.last.tokens == [1, 1]
    drafter.propose([1], 12, None, None)
    assert asked == [(2, None), (4, None)]
    drafter.rule = DraftLength(0.03, 0.25)
    drafter.propose([1], 12, None, None)
    assert asked[-1][0] == 12 and callable(asked[-1][1])


def test_adaptive_learns_only_from_a_round_that_verified_its_own_latest_draft():
    """A round whose drafts are not the ones it proposed (another drafter's) still measures the
    target's verify line, but teaches the stop rule nothing; the rule's C_D follows the running mean."""
    drafter = AdaptiveProposer(types.SimpleNamespace(report_confidences=False), VerifyCost())
    for n, s in ((1, 9.0), (2, 0.04)):  # round 1 (it drafted it: its prefill), round 2 counts
        drafter.last = Draft([1, 2], None, 2, s, confidences=(0.9, 0.9))
        drafter.observe_round(measured_round(n, 2, 1, s, 0.3))
    rule = drafter.rule
    assert rule.tokens == 2 and rule.draft_pass == drafter.draft_pass == pytest.approx(0.02)
    drafter.last = Draft([5, 6], None, 2, 0.08, confidences=(0.9, 0.9))
    drafter.observe_round(measured_round(3, 2, 1, 0.08, 0.3))  # it verified drafts 1, 2, not 5, 6
    assert rule.tokens == 2 and drafter.draft_pass == pytest.approx(0.02) and len(drafter.cost.drafted) == 2
    drafter.last = Draft([1, 2], None, 2, 0.08, confidences=(0.9, 0.9))
    drafter.observe_round(measured_round(4, 2, 1, 0.08, 0.3))
    assert rule.tokens == 4
    assert rule.draft_pass == drafter.draft_pass == pytest.approx(0.7 * 0.02 + 0.3 * 0.04)


def test_hybrid_copies_only_a_repeat_of_4_or_more_tokens_and_lets_the_draft_catch_up_after():
    from specviz.proposers import HybridProposer, NgramProposer

    calls = []
    model = types.SimpleNamespace(
        inner=types.SimpleNamespace(name="draft"), lm="the draft's cache",
        forget=lambda: calls.append("forget"), observe_round=lambda event: calls.append(event),
        propose=lambda ids, k, params, generator: Draft([9] * k, None, k, source="adaptive"))
    hybrid = HybridProposer(model, NgramProposer(8))
    assert hybrid.lm == "the draft's cache"
    three = [1, 2, 3, 8, 1, 2, 3]  # its last 3 tokens repeat: too short a match
    assert hybrid.propose(three, 2, None, None) == Draft([9, 9], None, 2, source="draft") and calls == []
    four = [1, 2, 3, 4, 8, 1, 2, 3, 4]
    assert hybrid.propose(four, 2, None, None) == Draft([8, 1], None, source="ngram")
    assert calls == ["forget"]
    hybrid.observe_round("round")  # an n-gram round still measures the target's verify cost
    assert calls == ["forget", "round"]


def test_a_draft_that_cannot_read_an_id_of_the_context_drafts_nothing(pair):
    import torch

    from specviz.proposers import ModelProposer
    from specviz.sampling import SamplingParams

    drafter = ModelProposer(pair.draft, pair.vocab_size)
    drafter.readable = 100  # as if its embedding had rows for ids 0..99 only
    params, gen = SamplingParams(), torch.Generator()
    assert drafter.propose([5, 100, 7], 3, params, gen).tokens == []
    assert len(drafter.propose([5, 99, 7], 3, params, gen).tokens) == 3


def test_ngram_stops_at_a_token_that_only_breaks_even():
    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]
    # fresh: R = 1, bar = slope 0.4; the second token's P(kept) 0.5 * 0.8 = 0.4 buys what it costs
    even = NgramProposer(3, slope=0.4)
    assert even.proposal(ids, 8) == [1]


def test_ngram_tries_a_first_token_while_one_posterior_sd_up_clears_the_bar():
    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]
    # 0 of 1 kept: a_1 = 1/3, sd sqrt(1/3 * 2/3 / 4) = 0.236, hope 0.569: a bar of 0.56 is cleared,
    # one of 0.58 is not (R = 1, the bar is the slope)
    for slope, expected in ((0.56, [1]), (0.58, [])):
        lookup = NgramProposer(3, slope=slope)
        lookup.first = {1: [0.0, 1.0]}
        assert lookup.proposal(ids, 8) == expected, slope


def test_ngram_prices_every_proposed_token_and_the_step_at_the_runs_own_rate():
    import math

    from specviz.proposers import NgramProposer

    ids = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]
    # R counts the run with a prior of 2 tokens in 2 passes: 8 tokens in 2 passes, R = 10 / 4 = 2.5;
    # at a slope of 0.3 the bar is 0.75: a fresh first token (hope 0.789) pays, a second (0.4) not
    fast = NgramProposer(3, slope=0.3)
    fast.tokens, fast.cost = 8.0, 2.0
    assert fast.proposal(ids, 8) == [1]
    # 0 of 10 kept: three tokens pay their 0.05 each (see above), expected 0.39 kept; with a step of
    # 0.3 they cost 0.3 + 3 * 0.05 = 0.45: nothing
    burnt = NgramProposer(3, slope=0.05, step=0.3)
    burnt.first = {1: [0.0, 10.0]}
    assert burnt.proposal(ids, 8) == []
    # a proposal expected to keep exactly what it costs, step and token, is not made
    hope = 0.5 + math.sqrt(0.5 * 0.5 / 3)  # a fresh record's first token, one sd up
    even = NgramProposer(3, slope=0.5, step=hope - 0.5)
    assert even.proposal(ids, 1) == []
