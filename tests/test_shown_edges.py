"""Figures the page shows at the edges a live run never reaches but an opened trace can: no time
measured, no drafts tested, no top-2 logits recorded, pass costs averaged over every round."""

import json
from dataclasses import replace
from types import SimpleNamespace

import torch
from test_hostile_trace import synthetic

from specviz import trace
from specviz.compare import compare
from specviz.engine import RoundEvent
from specviz.figures import k_prediction
from specviz.metrics import RunStats
from specviz.views import stats_html, verdict_html


def ev(r, pos, k, acc, elapsed, source="draft", top2=(), stop=None, token=9):
    drafts = list(range(1, k + 1))
    return RoundEvent(r, k, drafts, acc, token, "bonus" if acc == k else "recovered",
                      drafts[:acc] + [token], [1.0] * k, [1.0] * k, r, r * k, 0.0, elapsed, elapsed,
                      elapsed * r, pos, source, 0, stop, list(top2))


def alone(n, elapsed, token=9, top2=()):
    return [RoundEvent(i, 0, [], 0, token, "bonus", [token], [], [], i, 0, 0.0, elapsed, elapsed,
                       elapsed * i, i - 1, "none", 0, "length" if i == n else None, list(top2))
            for i in range(1, n + 1)]


def test_a_run_without_measured_time_shows_no_speed_and_no_speedup():
    """An opened trace can say 0 s: the page showed 0.00x, or 100000000000.00x against a floor."""
    timed = [ev(1, 0, 2, 2, 0.1), ev(2, 3, 2, 1, 0.1), ev(3, 5, 0, 0, 0.1, stop="length")]
    untimed = [ev(1, 0, 2, 2, 0.0), ev(2, 3, 2, 1, 0.0), ev(3, 5, 0, 0, 0.0, stop="length")]
    spec, base = RunStats.of(timed), RunStats.of(alone(6, 0.1))
    assert spec.speedup_over(base) == (6 / 0.3) / (6 / 0.6)  # hand: 20 tok/s over 10 tok/s = 2
    assert "<b>2.00×</b>" in stats_html(spec, base)
    for shown in (stats_html(RunStats.of(untimed), base), stats_html(spec, RunStats.of(alone(6, 0.0)))):
        assert "×</b>" not in shown and "— (no time measured)" in shown
    assert RunStats.of(untimed).speedup_over(base) is None
    # 5e-324 s (the smallest float a trace may hold) is above 0, yet 6 / 5e-324 tokens/s is inf
    tiny = RunStats.of([ev(1, 0, 2, 2, 5e-324), ev(2, 3, 2, 1, 5e-324),
                        ev(3, 5, 0, 0, 5e-324, stop="length")])
    assert tiny.wall_seconds > 0 and tiny.speedup_over(base) is None
    shown = stats_html(tiny, base)
    assert "inf" not in shown and "×</b>" not in shown and "— (no time measured)" in shown


def test_no_drafts_tested_draws_no_iid_prediction():
    """A run that drafted nothing has no α: the table says "—", and the plot said α=0.00."""
    none = RunStats.of([ev(1, 0, 0, 0, 0.01, "ngram"), ev(2, 1, 0, 0, 0.01, "ngram", stop="length")])
    assert not [t for t in k_prediction(none).data if "i.i.d." in (t.name or "")]
    some = RunStats.of([ev(1, 0, 4, 2, 0.01), ev(2, 3, 4, 4, 0.01, stop="length")])
    curve = next(t for t in k_prediction(some).data if "i.i.d." in t.name)
    assert curve.name == "i.i.d. prediction at α = 85.7%"  # hand: 6 kept, 1 refused: 6/7


def test_outputs_that_differ_without_recorded_logits_are_not_called_unexplained():
    """Older traces hold no top-2 logits: the bound was scaled by a made-up logit of 1.0, and the
    verdict said "unexplained: please report". Without a margin there is nothing to tell."""
    spec, base = RunStats.of(alone(3, 0.1)), RunStats.of(alone(3, 0.1, token=7))
    c = compare(spec, base, torch.float32, "cpu")
    assert c.threshold is None and c.verdict.startswith("cannot tell")
    page = verdict_html(c, None, greedy=True)
    assert "cannot tell" in page and "no near-tie bound" in page and "please report" not in page
    recorded = [[9, 12.5], [7, 12.5 - 1e-6]]  # margin 1e-6 at logit 12.5: 8 ulp in float32 = 7.6e-6
    near = compare(RunStats.of(alone(3, 0.1, top2=[recorded])), base, torch.float32, "cpu")
    assert near.threshold == 8 * 2.0 ** (3 - 23) and near.verdict == "near-tie flipped by floating point"
    # a float32 run has no wider dtype to rerun in (the page said "Re-run in float32" to it too)
    tok = type("Tok", (), {"decode": lambda self, ids: "x"})()
    page = verdict_html(near, tok, greedy=True)
    assert "Re-run" not in page and "The run was in float32 already" in page
    assert "(margin 1e-06)" in page  # the top logit less the runner-up's: 12.5 - (12.5 - 1e-6)
    half = compare(RunStats.of(alone(3, 0.1, top2=[recorded])), base, torch.bfloat16, "cpu")
    page = verdict_html(half, tok, greedy=True)
    assert "Re-run in float32 to confirm a near-tie" in page and "already" not in page


def test_an_opened_recording_is_priced_at_its_runs_costs_after_round_1():
    """Older traces' recordings averaged C_D and C_T over every round, round 1's prefills
    included, while the explorer said round 1 was priced without its prefill. Opened, a
    recording takes its run's own means after round 1, from the events."""
    d = synthetic(rounds=4, k=3)
    for i, e in enumerate(d["events"]):
        e["draft_seconds"], e["target_seconds"] = (0.3, 2.0) if i == 0 else (0.03 * (i + 1), 0.1 * i)
    d["recording"] |= {"draft_pass_seconds": 0.5, "target_pass_seconds": 0.5}  # all-round means
    rec = trace.loads(json.dumps(d)).recording
    # hand: rounds 2-4 drafted 3 passes each, in 0.06 + 0.09 + 0.12 s; their target passes took
    # 0.1, 0.2, 0.3 s
    assert abs(rec.draft_pass_seconds - 0.27 / 9) < 1e-12
    assert abs(rec.target_pass_seconds - 0.6 / 3) < 1e-12


def test_a_replay_says_which_costs_include_the_prefill():
    """A run of one round has only round 1's costs; a run whose later rounds drafted nothing (the
    budget cut them to k=0) has only round 1's C_D, the draft's prefill in it, while the page
    said "without the prompt's prefill" (3.22 ms shown where a longer run measured 1.10 ms)."""
    from specviz.labview import prefill_text

    def event(n, drafted, passes, draft_seconds):
        return replace(alone(1, 0.1)[0], round=n, k=drafted, accepted=drafted, draft_passes=passes,
                       draft_seconds=draft_seconds, new_tokens=list(range(drafted + 1)))

    cut = RunStats.of([event(1, 4, 4, 0.4), event(2, 0, 4, 0.0)])  # passes are cumulative
    assert cut.prefilled_costs == ("C_D",) and cut.draft_pass_seconds == 0.1  # round 1's 0.4 / 4
    assert "C_D is round 1's, the draft's prefill" in prefill_text(cut.prefilled_costs)
    later = RunStats.of([event(1, 4, 4, 0.4), event(2, 2, 6, 0.02)])
    assert later.prefilled_costs == () and later.draft_pass_seconds == 0.01
    assert prefill_text(()) == "round 1 priced like any round, without the prompt's prefill"
    one = RunStats.of([event(1, 4, 4, 0.4)])
    assert one.prefilled_costs == ("C_D", "C_T")
    assert "the prompt's prefill included" in prefill_text(one.prefilled_costs)
    assert RunStats.of(alone(3, 0.1)).prefilled_costs == ()  # no draft: C_D is not shown


def test_a_break_even_priced_at_round_1s_draft_cost_says_so():
    """A hybrid run whose draft model ran only in round 1 (every later round the n-gram's) has no
    C_D but round 1's, the draft's prefill of the prompt in it; the break-even curve called it
    measured, as if a pass cost that, where the cost ratio and the k explorer said it was not."""
    def event(n, k, acc, source, passes, draft_seconds, target_seconds, position):
        return replace(ev(n, position, k, acc, target_seconds, source), draft_passes=passes,
                       draft_seconds=draft_seconds, target_seconds=target_seconds)

    rounds = [event(1, 4, 1, "draft", 4, 0.5, 0.2, 0)]
    rounds += [event(n, 6, 2, "ngram", 4, 0.0, 0.16, 2 + 3 * (n - 2)) for n in range(2, 12)]
    spec, base = RunStats.of(rounds), RunStats.of(alone(32, 0.1))
    assert spec.prefilled_costs == ("C_D",) and spec.cost_ratio == 0
    # hand: T0 = 0.1 s (the baseline), each of the 6 drafts +0.01 s, C_D = 0.5 s / 4 = 1.25 T0;
    # break-even at k = 1: 1 + (1.25 + 0.1) = 2.35
    curve = next(t for t in k_prediction(spec, None, 6, base).data if t.name.startswith("break-even"))
    assert "C_D = 1.25·T₀ from its first round, the prompt's prefill included" in curve.name
    assert abs(curve.y[0] - 2.35) < 1e-9
    later = [replace(e, draft_passes=6) for e in rounds[2:]]  # passes are cumulative
    measured = RunStats.of([rounds[0], replace(rounds[1], draft_passes=6, draft_seconds=0.02,
                                               source="draft"), *later])  # round 2 drafts again
    assert "prefill" not in next(t.name for t in k_prediction(measured, None, 6, base).data
                                 if t.name.startswith("break-even"))


def test_the_iid_row_names_the_mean_over_rounds_it_shows():
    """Rounds the budget cut draft less than k: the row showed their mean prediction under the
    formula at k (2.08 under a label that computes to 2.35 at α = 61.1%, k = 4)."""
    rounds = [ev(1, 0, 4, 4, 0.1), ev(2, 5, 4, 2, 0.1), ev(3, 8, 2, 2, 0.1, stop="length")]
    spec = RunStats.of(rounds)
    # hand: α = 8 kept / (8 + 1 refused); rounds at reach 4, 4, 2
    a = 8 / 9
    mean = (2 * (1 - a ** 5) / (1 - a) + (1 - a ** 3) / (1 - a)) / 3
    assert abs(spec.predicted_tokens_per_pass - mean) < 1e-12
    shown = stats_html(spec)
    # the formula in two halves that never break (no-break spaces): at 375 px its "−" stood alone
    assert "mean over rounds of (1\u00a0−\u00a0α^(kᵢ+1)) /\u00a0(1\u00a0−\u00a0α)," in shown
    assert f"{mean:.2f}\u00a0/pass" in shown


def test_a_figure_beside_its_verdict_is_never_rounded_onto_the_bar():
    """1.0996x against a goal of >= 1.10 printed "1.10x FAIL", 3.996x against >= 4 "4.00 NOT MET",
    and a p-value of 0.0009996 "0.001 biased" beside "below 0.001 flags a bias"."""
    from specviz import benchreport, gpucheck
    from specviz.digits import beside

    assert [beside(v, 1.1) for v in (1.0996, 1.1, 1.234, 1.1000001)] \
        == ["1.0996", "1.10", "1.23", "1.1000001"]
    assert beside(0.9496, 0.95) == "0.9496" and beside(0.503, 0.5) == "0.503"
    assert [beside(v, (1, 2)) for v in (0.996, 1.996, 1.5, 2.0)] == ["0.996", "1.996", "1.50", "2.00"]
    assert beside(0.0009996, 1e-3, 3, "g") == "0.0009996" and beside(0.0123, 1e-3, 3, "g") == "0.0123"
    tree = {"tokens_per_pass": 1.0996, "tokens_per_pass_ok": False, "tokens_per_second": 0.9496,
            "tokens_per_second_ok": False, "tree_tokens_per_pass": 4.0, "chain_tokens_per_pass": 4.0,
            "tree_tokens_per_second": 2.0, "chain_tokens_per_second": 2.0}
    row = {"tokens_per_pass": 4.0, "tokens_per_second": 2.0}
    text = benchreport.tree_table({"t": {"chain": "c", "classes": {"write": tree}, "goal_depth": True,
                                        "tokens_per_pass_ok": False, "tokens_per_second_ok": False}},
                                  {"t": {"write": row}, "c": {"write": row}})
    assert "| 1.0996x FAIL |" in text and "| 0.9496x FAIL |" in text
    goals = [{"goal": "fast >= 4x", "value": 3.996, "met": False, "bar": 4},
             {"goal": "C_D/C_T <= 0.5", "value": 0.503, "met": False, "bar": 0.5}]
    lines = gpucheck.goal_lines(goals)
    assert "  NOT MET      fast >= 4x: 3.996" in lines and "  NOT MET      C_D/C_T <= 0.5: 0.503" in lines


def test_a_share_just_short_of_all_or_none_never_prints_as_100_or_0_percent():
    """249 of 250 drafts kept printed "100%" at a position (and α 0.9996 "100.0%"), which says
    nothing was refused; 1 of 250 printed "0%". Exact shares keep their plain digits."""
    from specviz.cli import run_line
    from specviz.digits import percent

    assert [percent(x, 0) for x in (249 / 250, 1 / 250, 1.0, 0.0, 0.5)] \
        == ["99.6%", "0.4%", "100%", "0%", "50%"]
    assert [percent(x) for x in (0.9996, 2 / 3, 1.0)] == ["99.96%", "66.7%", "100.0%"]
    # 249 rounds of k=1 kept whole and one that refused its draft: α = 249/250, by position the same
    rounds = [ev(n, 2 * (n - 1), 1, 1, 0.1) for n in range(1, 250)] + [ev(250, 498, 1, 0, 0.1, stop="length")]
    spec = RunStats.of(rounds)
    assert spec.alpha == 249 / 250 and spec.acceptance_by_position[0] == 249 / 250
    assert "α 99.6%" in run_line(spec) and "accepted/drafted 99.6%" in run_line(spec)
    assert "99.6%" in stats_html(spec) and "100.0%" not in stats_html(spec)


def test_tokens_per_pass_just_over_one_never_prints_as_the_target_alones_one():
    """251 tokens in 250 target passes printed "1.00" beside the target alone's "1.00" (and in the
    tree summary, its bar and the CLI) while α was not 0: by hand 251 / 250 = 1.004."""
    from specviz.figures import tree_vs_chain
    from specviz.treeview import overview_html

    rounds = [ev(1, 0, 1, 1, 0.1)] + [ev(n, n, 1, 0, 0.1) for n in range(2, 250)] \
        + [ev(250, 250, 1, 0, 0.1, stop="length")]
    spec = RunStats.of(rounds)
    assert (spec.new_tokens, spec.target_passes) == (251, 250) and spec.tokens_per_pass == 251 / 250
    assert "<td>1.004</td><td>1.00</td>" in stats_html(spec, RunStats.of(alone(251, 0.1)))
    assert "<td>1.50</td>" in stats_html(RunStats.of([ev(1, 0, 1, 1, 0.1), ev(2, 2, 1, 0, 0.1)]))
    chain = RunStats.of([ev(n, 2 * n, 1, 1, 0.1) for n in range(1, 4)])  # 2 tokens a pass
    assert list(tree_vs_chain(spec, chain, 1).data[0].text) == ["1.004", "2.00"]
    five_in_three = RunStats.of([ev(1, 0, 1, 1, 0.1), ev(2, 2, 1, 1, 0.1), ev(3, 4, 0, 0, 0.1)])
    assert five_in_three.tokens_per_pass == 5 / 3  # a bar of its own value: 1.67, not 16 digits
    assert list(tree_vs_chain(five_in_three, five_in_three, 1).data[0].text) == ["1.67", "1.67"]
    # two bars 0.003 apart, neither near 1: the taller one never reads as the other's 2.00
    stand_in = lambda rate: SimpleNamespace(tokens_per_pass=rate, draft_depth=2.0, k=4, events=[1])  # noqa: E731
    assert list(tree_vs_chain(stand_in(2.004), stand_in(2.001), 4).data[0].text) == ["2.004", "2.00"]
    # the budget cut every chain round to k=2: the bar still names the k the chain was run at
    cut_chain = SimpleNamespace(tokens_per_pass=1.5, draft_depth=2.0, k=2, events=[1])
    assert list(tree_vs_chain(stand_in(2.0), cut_chain, 4).data[0].x)[1] == "chain (draft model, k=4)"
    assert tree_vs_chain(spec, chain, 1).layout.yaxis.range == (0, 1.2 * 2.0)  # room above the taller bar
    # no chain (still to come, or a run stopped before it): said without promising it will come
    no_chain = tree_vs_chain(spec, None, 1)
    assert [a.text for a in no_chain.layout.annotations] == [
        "no chain run to compare: it runs after the tree run<br>and its baseline, unless the run stopped "
        "before it"] and len(no_chain.data[0].x) == 1
    pieces = lambda context, tokens: [f"<{t}>" for t in tokens]  # noqa: E731
    assert "1.004 tokens per target pass" in overview_html(rounds, pieces)


def test_each_acceptance_bar_says_how_many_rounds_it_counts():
    """Position 4 of a k=4 run showed 1.0 from a single round, with nothing to say so, and a k=2
    run's axis had ticks at 0.5, 1.5 and 2.5. By hand: position 1 reached by 3 rounds, kept by 1."""
    from specviz.figures import acceptance_by_position

    rounds = [ev(1, 0, 4, 0, 0.1), ev(2, 1, 4, 0, 0.1), ev(3, 2, 4, 1, 0.1)]
    spec = RunStats.of(rounds)
    assert spec.acceptance_counts == [(1, 3), (0, 1), (0, 0), (0, 0)]
    fig = acceptance_by_position(spec)
    assert list(fig.data[0].text) == ["1/3", "0/1", "", ""] and fig.layout.xaxis.dtick == 1
    assert list(fig.data[0].x) == [1, 2, 3, 4]  # draft positions count from 1, as the table's
    assert fig.data[0].textposition == "outside"  # inside, a bar at 0 (0/1) showed no count at all


def test_a_race_is_called_unfair_only_past_the_noise_margin_over_its_tokens_per_pass():
    """2.00 tokens a target pass: a speedup up to 1.2 x 2.00 = 2.4 can be a fair race (verify
    passes priced near a one-token pass, timing noise); past it, or a run that drafted nothing at
    under 1 / 1.2 of the target alone, the two runs were timed under different loads."""
    from specviz.views import implausible_race

    def stats(speedup, drafted=4):
        return SimpleNamespace(tokens_per_pass=2.0, drafted=drafted, speedup_over=lambda base: speedup)

    assert [implausible_race(stats(x), None) for x in (2.2, 2.39, None)] == [None] * 3
    assert implausible_race(stats(2.41), None) == "more than its 2.00 tokens per target pass can explain"
    assert implausible_race(stats(0.84, drafted=0), None) is None  # 1 / 1.2 = 0.833
    assert implausible_race(stats(0.82, drafted=0), None) == \
        "a run that drafted nothing does the target alone's work"
    assert implausible_race(stats(0.82), None) is None  # a drafting run may lose


def test_the_speedup_rows_wait_for_both_runs_to_finish():
    """While the baseline streams (no stop yet), its time so far is no race result: no speedup row;
    once both have finished, the rows appear."""
    done = RunStats.of(alone(3, 0.1))
    assert "speedup" not in stats_html(done, RunStats.of(alone(3, 0.2)[:2]))
    assert "speedup" not in stats_html(RunStats.of(alone(3, 0.1)[:2]), RunStats.of(alone(3, 0.2)))
    assert "<tr><th>speedup</th>" in stats_html(done, RunStats.of(alone(3, 0.2)))


def test_a_number_beside_a_bar_takes_as_many_digits_as_tell_it_apart_and_never_reads_as_the_bar():
    from specviz.digits import beside, percent, sig3

    assert beside(1.004, 1.0) == "1.004" and beside(0.996, 1.0) == "0.996" and beside(2.5, 1.0) == "2.50"
    assert beside(1.000041, 1.0) == "1.00004"  # five decimals: four still read 1.0000
    assert beside(1 + 1e-12, 1.0) == "1.000000000001"  # past ten decimals: the whole value
    assert beside(5 / 3, (1.0, 5 / 3)) == "1.67"  # a bar equal to the value is no verdict on it
    assert percent(249 / 250) == "99.6%" and percent(1 / 3000) == "0.03%" and percent(0.5) == "50.0%"
    assert [sig3(x) for x in (1234.6, 153.2, 1.4, 0.04, 0)] == ["1,235", "153", "1.4", "0.04", "0"]
