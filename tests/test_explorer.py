"""The k explorer's recomputation equals real runs, round by round."""

import math

import pytest
import torch

import specviz
from specviz import explorer

PROMPT = "def fibonacci(n):\n    if n < 2:"


def real(pair, proposer, k, n=40):
    return specviz.RunStats.of(specviz.generate(pair, PROMPT, proposer=proposer, k=k, max_new_tokens=n))


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_replay_equals_real_runs_at_every_k(pair, proposer):
    pair.target.generation_config.eos_token_id = None
    try:
        ids = pair.encode(PROMPT)
        measured = real(pair, proposer, 4)
        assert any(e.k for e in measured.events)  # it drafted: the replay is no empty agreement
        rec = explorer.record(pair, ids, measured, proposer, max_new_tokens=40)
        assert rec.output == measured.tokens and len(rec.output_pieces) == 40
        for k in (1, 2, 3, 4, 5, 8):
            rep, run = explorer.replay(rec, k), real(pair, proposer, k)
            assert rep.target_passes == run.target_passes, k
            assert rep.draft_passes == (run.draft_passes if proposer == "draft" else 0), k
            assert [r.committed for r in rep.rounds] == [len(e.new_tokens) for e in run.events], k
            assert [r.accepted for r in rep.rounds] == [e.accepted for e in run.events], k
            assert [r.k for r in rep.rounds] == [e.k for e in run.events], k
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id


def test_ngram_replay_prices_tokens_at_the_slope_the_run_used(pair, monkeypatch):
    from specviz import verifycost

    for n in (0, 1, 9, 0, 1, 9, 0, 1, 9):  # 0.16 s alone, 0.2 + 0.1 n drafted: slope 0.625
        verifycost.VerifyCost.of(pair.target).observe(n, 0.16 if n == 0 else 0.2 + 0.1 * n)
    pair.target.generation_config.eos_token_id = None
    try:
        rec = explorer.record(pair, pair.encode(PROMPT), real(pair, "ngram", 8), "ngram", max_new_tokens=40)
        assert rec.ngram_slope == pytest.approx(0.625) and rec.lookup().slope == rec.ngram_slope
        assert rec.ngram_step == pytest.approx(0.25) and rec.lookup().step == rec.ngram_step
        assert rec.ngram_reads_on is True and rec.lookup().reads_on  # as the engine's drafter copies
        for k in (2, 8):
            rep, run = explorer.replay(rec, k), real(pair, "ngram", k)
            assert [(r.k, r.accepted) for r in rep.rounds] == [(e.k, e.accepted) for e in run.events], k
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id
    drafted = explorer.record(pair, pair.encode(PROMPT), real(pair, "draft", 2, 8), "draft", 8)
    assert drafted.ngram_slope is None and drafted.ngram_step is None and drafted.ngram_reads_on is None


def test_a_recording_replays_copies_as_its_runs_drafter_made_them(pair):
    """record() takes the n-gram run's prices from its drafter; whether its copies read on past the
    context's end is the drafter's too (a run of NgramProposer(reads_on=False) was recorded as
    reading on, and its replay at its own k missed it: 9 passes against the run's 17)."""
    from specviz.engine import ngram_price
    from specviz.proposers import NgramProposer

    prompt, passes = [139, 387], {}  # the tiny target writes one token 8 times, then another on and on
    for reads_on in (False, True):
        drafter = NgramProposer(3, *ngram_price(pair), reads_on=reads_on)
        run = specviz.RunStats.of(specviz.generate(pair, prompt, proposer=drafter, k=4, max_new_tokens=30))
        rec = explorer.record(pair, prompt, run, "ngram", 30, ngram_slope=drafter.slope,
                              ngram_step=drafter.step, ngram_reads_on=drafter.reads_on)
        assert rec.ngram_reads_on is reads_on and rec.lookup().reads_on is reads_on
        assert list(rec.committed(4)) == [len(e.new_tokens) for e in run.events], reads_on
        passes[reads_on] = run.target_passes
    assert passes[False] > passes[True]  # the two rules drafted differently here
    assert explorer.record(pair, prompt, run, "ngram", 30).ngram_reads_on is True  # the engine's rule


def test_recorded_pass_costs_leave_out_round_ones_prefills(pair):
    import dataclasses

    measured = real(pair, "draft", 3)
    timed = [dataclasses.replace(e, draft_seconds=5.0 if e.round == 1 else 0.03 * e.k,
                                 target_seconds=9.0 if e.round == 1 else 0.2) for e in measured.events]
    rec = explorer.record(pair, pair.encode(PROMPT), specviz.RunStats.of(timed), "draft", max_new_tokens=40)
    assert rec.draft_pass_seconds == pytest.approx(0.03) and rec.target_pass_seconds == pytest.approx(0.2)


def test_replay_spans_show_every_output_token_once(pair):
    measured = real(pair, "draft", 3)
    rec = explorer.record(pair, pair.encode(PROMPT), measured, "draft", max_new_tokens=40)
    for k in (1, 6):
        spans = explorer.spans(explorer.replay(rec, k))
        assert [s.token for s in spans if s.emitted] == rec.output
        assert "".join(s.text for s in spans if s.emitted) == "".join(rec.output_pieces)


def test_adaptive_replay_covers_the_output(pair):
    rec = explorer.record(pair, pair.encode(PROMPT), real(pair, "draft", 4), "draft", max_new_tokens=40)
    rep = explorer.replay_adaptive(rec)
    assert sum(r.committed for r in rep.rounds) == len(rec.output)
    assert all(0 <= r.k <= 16 for r in rep.rounds) and rep.predicted_seconds > 0


def test_only_greedy_draft_or_ngram_runs_are_recorded(pair):
    with pytest.raises(ValueError, match="replays 'draft' or 'ngram'"):
        explorer.record(pair, [1, 2], real(pair, "none", 1, 5), "none", 5)


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_a_run_of_no_tokens_is_refused_not_recorded_with_the_prompts_guesses(pair, proposer):
    with pytest.raises(ValueError, match="the run made no tokens"):  # draft: 3 guesses, one a prompt token
        explorer.record(pair, [1, 2, 3], specviz.RunStats.of([]), proposer, 5)


def test_adaptive_replay_follows_the_live_drafters_schedule(pair, monkeypatch):
    """With the target as its own draft (every draft kept, confidences as recorded) and a clock
    that charges each pass its modelled cost, the replay makes the live run's rounds exactly:
    two measuring rounds of min(4, k), round 1 not learnt from, never more than the run's k."""
    import copy
    import dataclasses
    import time

    from specviz.lm import CachedLM
    from specviz.loading import Pair
    from specviz.verifycost import VERIFY_SLOPE

    same = Pair(pair.target, pair.tokenizer, copy.deepcopy(pair.target), "t", "t")
    c_d, c_t, clock = 0.02, 0.2, [0.0]
    logits = CachedLM._logits

    def charged(self, input_ids, *args, **kwargs):  # inside the passes' own timing
        width = input_ids.shape[-1]
        clock[0] += c_d if self.model is same.draft else c_t * (1 + VERIFY_SLOPE * (width - 1))
        return logits(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(CachedLM, "_logits", charged)
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    # the live drafter prices tokens by the target's verify line, kept per target across runs:
    # start it afresh (other tests measured this target's real times)
    pair.target.generation_config.eos_token_id = None
    try:
        for k in (3, 6):
            events = list(specviz.generate(same, PROMPT, proposer="adaptive", k=k, max_new_tokens=40))
            live = specviz.RunStats.of(events)
            rec = explorer.record(same, same.encode(PROMPT), live, "draft", max_new_tokens=40)
            rec = dataclasses.replace(rec, draft_pass_seconds=c_d, target_pass_seconds=c_t)
            rep = explorer.replay_adaptive(rec, k)
            assert [r.k for r in rep.rounds] == [e.k for e in events], k
            assert [e.k for e in events[:2]] == [min(4, k)] * 2 and max(e.k for e in events) <= k
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id


def test_adaptive_replay_prices_a_draft_by_the_runs_verify_line():
    """Where a verified token costs two thirds of a one-token pass, the replayed rule drafts
    one token where a flat pass cost would let it draft thirteen (a hand computation)."""
    import dataclasses

    output = list(range(100, 130))
    rec = explorer.Recording("draft", [1, 2, 3], output, guesses=list(output), draft_pass_seconds=0.01,
                             target_pass_seconds=0.2, max_new_tokens=30, confidences=[0.9] * 30,
                             verify_line=(0.05, 0.1))
    # rounds 1 and 2 draft 4 (all kept: 5 tokens each); round 2 teaches the rule: lam =
    # 2 / (2 + 4 * 0.1), a(0.9) = 0.9167; C_T = c0 + c1 = 0.15, slope = 0.1 / 0.15; the round
    # took 4 * 0.01 + 0.15 + 0.1 * 4 = 0.59 s, R = 5 / 0.59; bar = R * (0.01 + 0.1) = 0.932 >= a
    assert [r.k for r in explorer.replay_adaptive(rec, 16).rounds[:3]] == [4, 4, 1]
    # an older trace (no line): C_T = 0.2 and the 4% prior: the round took 0.04 + 0.2 * 1.16 s,
    # bar = 5 / 0.272 * (0.01 + 0.008) = 0.331, and 0.9167^j first falls below it at j = 13
    flat = dataclasses.replace(rec, verify_line=None)
    assert [r.k for r in explorer.replay_adaptive(flat, 16).rounds[:3]] == [4, 4, 13]


def test_an_adaptive_replay_is_priced_at_the_live_runs_padded_width_on_a_compiled_path():
    """The live adaptive run (k = k_max) pads every verify to k_max + 1 on a compiled path; the
    replay was priced at its widest draft + 1 (4 + 1 here, not 16 + 1)."""
    from specviz import profiles

    output = list(range(100, 110))
    rec = explorer.Recording("draft", [1, 2, 3], output, guesses=list(output), draft_pass_seconds=0.01,
                             target_pass_seconds=0.2, max_new_tokens=10, confidences=[0.5] * 10,
                             verify_line=(0.2, 0.0))
    rep = explorer.replay_adaptive(rec, 16)
    assert [r.k for r in rep.rounds] == [4, 4] and rep.k_max == 16  # 5 + 5 tokens
    passes = profiles.passes_of(rep)
    assert passes == profiles.Passes(8, {5: 2}, k=16)
    assert [profiles.fed(w, passes, compiled=True) for w in (5, 1)] == [17, 1]


def test_adaptive_replay_of_a_run_that_ended_at_eos_drafts_only_what_was_recorded():
    """A run that stopped at EOS after 20 of its 64 tokens holds 20 confidences; confident ones
    let the rule draft on past them, where the replay has nothing to read: it stops there."""
    output = list(range(100, 120))
    rec = explorer.Recording("draft", [1, 2, 3], output, guesses=list(output), draft_pass_seconds=0.01,
                             target_pass_seconds=0.2, max_new_tokens=64, confidences=[0.99] * 20,
                             verify_line=(0.2, 0.0))
    rep = explorer.replay_adaptive(rec, 16)
    # rounds 1 and 2 draft 4 (5 tokens each); round 3's rule (bar R * C_D = 5 / 0.24 * 0.01 =
    # 0.21, each 0.99 draft kept at about 0.99) would draft all 16 it may: the 10 recorded
    assert [r.k for r in rep.rounds] == [4, 4, 10] and all(r.accepted == r.k for r in rep.rounds)
    assert sum(r.committed for r in rep.rounds) == 20


def test_a_draft_round_past_an_eos_drafts_and_pays_for_all_the_budget_allows():
    """The draft model drafts min(k, budget) past a run's EOS too (ModelProposer drafts all k),
    where the recording's guesses stop: those drafts are counted and paid for, commit nothing."""
    from specviz.labview import explorer_views

    output = [5, 6, 7, 8, 9, 0]  # the run stopped at EOS (0) after 6 of its 64 tokens
    rec = explorer.Recording("draft", [1, 2], output, list(output), draft_pass_seconds=0.001,
                             target_pass_seconds=0.01, max_new_tokens=64)
    rep = explorer.replay(rec, 4)
    # round 1 drafts min(4, 63) = 4, keeps all 4 and the bonus: 5 tokens; round 2 drafts
    # min(4, 58) = 4, of which only the first (the EOS, kept) is recorded: it commits 1
    assert rep.rounds == (explorer.Round(0, 4, 4, None, 5), explorer.Round(5, 4, 1, None, 1))
    assert rep.draft_passes == 8 and [r.k + 1 for r in rep.rounds] == [5, 5]
    assert rep.predicted_seconds == pytest.approx(8 * 0.001 + 2 * 0.01)  # 0.028 s
    numbers = explorer_views(rec, 4, False, 4, [5, 1])[1]
    assert "2 target passes, 8 draft passes, 3.00 tokens per pass" in numbers
    assert "predicted 0.028 s" in numbers
    assert "Measured run (k=4): 2 target passes; the recomputation matches it round by round" in numbers
    # the same passes in another order are another run: the check compares round by round
    assert "does NOT match it" in explorer_views(rec, 4, False, 4, [1, 5])[1]
    # no profile: the dashed curve is the output's tokens over each k's predicted seconds
    fig = explorer_views(rec, 4, False, 4, [5, 1])[2]
    # the solid curve, by hand: every guess is the output, so k = 1 keeps 1 and the bonus a round
    # (6 tokens in 3 passes); k = 2 to 4 take 2 passes (k = 3: 5 6 7 8, then 9 and the EOS, kept,
    # which ends it); from k = 5 one pass drafts the five tokens before the EOS, the bonus is the EOS
    assert list(fig.data[0].x) == list(range(1, 17))
    assert list(fig.data[0].y) == [2.0, 3.0, 3.0, 3.0] + [6.0] * 12
    assert list(fig.data[1].y) == pytest.approx([len(output) / r.predicted_seconds for r in rec.curve])
    assert fig.data[1].y[3] == pytest.approx(6 / 0.028)  # k = 4, as above
    spans = explorer.spans(rep)  # the unrecorded drafts are not shown: every output token once
    assert [(s.token, s.fate) for s in spans] == [(t, "accepted") for t in output[:4]] + [
        (9, "bonus"), (0, "accepted")]


def test_an_n_gram_draft_past_the_outputs_end_is_not_shown_as_refused():
    """The lookup copies the context, EOS ids included: a draft after the output's last token
    (its EOS) was never judged against a recorded token, so its fate is unknown, not refused."""
    rec = explorer.Recording("ngram", [1, 2, 3, 4, 1, 2, 3], [4], [4], draft_pass_seconds=0.0,
                             target_pass_seconds=0.01, max_new_tokens=10)
    rep = explorer.replay(rec, 3)  # the lookup proposes 4, 1, 2 after "1 2 3"; the run ended at 4
    assert rep.rounds == (explorer.Round(0, 3, 1, None, 1),)
    assert [(s.token, s.fate) for s in explorer.spans(rep)] == [(4, "accepted")]


def test_replay_of_a_run_that_ended_at_eos_makes_the_engines_draft_passes_and_widths(pair):
    """On the tiny pair, with an output token that first appears late made the EOS, the replay
    at the run's own k drafts past the end exactly as the engine did (ks, passes, commits)."""
    import dataclasses

    ids = pair.encode(PROMPT)
    out = real(pair, "draft", 4).tokens
    eos = next(t for i, t in enumerate(out) if i >= 25 and t not in out[:i])
    ending = dataclasses.replace(pair)
    ending.__dict__["eos_ids"] = frozenset({eos})  # the cached property, set as it sets itself
    for k in (4, 8):
        run = specviz.RunStats.of(specviz.generate(ending, PROMPT, proposer="draft", k=k, max_new_tokens=40))
        assert run.stop == "eos" and run.tokens[-1] == eos and len(run.tokens) < 40
        rec = explorer.record(ending, ids, run, "draft", max_new_tokens=40)
        rep = explorer.replay(rec, k)
        assert sum(max(0, e.position + e.k - len(run.tokens)) for e in run.events) > 0, k  # past the end
        assert [r.k for r in rep.rounds] == [e.k for e in run.events], k
        assert rep.draft_passes == run.draft_passes, k
        assert [r.committed for r in rep.rounds] == [len(e.new_tokens) for e in run.events], k
        # drafts kept within the output (the engine's may run on past the EOS, committing nothing)
        assert [r.accepted for r in rep.rounds] == [min(e.accepted, len(e.new_tokens)) for e in run.events]


def test_the_recording_prices_each_round_at_the_width_it_verifies(pair):
    import dataclasses

    from specviz.labview import cost_text

    ids = pair.encode(PROMPT)
    measured = real(pair, "draft", 4, n=24)
    # a target pass feeding x tokens costs 0.1 + 0.05 x (round 1 feeds the prompt and its drafts)
    events = [dataclasses.replace(e, target_seconds=0.1 + 0.05 * ((len(ids) if e.round == 1 else 1) + e.k))
              for e in measured.events]
    assert explorer.verify_line(events, len(ids)) == pytest.approx((0.1, 0.05))
    assert explorer.verify_line(events[1:2] * 3, len(ids)) is None  # one width: nothing to fit
    rec = explorer.record(pair, ids, specviz.RunStats.of(events), "draft", max_new_tokens=24)
    assert rec.verify_line == pytest.approx((0.1, 0.05))
    for k in (1, 3, 8):
        rep = explorer.replay(rec, k)
        by_hand = rep.draft_passes * rec.draft_pass_seconds + sum(0.1 + 0.05 * (1 + r.k) for r in rep.rounds)
        assert rep.predicted_seconds == pytest.approx(by_hand), k
    flat = dataclasses.replace(rec, verify_line=None)  # an older trace: the mean per pass
    rep = explorer.replay(flat, 3)
    assert rep.predicted_seconds == pytest.approx(rep.draft_passes * rec.draft_pass_seconds
                                                  + rep.target_passes * rec.target_pass_seconds)
    assert "costs 150 + 50·k ms, fitted to this run" in cost_text(rec)
    assert "whatever it verifies" in cost_text(flat)


def test_on_captured_cuda_steps_the_verify_line_leaves_out_round_1s_eager_prompt_read(pair, monkeypatch):
    """On CUDA with captured steps (compiled or graphed) round 1 reads the prompt eagerly, about 5x
    a captured pass: the H200's fast C_T(5) is 3.50 ms and an eager round 1 over 25 + 4 tokens
    18.6 ms. A line through it read (18.6 - 3.5) / (29 - 5) = 0.629 ms a verified token, where the
    path's own passes cost 2.99 ms at 1 token and 3.64 ms at 17: the fastest k read 1, not 4. Left
    out, a fixed-k run has one width, and its rounds are priced at their mean."""
    import dataclasses
    from types import SimpleNamespace

    ids = pair.encode(PROMPT)
    measured = real(pair, "draft", 4, n=24)
    events = [dataclasses.replace(e, k=4, target_seconds=0.0186 if e.round == 1 else 0.0035)
              for e in measured.events]  # every round at k = 4 (the run's last may draft fewer)
    assert explorer.verify_line(events, 25) == pytest.approx((0.0035 - 5 * 0.0151 / 24, 0.0151 / 24))
    assert explorer.verify_line(events, 25, prefill_on_line=False) is None
    wide = [dataclasses.replace(e, k=[4, 2, 8][i % 3], target_seconds=0.003 + 0.0001 * [5, 3, 9][i % 3])
            for i, e in enumerate(events[1:])]  # a varying k: its later rounds still give a line
    assert explorer.verify_line(events[:1] + wide, 25, prefill_on_line=False) \
        == pytest.approx((0.003, 0.0001))
    seen = []
    monkeypatch.setattr(explorer, "resolve_fast", lambda mode, model: seen.append(mode) or
                        {"eager": ("dynamic", None), "static": ("static", None),
                         "compiled": ("static", "compiled"), "graphed": ("static", "graphs")}[mode])
    for fast, device, on_line in [("compiled", "cuda", False), ("graphed", "cuda", False),
                                  ("static", "cuda", True), ("eager", "cuda", True),
                                  ("compiled", "cpu", True)]:
        on = SimpleNamespace(fast=fast, target=None, device=torch.device(device))
        assert explorer.prefill_on_line(on) is on_line, (fast, device)
    lined = [dataclasses.replace(e, target_seconds=0.1 + 0.05 * ((len(ids) if e.round == 1 else 1) + e.k))
             for e in events]
    rec = explorer.record(dataclasses.replace(pair, fast="eager"), ids, specviz.RunStats.of(lined), "draft",
                          max_new_tokens=24)
    assert rec.verify_line == pytest.approx((0.1, 0.05)) and seen[-1] == "eager"  # the pair's path decides
    # on captured CUDA steps a fixed-k run's rounds after round 1 differ only where the length cut
    # the last ones short: no line through those (their noise read as a cost a token)
    monkeypatch.setattr(explorer, "prefill_on_line", lambda pair: False)
    cut = lined[:-1] + [dataclasses.replace(lined[-1], k=1, target_seconds=0.33)]  # 0.35 at k = 4
    assert explorer.verify_line(cut, len(ids), prefill_on_line=False) is not None  # what it would fit
    rec = explorer.record(pair, ids, specviz.RunStats.of(cut), "draft", max_new_tokens=24)
    assert rec.verify_line is None


def test_the_explorer_computes_a_recordings_curve_once_and_keeps_only_its_totals(pair, monkeypatch):
    """The curve (k = 1..16) depends on the recording only; recomputing it on every slider move
    cost up to 2 s a call on the largest n-gram recordings the trace checks allow. Keeping the
    16 replays' rounds took ~100x the trace's size in memory (15 MiB for a 133 KB trace): the
    curve keeps each replay's totals, and a slider move replays its own k (and the measured k)."""
    from specviz import labview, profiles

    ids = pair.encode(PROMPT)
    rec = explorer.record(pair, ids, real(pair, "ngram", 4, n=24), "ngram", max_new_tokens=24)
    fresh = [explorer.replay(rec, k) for k in explorer.CURVE_KS]  # computed before any cache
    calls = []
    real_replay = explorer.replay
    monkeypatch.setattr(explorer, "replay", lambda r, k: calls.append(k) or real_replay(r, k))
    first = labview.explorer_views(rec, 4, False, 4, [r.committed for r in fresh[3].rounds])
    assert sorted(calls) == sorted([*explorer.CURVE_KS, 4, 4])  # the curve; k = 4; the check's k
    again = [labview.explorer_views(rec, k, False, 4, [r.committed for r in fresh[3].rounds])
             for k in (4, 7, 16)]
    assert calls[18:] == [4, 7, 16]  # no curve again, nor the check: a replay of the k shown
    assert again[0][:2] == first[:2] and "matches it round by round" in first[1]
    fig = again[1][2]  # k = 7 shown: marked on the curve, and both axes from 0
    assert [(shape.x0, shape.x1) for shape in fig.layout.shapes] == [(7, 7)]
    assert fig.layout.yaxis.rangemode == fig.layout.yaxis2.rangemode == "tozero"
    for point, rep in zip(rec.curve, fresh, strict=True):
        assert not hasattr(point, "rounds")
        assert (point.k, point.target_passes, point.draft_passes, point.tokens_per_pass,
                point.predicted_seconds) == (rep.k, rep.target_passes, rep.draft_passes,
                                             rep.tokens_per_pass, rep.predicted_seconds)
        assert profiles.passes_of(point) == profiles.passes_of(rep)  # priced alike on a profile
    assert explorer.replay(rec, 7) == fresh[6] and explorer.replay(rec, 20) == real_replay(rec, 20)


def test_the_explorer_states_gpu_and_cpu_pass_costs_to_three_significant_digits():
    """At GPU scale whole milliseconds read C_D=1 ms and 9 + 0.0·k ms, seconds 0.01 s."""
    import dataclasses

    from specviz.digits import sig3
    from specviz.labview import cost_text, explorer_views

    rec = explorer.Recording("draft", [1, 2], [3, 4], [3, 4], 0.0014, 0.0092, 8,
                             verify_line=(0.00916, 0.00004))
    # a pass verifying k drafts feeds 1 + k tokens: 9.16 + 0.04 * (1 + k) = 9.2 + 0.04 k ms
    assert cost_text(rec) == ("C_D=1.4 ms; a target pass verifying k drafts costs 9.2 + 0.04·k ms, "
                              "fitted to this run's target passes")
    assert cost_text(dataclasses.replace(rec, verify_line=None)) == (
        "C_D=1.4 ms, C_T=9.2 ms per target pass, whatever it verifies")
    cpu = dataclasses.replace(rec, draft_pass_seconds=0.0153, verify_line=(0.1234, 0.0456))
    assert "C_D=15.3 ms; a target pass verifying k drafts costs 169 + 45.6·k ms" in cost_text(cpu)
    ngram = dataclasses.replace(cpu, proposer="ngram", draft_pass_seconds=0.0)  # it read "C_D=0 ms"
    assert cost_text(ngram).startswith("no draft pass (the n-gram drafter looks its drafts up); a target "
                                       "pass verifying k drafts costs 169 + 45.6·k ms")
    assert cost_text(dataclasses.replace(ngram, verify_line=None)).startswith(
        "no draft pass (the n-gram drafter looks its drafts up), C_T=")
    # k = 2: one round drafts both tokens, keeps both: 2 * 1.4 + 9.2 + 2 * 0.04 = 12.08 ms
    assert "predicted 0.0121 s" in explorer_views(rec, 2, False, None, None)[1]
    assert [sig3(x) for x in (1234.6, 99.996, 0.5, 0)] == ["1,235", "100", "0.5", "0"]


def test_the_recording_replays_the_runs_own_drafts_so_its_own_k_is_the_run(pair, monkeypatch):
    """In bfloat16 the recording's one draft pass over the whole output could round a near-tie
    apart from the run's one-token steps: on the embedded pair the replay at the run's own k made
    12 passes where the run made 11. Where the run drafted (given the true prefix), its own drafts
    are replayed; the teacher-forced pass fills only the positions it never drafted."""
    pair.target.generation_config.eos_token_id = None
    try:
        measured = real(pair, "draft", 4)
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id
    kept = next(e for e in measured.events if e.accepted)  # its first draft was kept
    at, token = kept.position, kept.draft_tokens[0]
    other = (token + 1) % pair.vocab_size
    forward = pair.draft.forward

    def near_tie(*args, **kwargs):  # the whole-output pass rounds position `at` to another token
        out = forward(*args, **kwargs)
        out.logits[0, at, other] = out.logits[0, at].max() + 1
        return out

    monkeypatch.setattr(pair.draft, "forward", near_tie)
    rec = explorer.record(pair, pair.encode(PROMPT), measured, "draft", max_new_tokens=40)
    assert rec.guesses[at] == token  # the run's own draft, not the pass's `other`
    assert list(rec.committed(4)) == [len(e.new_tokens) for e in measured.events]
    bonus = [e.position + e.k for e in measured.events if e.accepted == e.k]  # drafted by no round
    assert set(explorer.run_drafts(measured.events)) == set(range(40)) - set(bonus) and bonus


def test_the_explorer_shows_a_round_in_the_run_tabs_order(pair):
    """Kept drafts, the target's token, then the refused draft: the explorer showed the refused
    draft first, the Run tab after the token that replaced it."""
    from specviz.render import REJECTED, all_spans

    measured = real(pair, "draft", 4)
    ids = pair.encode(PROMPT)
    rec = explorer.record(pair, ids, measured, "draft", max_new_tokens=40)

    def rounds(spans):  # per round: (fate, token) in order, only the first refused draft
        out = {}
        for s in spans:
            shown = out.setdefault(s.round, [])
            if s.fate != REJECTED or all(f != REJECTED for f, _ in shown):
                shown.append((s.fate, s.token))
        return out

    assert any(e.accepted < e.k for e in measured.events)
    run = all_spans(measured.events, pair.tokenizer, ids)
    assert rounds(explorer.spans(explorer.replay(rec, 4))) == rounds(run)


def test_a_replay_needs_a_k_a_run_could_have():
    """k = -1 sliced the guesses from the end: rounds that drafted two tokens at k = -1, and -2
    draft passes."""
    rec = explorer.Recording("draft", [1, 2], [5, 6, 7, 8], [5, 6, 9, 8], 0.01, 0.1, 4)
    for k in (-1, 0, 33, 2.0):
        with pytest.raises(ValueError, match="k must be in 1..32"):
            explorer.replay(rec, k)
    assert explorer.replay(rec, 2).draft_passes >= 1


def test_replay_spans_by_hand_refused_drafts_recovered_tokens_and_a_round_with_no_room_to_draft():
    """Output 5 6 7 8 with drafts 5 9 9 8 (given the true prefix), at k = 3 of a 4-token budget:
    round 1 drafts 3 and keeps 5 (6 replaces the refused 9), round 2 may draft 1 (9, refused: 7),
    round 3 has no room to draft (the budget's last token): the target's own 8."""
    import dataclasses

    from specviz.render import ACCEPTED, RECOVERED, REJECTED, TARGET

    rec = explorer.Recording("draft", [1, 2], [5, 6, 7, 8], [5, 9, 9, 8], 0.01, 0.1, 4,
                             output_pieces=("a", "b", "c", "d"), guess_pieces=("a", "X", "Y", "d"))
    rep = explorer.replay(rec, 3)
    assert rep.rounds == (explorer.Round(0, 3, 1, 9, 2), explorer.Round(2, 1, 0, 9, 1),
                          explorer.Round(3, 0, 0, None, 1))
    assert [(s.text, s.fate, s.token, s.round, s.position) for s in explorer.spans(rep)] == [
        ("a", ACCEPTED, 5, 1, 1), ("b", RECOVERED, 6, 1, 0), ("X", REJECTED, 9, 1, 2),
        ("c", RECOVERED, 7, 2, 0), ("Y", REJECTED, 9, 2, 1), ("d", TARGET, 8, 3, 0)]
    # an older trace without display pieces: token ids, a refused token's text where known
    bare = dataclasses.replace(rec, output_pieces=(), guess_pieces=(), token_text={"9": "nine"})
    assert [s.text for s in explorer.spans(explorer.replay(bare, 3))] == ["5", "6", "nine", "7", "nine", "8"]
    unknown = dataclasses.replace(bare, token_text=None)
    assert [s.text for s in explorer.spans(explorer.replay(unknown, 3)) if s.fate == REJECTED] == ["⟨9⟩"] * 2


def test_the_committed_tokens_kept_per_k_are_each_ks_own():
    """Recording.committed keeps a few k's rounds: asked for one k after another (more than it
    keeps, and back again), each answer is that k's replay."""
    output = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    rec = explorer.Recording("draft", [1], output, [10, 11, 99, 13, 14, 15, 99, 17, 18, 19, 20, 99],
                             0.01, 0.1, 12)
    for k in (1, 2, 3, 4, 5, 6, 2, 1, 6):
        assert rec.committed(k) == tuple(r.committed for r in explorer.replay(rec, k).rounds), k
    assert rec.committed(1) != rec.committed(6)


def test_the_adaptive_replay_needs_a_draft_recording_with_every_confidence_and_a_k_a_run_could_have():
    import dataclasses

    output = [5, 6, 7, 8]
    rec = explorer.Recording("draft", [1, 2], output, list(output), 0.01, 0.1, 4, confidences=[0.9] * 4)
    assert rec.replays_adaptive and explorer.replay_adaptive(rec, 1).rounds
    for other in (dataclasses.replace(rec, confidences=[0.9] * 3), dataclasses.replace(rec, confidences=()),
                  dataclasses.replace(rec, proposer="ngram")):
        assert not other.replays_adaptive
        with pytest.raises(ValueError, match="replays draft-model recordings with confidences"):
            explorer.replay_adaptive(other)
    for k in (0, 33):
        with pytest.raises(ValueError, match="k must be in 1..32"):
            explorer.replay_adaptive(rec, k)
    assert max(r.k for r in explorer.replay_adaptive(rec, 32).rounds) == 3  # the budget: 4 tokens


def test_a_run_with_a_token_the_draft_cannot_read_is_refused_by_name(pair):
    """The draft reads ids below its embedding's rows: an output holding the first id past them
    is a ValueError that says so, not an index error inside the draft's pass."""
    import types

    from specviz.arch import input_rows

    rows = input_rows(pair.draft)
    stats = types.SimpleNamespace(tokens=[5, rows], events=(), draft_pass_seconds=0.0,
                                  target_pass_seconds=0.1)
    with pytest.raises(ValueError, match="the draft cannot read every token of this run"):
        explorer.record(pair, [1, 2], stats, "draft", max_new_tokens=4)



def test_a_prompt_with_a_token_the_draft_cannot_read_is_refused_by_name_too(pair):
    """The draft's pass reads the prompt as well as the output: the first id past its rows in the
    prompt, with an output it can read, is the same ValueError, not an index error in the pass."""
    import types

    from specviz.arch import input_rows

    rows = input_rows(pair.draft)
    stats = types.SimpleNamespace(tokens=[5, 6], events=(), draft_pass_seconds=0.0,
                                  target_pass_seconds=0.1)
    with pytest.raises(ValueError, match="the draft cannot read every token of this run"):
        explorer.record(pair, [1, rows], stats, "draft", max_new_tokens=4)


def test_an_ngram_recording_keeps_the_runs_prices_and_the_text_of_every_token_it_could_propose(pair):
    """The lookup copies the prompt as well as the output: a refused proposal shows its text, so the
    recording holds the text of every prompt and output token. The prices the run drafted with,
    given, are the recording's (the target's line may since have moved)."""
    ids = pair.encode(PROMPT)
    rec = explorer.record(pair, ids, real(pair, "ngram", 4, n=12), "ngram", max_new_tokens=12,
                          ngram_slope=0.3, ngram_step=0.125)
    assert set(rec.token_text) == {str(t) for t in ids + rec.output}
    assert all(rec.token_text[str(t)] == pair.tokenizer.decode([t]) for t in ids)
    assert (rec.ngram_slope, rec.ngram_step) == (0.3, 0.125)
    assert (rec.lookup().slope, rec.lookup().step) == (0.3, 0.125)


def test_the_runs_drafts_are_its_kept_ones_and_the_first_refused():
    """Given the true prefix a round's drafts hold up to its first refused one (the rest followed
    that wrong token); a round with no room to draft adds none, and a hybrid run's n-gram
    rounds are not the draft model's."""
    import types

    def event(position, drafts, accepted, source="draft"):
        return types.SimpleNamespace(position=position, draft_tokens=drafts, accepted=accepted, source=source)

    events = [event(0, [5, 9, 8], 1), event(2, [], 0), event(3, [4, 4], 2, "ngram"), event(6, [7], 0)]
    assert explorer.run_drafts(events) == {0: 5, 1: 9, 6: 7}


def test_a_padded_drafts_guesses_and_confidences_are_over_the_vocabulary(model_dirs, monkeypatch):
    """A draft whose output rows run 16 past the tokenizer (embedding padding) is read over the
    vocabulary only: where its padding would win, the recorded guess and confidence are the best
    real token's, at the positions the run never drafted (after a round that kept every draft)."""
    pair = specviz.load_pair(str(model_dirs["target"]), str(model_dirs["padded-draft"]), device="cpu",
                             dtype="float32")
    measured = real(pair, "draft", 4, n=24)
    undrafted = sorted(set(range(24)) - set(explorer.run_drafts(measured.events)))
    assert undrafted
    forward, seen = pair.draft.forward, []

    def padding_wins(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append(out.logits[0, :, : pair.vocab_size].clone())
        out.logits[..., pair.vocab_size:] = out.logits.amax() + 10
        return out

    monkeypatch.setattr(pair.draft, "forward", padding_wins)
    rec = explorer.record(pair, pair.encode(PROMPT), measured, "draft", max_new_tokens=24)
    best = seen[0].softmax(-1).amax(-1)
    assert [rec.guesses[i] for i in undrafted] == [int(seen[0][i].argmax()) for i in undrafted]
    assert rec.confidences == pytest.approx(best.tolist())


def test_record_reads_the_drafts_logits_a_block_of_rows_at_a_time(pair, monkeypatch):
    """The embedded pair's 151,936 ids: the draft's logits over a 512-token output were a 0.3 GB
    float32 copy and as much again for its softmax, at once. record() reads RECORD_ROWS positions at
    a time, and records the guesses and confidences a read of them all gives."""
    measured = real(pair, "draft", 4, n=24)
    forward, seen = pair.draft.forward, []

    def kept(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append(out.logits[0, :, : pair.vocab_size].float().clone())
        return out

    softmax, read = torch.Tensor.softmax, []

    def counted(self, *args, **kwargs):
        if self.dim() == 2 and self.shape[-1] == pair.vocab_size:
            read.append(self.shape[0])
        return softmax(self, *args, **kwargs)

    monkeypatch.setattr(pair.draft, "forward", kept)
    monkeypatch.setattr(explorer, "RECORD_ROWS", 5)
    monkeypatch.setattr(torch.Tensor, "softmax", counted)
    rec = explorer.record(pair, pair.encode(PROMPT), measured, "draft", max_new_tokens=24)
    assert read == [5, 5, 5, 5, 4]  # 24 positions, 5 at a time
    assert rec.confidences == softmax(seen[0], -1).amax(-1).tolist()
    undrafted = sorted(set(range(24)) - set(explorer.run_drafts(measured.events)))
    assert undrafted and [rec.guesses[i] for i in undrafted] == [int(seen[0][i].argmax()) for i in undrafted]


def test_a_cost_a_hair_under_100_ms_reads_100_not_1():
    """A fitted line's c0 + c1 can land on the float just below 100 ms, whose log10 rounds to 2.0:
    sig3 printed it with no decimals and then stripped its zeros, "1" for 100."""
    from specviz.digits import sig3
    from specviz.labview import cost_text

    assert math.log10(99.99999999999999) == 2.0  # the float just below 100
    assert [sig3(x) for x in (99.99999999999999, 999.9999999999999, 99.95, 0.09999999999999999)] == [
        "100", "1,000", "100", "0.1"]
    # (0.09 + 0.01) * 1000 is 99.99999999999999: a pass verifying k drafts costs 100 + 10·k ms
    rec = explorer.Recording("draft", [1, 2], [3, 4], [3, 4], 0.01, 0.1, 8, verify_line=(0.09, 0.01))
    assert "costs 100 + 10·k ms" in cost_text(rec)
    # the new digit count took log10 of every nonzero x first: inf raised OverflowError ("inf" before)
    assert [sig3(x) for x in (math.inf, -math.inf, math.nan, -99.99999999999999)] == ["inf", "-inf", "nan",
                                                                                      "-100"]


def test_the_adaptive_replay_is_marked_on_the_plot_at_its_mean_k_not_as_the_fixed_k():
    """With the adaptive policy shown, the plot marked the fixed-k curve's point as "k = 4", the
    replay shown (4.67 tokens a pass here); the adaptive replay's own 3.5 a pass, at a mean k of
    2.5, was nowhere on it."""
    from specviz.labview import explorer_views

    output = list(range(10, 24))  # 14 tokens, every draft kept, each at confidence 0.3
    rec = explorer.Recording("draft", [1, 2], output, list(output), 0.05, 0.1, 14, confidences=[0.3] * 14,
                             verify_line=(0.1, 0.0))
    # fixed k = 4: 5 + 5 tokens, then the budget's 3 drafts and the bonus: 14 in 3 passes
    assert [r.committed for r in explorer.replay(rec, 4).rounds] == [5, 5, 4]
    # adaptive: rounds 1 and 2 draft 4 (5 tokens each); round 2 teaches the rule lam = 2 / (2 +
    # 4 * 0.7), a(0.3) = 1 - 0.4167 * 0.7 = 0.708, at or below the bar R * C_D = 5 / 0.3 * 0.05 =
    # 0.833: round 3 drafts 1; round 4 has room for 1: 14 tokens in 4 passes, 10 drafts
    rep = explorer.replay_adaptive(rec, 4)
    assert [(r.k, r.committed) for r in rep.rounds] == [(4, 5), (4, 5), (1, 2), (1, 2)]
    fig = explorer_views(rec, 4, True, None, None)[2]
    mark = next(t for t in fig.data if t.name.startswith("adaptive"))
    assert (list(mark.x), list(mark.y)) == ([2.5], [3.5]) and "mean 2.5" in mark.name
    assert [a.text for a in fig.layout.annotations] == ["adaptive k ≤ 4"]
    fixed = explorer_views(rec, 4, False, None, None)[2]
    assert [a.text for a in fixed.layout.annotations] == ["k = 4"]
    assert not any(t.name.startswith("adaptive") for t in fixed.data)


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_k_lines_label_sits_above_the_curve_and_within_the_ks_on_a_phone(adaptive):
    """The dotted line's label was drawn inside the plot at its top, right of the line: the curve's
    plateau (tokens per pass levels off near the top) struck "adaptive k ≤ 8" through on a 1400 px
    page and "adaptive k ≤ 4" on a 375 px phone, and at k = 16 the label past the last k widened
    the axis to hold it (0 to 28 on the phone). Above the plot now, on the line's side towards the
    middle, it stays over k = 1..16 in the phone's plot (201 px between the axes in chromium,
    "adaptive k ≤ 16" 85 px wide there)."""
    from specviz.figures import CHAR_PX
    from specviz.labview import explorer_views

    output = list(range(10, 24))
    rec = explorer.Recording("draft", [1, 2], output, list(output), 0.05, 0.1, 14, confidences=[0.3] * 14,
                             verify_line=(0.1, 0.0))
    ks, phone_px = explorer.CURVE_KS, 200
    per_px = (max(ks) - min(ks)) / phone_px  # k a pixel, the curve's ks across the plot
    for k in ks:
        (label,) = explorer_views(rec, k, adaptive, None, None)[2].layout.annotations
        assert (label.yref, label.y, label.yanchor) == ("y domain", 1, "bottom"), label  # above the plot
        span = CHAR_PX * len(label.text) * per_px
        left, right = (k, k + span) if label.xanchor == "left" else (k - span, k)
        assert label.x == k and min(ks) <= left and right <= max(ks), (k, label.text, left, right)


def test_the_adaptive_policy_on_a_draft_recording_without_confidences_says_what_it_lacks():
    """An older draft trace (no confidences) was told to "record a greedy run of the draft
    drafter", which is what it is: what it lacks is the confidences."""
    from specviz.labview import explorer_views

    old = explorer.Recording("draft", [1, 2], [5, 6, 7, 8], [5, 6, 9, 8], 0.01, 0.1, 4)
    numbers = explorer_views(old, 2, True, None, None)[1]
    assert "holds no draft confidences" in numbers and "record a greedy run" not in numbers
    assert "<b>k = 2</b>" in numbers and "Showing fixed k instead" in numbers
    ngram = explorer.Recording("ngram", [1, 2], [5, 6], [], 0.0, 0.1, 4)
    assert "record a greedy run of the draft drafter" in explorer_views(ngram, 2, True, None, None)[1]


def test_the_adaptive_replays_tokens_per_second_is_in_the_numbers_as_a_fixed_ks_is_on_the_curve():
    """The plot marks the adaptive replay's tokens per pass, but its second axis draws only the
    fixed-k curve: the adaptive replay's predicted tokens / s was shown nowhere. The numbers give
    it, the output over predicted seconds, as the curve does for a fixed k."""
    from specviz.labview import explorer_views

    output = list(range(10, 24))  # as above: 14 tokens, every draft kept, each at confidence 0.3
    rec = explorer.Recording("draft", [1, 2], output, list(output), 0.05, 0.1, 14, confidences=[0.3] * 14,
                             verify_line=(0.1, 0.0))
    # adaptive: 10 drafts * 50 ms + 4 passes * 100 ms = 0.9 s: 14 / 0.9 = 15.6 tokens / s
    numbers = explorer_views(rec, 4, True, None, None)[1]
    assert "predicted 0.9 s, 15.6 tokens / s (" in numbers
    # k = 4: 11 drafts * 50 ms + 3 passes * 100 ms = 0.85 s: 14 / 0.85 = 16.5, the curve's at k = 4
    numbers, fig = explorer_views(rec, 4, False, None, None)[1:]
    assert "predicted 0.85 s, 16.5 tokens / s (" in numbers and fig.data[1].y[3] == pytest.approx(14 / 0.85)


def test_the_adaptive_note_of_an_older_recording_names_the_costs_its_rule_used():
    """An older recording has no fitted verify line: the rule prices a verified token at the 4%
    prior slope of the mean target pass, and the predicted seconds use that flat mean. The note
    said the rule used "the line fitted to the whole run"."""
    import dataclasses

    from specviz.labview import explorer_views

    output = list(range(100, 130))
    rec = explorer.Recording("draft", [1, 2, 3], output, guesses=list(output), draft_pass_seconds=0.01,
                             target_pass_seconds=0.2, max_new_tokens=30, confidences=[0.9] * 30,
                             verify_line=(0.05, 0.1))
    assert "the line fitted to the whole run, its prompt pass included" in explorer_views(
        rec, 16, True, None, None)[1]
    old = dataclasses.replace(rec, verify_line=None)
    rep = explorer.replay_adaptive(old, 16)  # round 3 drafts 13 at the 4% prior (the test above)
    assert [r.k for r in rep.rounds] == [4, 4, 13, 5]
    assert rep.predicted_seconds == pytest.approx(26 * 0.01 + 4 * 0.2)  # every pass at the mean: 1.06 s
    numbers = explorer_views(old, 16, True, None, None)[1]
    assert "line fitted" not in numbers and "predicted 1.06 s" in numbers
    assert ("the mean draft pass and the mean target pass, one more verified token at the prior slope of "
            "4% of it (this recording holds no fitted verify line: a trace from an older specviz, or a run "
            "whose passes fit none, one round or one width; its predicted seconds price every pass at the "
            "mean)") in numbers


def test_a_fresh_recording_without_a_verify_line_is_not_called_an_older_trace(pair):
    """verify_line is None for a run whose passes fit no line (here one round: one width), not only
    for older traces: the adaptive note called such a fresh recording "this older recording"."""
    from specviz.labview import explorer_views

    ids = pair.encode(PROMPT)
    run = specviz.RunStats.of(specviz.generate(pair, ids, proposer="draft", k=4, max_new_tokens=1))
    rec = explorer.record(pair, ids, run, "draft", 1)
    assert rec.verify_line is None and rec.replays_adaptive
    numbers = explorer_views(rec, 4, True, None, None)[1]
    assert "no fitted verify line" in numbers and "older recording" not in numbers


def test_an_adaptive_replay_with_no_rounds_draws_no_mark():
    """A recording built by hand with no output replays to no rounds: the adaptive mark's mean k
    divided by its 0 target passes (the fixed-k view of it drew)."""
    from specviz.labview import explorer_views

    empty = explorer.Recording("draft", [1, 2], [], [], 0.01, 0.1, 4)
    fig = explorer_views(empty, 2, True, None, None)[2]
    assert not any((t.name or "").startswith("adaptive") for t in fig.data)


def test_the_fastest_k_line_names_the_ks_within_2_percent_as_runs_of_ks():
    from specviz.labview import fastest_text, ks_text

    assert [ks_text(ks) for ks in ([4], [1, 2], [3, 5], [2, 3, 4, 6], [1, 3, 5, 6, 7, 9])] == [
        "4", "1 and 2", "3 and 5", "2 to 4 and 6", "1, 3, 5 to 7 and 9"]
    # 10 tokens: k = 2 takes 1 s (10.0 tokens / s); k = 3 is 1.5 % slower, k = 4 2.5 %, k = 5 ties
    # k = 2 exactly and k = 1 has no time measured
    assert fastest_text({1: None, 2: 1.0, 3: 1.015, 4: 1.025, 5: 1.0}, 10) == (
        "k = 2 (10.0 tokens / s), with k = 3 and 5 within 2% of its time")
    assert fastest_text({1: 0.0, 2: None}, 10) is None


def test_a_mismatch_gives_a_reason_that_fits_the_recordings_proposer():
    """An n-gram run has no draft pass, yet its mismatch blamed the draft's bfloat16 pass."""
    from specviz.labview import explorer_views

    ngram = explorer.Recording("ngram", [1, 2, 3, 4, 1, 2, 3], [4, 1, 2, 3], [], 0.0, 0.01, 10)
    numbers = explorer_views(ngram, 3, False, 3, [1, 1, 1, 1])[1]
    assert "does NOT match it" in numbers and "bfloat16" not in numbers and "draft pass over" not in numbers
    assert "An n-gram run has no draft pass: the replay reruns its lookup" in numbers
    draft = explorer.Recording("draft", [1, 2], [5, 6, 7, 8], [5, 6, 7, 8], 0.01, 0.1, 4)
    numbers = explorer_views(draft, 2, False, 2, [1, 1, 1, 1])[1]
    assert "does NOT match it" in numbers and "one draft pass over the whole output" in numbers
    assert "n-gram" not in numbers
