"""RunStats figures against hand computations on constructed runs."""

import dataclasses
import random

import pytest

from specviz.engine import RoundEvent
from specviz.metrics import RunStats, reach, target_line
from specviz.theory import break_even_tokens, expected_tokens_per_pass


def round_(number: int, position: int, k: int, accepted: int) -> RoundEvent:
    new = list(range(accepted + 1))
    return RoundEvent(round=number, k=k, draft_tokens=list(range(k)), accepted=accepted, token=0,
                      kind="bonus" if accepted == k else "recovered", new_tokens=new,
                      target_probs=[1.0] * k, draft_probs=[1.0] * k, target_passes=number,
                      draft_passes=number * k, draft_seconds=0.0, target_seconds=0.0,
                      round_seconds=0.0, elapsed=0.0, position=position, source="draft",
                      target_cache_length=0, stop=None)


def run(pattern: list[tuple[int, int]]) -> RunStats:
    events, position = [], 0
    for i, (k, accepted) in enumerate(pattern, 1):
        events.append(round_(i, position, k, accepted))
        position += accepted + 1
    return RunStats.of(events)


def test_alpha_counts_only_tested_drafts():
    stats = run([(4, 4), (4, 1), (4, 0)])  # 5 kept; 2 refusals; drafts after them never tested
    assert (stats.accepted, stats.drafted, stats.rejections) == (5, 12, 2)
    assert stats.alpha == pytest.approx(5 / 7)
    assert stats.acceptance_rate == pytest.approx(5 / 12)
    a = 5 / 7
    assert stats.predicted_tokens_per_pass == pytest.approx((1 - a ** 5) / (1 - a))
    assert stats.summary()["alpha"] == stats.alpha
    assert stats.summary()["acceptance_rate"] == stats.acceptance_rate


def test_acceptance_by_position_has_no_value_where_no_round_reached_it():
    stats = run([(4, 0), (4, 0), (4, 1)])  # position 2 reached once (refused); 3 and 4 never
    assert stats.acceptance_by_position == [pytest.approx(1 / 3), 0.0, None, None]


def test_prediction_averages_over_each_rounds_draft_length():
    stats = run([(2, 2), (4, 1), (0, 0)])  # an adaptive run: k = 2, 4, then nothing drafted
    a = 3 / 4
    want = (expected_tokens_per_pass(a, 2) + expected_tokens_per_pass(a, 4) + 1.0) / 3
    assert stats.predicted_tokens_per_pass == pytest.approx(want)


def test_iid_prediction_matches_the_measured_tokens_per_pass():
    # 4,000 rounds at k=4 with i.i.d. acceptance 0.8: E = (1 - 0.8^5) / 0.2 = 3.3616 tokens per
    # pass; the per-round standard deviation is about 1.5, so the mean's is 0.024 (0.7%).
    rng = random.Random(0)
    pattern = []
    for _ in range(4000):
        n = 0
        while n < 4 and rng.random() < 0.8:
            n += 1
        pattern.append((4, n))
    stats = run(pattern)
    assert stats.alpha == pytest.approx(0.8, abs=0.01)
    assert stats.predicted_tokens_per_pass == pytest.approx(stats.tokens_per_pass, rel=0.03)
    assert stats.acceptance_rate < 0.65  # accepted / drafted: about 0.59, the wrong input


def test_the_stats_table_shows_the_hand_computed_figures():
    from specviz.figures import k_prediction
    from specviz.views import stats_html

    spec = run([(4, 4), (4, 1), (4, 0)])  # 8 tokens in 3 passes; 5 kept of 12 drafted, 2 refusals
    timed = [dataclasses.replace(e, elapsed=1.0 * e.round, draft_seconds=0.25, target_seconds=0.5,
                                 round_seconds=1.0, stop="length" if e.round == 3 else None)
             for e in spec.events]
    spec = RunStats.of(timed)
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), elapsed=0.5 * i,
                                            stop="length" if i == 8 else None) for i in range(1, 9)])
    html = stats_html(spec, base)
    a = 5 / 7
    for shown in ("<td>8</td><td>8</td>", "<td>3</td><td>8</td>", "<td>2.67</td><td>1.00</td>",
                  f"<td>{a:.1%}</td>", f"<td>{5 / 12:.1%}</td>", f"{(1 - a ** 5) / (1 - a):.2f}\u00a0/pass",
                  "<td>3.00\u00a0s</td><td>4.00\u00a0s</td>", "<td>2.67</td><td>2.00</td>",
                  # a number's unit on its line (a no-break space): at 1400 px the last "s" stood alone
                  "draft 0.75\u00a0s · target 1.50\u00a0s · other 0.750\u00a0s", "<b>1.33×</b>",
                  # after round 1: 3 tokens in 2 s against the target alone's 7 in 3.5 s
                  "(the prompt's reading left out: what the k plot's break-even prices)</th><td>0.75×</td>"):
        assert shown in html, shown
    curve = k_prediction(spec).data[0]  # the i.i.d. curve over k at the per-token α
    assert curve.y[3] == pytest.approx((1 - a ** 5) / (1 - a)) and curve.x[3] == 4


def test_a_tree_runs_chain_column_shows_the_chain_runs_hand_computed_figures():
    """A tree run's table has a third column, the chain drafter at the same depth: its every cell
    is the chain run's own figure, computed by hand here as for a chain run's table (a helper's
    recomputation of the Run tab found this column's values checked only for tokens per pass,
    nodes, depth and elapsed)."""
    import re

    from specviz.tree import TreeNode
    from specviz.views import stats_html

    chain = RunStats.of([dataclasses.replace(e, elapsed=1.0 * e.round, draft_seconds=0.25, target_seconds=0.5,
                                             round_seconds=1.0, stop="length" if e.round == 3 else None)
                         for e in run([(4, 4), (4, 1), (4, 0)]).events])  # 8 tokens, 3 passes, 5 of 7 kept
    path = tuple(TreeNode(parent=d - 1 if d else -1, token=d, depth=d + 1, q=1.0, score=1.0, p=1.0,
                          fate="accepted") for d in range(3))
    tree = RunStats.of([dataclasses.replace(round_(1, 0, 3, 3), source="tree", tree=path, elapsed=2.0,
                                            draft_seconds=0.5, target_seconds=1.0, round_seconds=2.0,
                                            stop="length")])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), elapsed=0.5 * i,
                                            stop="length" if i == 8 else None) for i in range(1, 9)])
    rows = {label: re.findall(r"<td>(.*?)</td>", cells) for label, cells in
            re.findall(r"<tr><th>([^<]*)</th>((?:<td>.*?</td>)+)</tr>", stats_html(tree, base, chain))}
    chain_column = {label.split(" (")[0].split(":")[0]: cells[2] for label, cells in rows.items()}
    a = 5 / 7
    assert chain_column == {
        "tokens": "8", "target passes": "3", "draft passes": "12", "tokens per target pass": "2.67",
        "drafted tokens verified": "12", "depth drafted a round": "4.0",
        "accepted per verified token": f"{5 / 12:.1%}", "per-token acceptance α = accepted /": f"{a:.1%}",
        "i.i.d. prediction": f"{(1 - a ** 5) / (1 - a):.2f}\u00a0/pass",
        "elapsed": "3.00\u00a0s", "tokens / s": "2.67",
        "time split": "draft 0.75\u00a0s · target 1.50\u00a0s · other 0.750\u00a0s",
        "speedup": "<b>1.33×</b>",  # 8/3 tokens a second against the target alone's 8 in 4 s
        "speedup after round 1": "0.75×"}  # 3 tokens in 2 s against 7 in 3.5 s
    assert rows["tokens"][:2] == ["4", "8"]  # the tree's own column and the baseline's beside it


def test_the_elapsed_row_keeps_each_number_s_unit_on_its_line():
    """The elapsed row's "s" is held to its number by a no-break space, as the time split's are: in
    a tree run's three columns on a 375 px phone (the real pair, chromium) the tree's "29.49 s"
    wrapped with its "s" alone on the cell's last line. The chain column's too."""
    from specviz.tree import TreeNode
    from specviz.views import stats_html

    path = tuple(TreeNode(parent=d - 1 if d else -1, token=d, depth=d + 1, q=1.0, score=1.0, p=1.0,
                          fate="accepted") for d in range(3))
    tree = RunStats.of([dataclasses.replace(round_(1, 0, 3, 3), source="tree", tree=path, elapsed=29.49,
                                            stop="length")])
    chain = RunStats.of([dataclasses.replace(round_(1, 0, 3, 3), elapsed=32.55, stop="length")])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), elapsed=9.8 * i,
                                            stop="length" if i == 4 else None) for i in range(1, 5)])
    assert tree.is_tree
    html = stats_html(tree, base, chain)
    row = html[html.index("<th>elapsed</th>"):]
    row = row[:row.index("</tr>")]
    assert row == "<th>elapsed</th><td>29.49\u00a0s</td><td>39.20\u00a0s</td><td>32.55\u00a0s</td>", row


def test_a_short_time_never_prints_as_zero_seconds():
    """Two decimals printed a GPU run's 4 ms of drafting as "draft 0.00 s", the n-gram's no
    drafting at all, and a 3 ms run as "elapsed 0.00 s" beside its tokens a second."""
    from specviz.views import stats_html

    fast = RunStats.of([dataclasses.replace(e, elapsed=0.001 * e.round, draft_seconds=0.0004,
                                            target_seconds=0.0005, round_seconds=0.001,
                                            stop="length" if e.round == 3 else None)
                        for e in run([(4, 4), (4, 1), (4, 0)]).events])
    html = stats_html(fast, None)
    assert "<th>elapsed</th><td>0.003\u00a0s</td>" in html
    assert "draft 0.001\u00a0s · target 0.002\u00a0s · other 0.0003\u00a0s" in html  # 3 - 1.2 - 1.5 ms
    assert "draft 0.75\u00a0s" in stats_html(RunStats.of([dataclasses.replace(
        e, draft_seconds=0.25) for e in run([(4, 4), (4, 1), (4, 0)]).events]), None)  # as before


def test_a_speedup_just_below_parity_never_prints_as_parity():
    from specviz.views import stats_html

    spec = run([(4, 4), (4, 1), (4, 0)])  # 8 tokens; the target alone's 8 in 0.996 of the time
    spec = RunStats.of([dataclasses.replace(e, elapsed=1.0 * e.round, stop="length" if e.round == 3 else None)
                        for e in spec.events])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), elapsed=0.3735 * i,
                                            stop="length" if i == 8 else None) for i in range(1, 9)])
    assert spec.speedup_over(base) == pytest.approx(0.996)
    html = stats_html(spec, base)
    assert "<b>0.996×</b>" in html and "<b>1.00×</b>" not in html


def test_decode_rate_leaves_out_the_round_that_paid_the_prompt():
    from dataclasses import replace

    # round 1 (prefill + verify) ends at 10 s with 5 tokens; rounds 2-3 add 2 + 4 tokens by 13 s
    rounds = run([(4, 4), (4, 1), (4, 3)]).events
    events = [replace(e, elapsed=t) for e, t in zip(rounds, (10.0, 11.5, 13.0), strict=True)]
    stats = RunStats.of(events)
    assert (stats.decode_tokens, stats.decode_seconds) == (6, pytest.approx(3.0))
    assert stats.decode_tokens_per_second == pytest.approx(2.0)  # against 11 / 13 = 0.85 overall
    assert stats.tokens_per_second == pytest.approx(11 / 13)
    assert stats.summary()["decode_tokens_per_second"] == pytest.approx(2.0)
    assert RunStats.of(events[:1]).decode_tokens_per_second == 0.0  # one round: nothing after it


def test_break_even_prices_the_measured_verify_line():
    from specviz.figures import k_prediction

    # k = 4: round 1 pays both prefills (2 s draft, 5 s target); later rounds 4 draft passes in
    # 0.4 s and a 0.9 s verify. The target alone: 5 s prefill, then 0.3 s a pass.
    spec = RunStats.of([dataclasses.replace(e, draft_seconds=2.0 if e.round == 1 else 0.4,
                                            target_seconds=5.0 if e.round == 1 else 0.9)
                        for e in run([(4, 4), (4, 1), (4, 0), (4, 2)]).events])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), target_seconds=5.0 if i == 1 else 0.3)
                        for i in range(1, 9)])
    assert (spec.draft_pass_seconds, spec.target_pass_seconds) == (pytest.approx(0.1), pytest.approx(0.9))
    assert spec.cost_ratio == pytest.approx(0.1 / 0.9)
    # a hybrid whose n-gram drafted round 1: the draft first ran in round 2, on the whole prompt
    seconds = {1: 0.0, 2: 2.0}
    hybrid = RunStats.of([dataclasses.replace(e, draft_passes=max(0, e.draft_passes - 4),
                                              draft_seconds=seconds.get(e.round, 0.4)) for e in spec.events])
    assert hybrid.draft_pass_seconds == pytest.approx(0.1)  # (0.4 + 0.4) / 8: not (2 + 0.8) / 12
    assert target_line(spec, base) == pytest.approx((0.3, 0.0, 0.15))  # T(n) = 0.3 + 0.15 n
    # a round costs 4 * 0.1 + 0.9 = 1.3 s, the target alone 0.3 s a token: 4.33 tokens to break even
    assert break_even_tokens(4, 0.1 / 0.3, 0.15 / 0.3) == pytest.approx(1.3 / 0.3)
    even = k_prediction(spec, base=base).data[1]
    assert even.y[3] == pytest.approx(1.3 / 0.3) and "C_D = 0.33·T₀" in even.name and "+0.50·T₀" in even.name
    # no baseline and one width: nothing to fit, Leviathan's flat 1 + k C_D / C_T, said so
    assert target_line(spec) is None
    flat = k_prediction(spec).data[1]
    assert flat.y[3] == pytest.approx(1 + 4 * 0.1 / 0.9) and "assumes verifying" in flat.name


def test_a_run_whose_round_1_sits_across_the_break_even_from_the_rest_shows_both_points():
    """k = 4, 10 rounds: round 1 keeps all 4 drafts (5 tokens), the rest none (1 each): 14 tokens in
    10 passes, 1.4 a pass, above Leviathan's break-even 1 + 4 * 0.05 = 1.2 (4 draft passes of
    0.05 s, a 1 s verify); the rounds after round 1, which the break-even prices, make 9 in 9: 1.0,
    below it, as their speedup after round 1 reads. Both points are drawn; where both sides agree
    (2.75 and 2.0 against 1.2), only the run's."""
    from specviz.figures import k_prediction

    def priced(pattern):
        return RunStats.of([dataclasses.replace(e, draft_seconds=0.2, target_seconds=1.0)
                            for e in run(pattern).events])

    spec = priced([(4, 4)] + [(4, 0)] * 9)
    assert spec.cost_ratio == pytest.approx(0.05) and spec.tokens_per_pass == pytest.approx(1.4)
    names = {t.name.split(" (")[0]: t for t in k_prediction(spec).data}
    assert names["break-even 1 + k·C_D/C_T"].y[3] == pytest.approx(1.2)
    assert names["this run"].y == (pytest.approx(1.4),)
    after = names["this run after round 1"]
    assert after.x == (4,) and after.y == (pytest.approx(1.0),) and "1.00 a pass" in after.name
    typical = [t.name for t in k_prediction(priced([(4, 4), (4, 1), (4, 0), (4, 2)])).data]
    assert not any("after round 1" in name for name in typical)


def test_break_even_at_a_small_k_prices_the_baselines_one_token_pass():
    from specviz.figures import k_prediction

    # k = 2, every round keeps one draft (2 tokens a pass): 2 draft passes of 0.3 s and a 1.5 s
    # verify a round; the target alone 1.0 s a pass. A round costs 0.6 + 1.5 = 2.1 s where the
    # target alone makes 2.1 tokens: 2 tokens a pass is a loss (2 / 2.1 = 0.95x), not a win over
    # Leviathan's 1 + k C_D / C_T = 1 + 2 * 0.3 / 1.5 = 1.4.
    # (a last round the 22-token budget cut to one draft verifies 2 tokens in 1.3 s: not T(2))
    spec = RunStats.of([dataclasses.replace(e, draft_seconds=0.3 * e.k, draft_passes=2 * e.round - (e.k == 1),
                                            target_seconds=5.0 if e.round == 1 else 1.5 if e.k == 2 else 1.3)
                        for e in run([(2, 1)] * 10 + [(1, 1)]).events])
    assert spec.fixed_k == 2
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), target_seconds=5.0 if i == 1 else 1.0)
                        for i in range(1, 21)])
    assert target_line(spec, base) == pytest.approx((1.0, 0.0, 0.25))  # through T(0) = 1, T(2) = 1.5
    even = next(t for t in k_prediction(spec, base=base).data if t.name.startswith("break-even"))
    assert even.y[1] == pytest.approx(2.1) and spec.tokens_per_pass == 2.0
    # a verify pass timed below the one-token pass (noise on a GPU): the slope stops at 0, and the
    # label claims no exact k
    fast = RunStats.of([dataclasses.replace(e, target_seconds=0.9) for e in spec.events])
    assert target_line(fast, base) == pytest.approx((1.0, 0.0, 0.0))
    assert "exact at" not in next(t for t in k_prediction(fast, base=base).data if t.name.startswith("break"))
    assert "a line through the 1- and 3-token passes: exact at k=2, a guess elsewhere" in even.name
    # a k = 1 chain and its baseline fit too: T(0) = 1.0, T(1) = 1.2, C_D = 0.3: (0.3 + 1.2) / 1.0
    one = RunStats.of([dataclasses.replace(e, draft_seconds=0.3, target_seconds=5.0 if e.round == 1 else 1.2)
                       for e in run([(1, 1)] * 6).events])
    even = next(t for t in k_prediction(one, base=base).data if t.name.startswith("break-even"))
    assert even.y[0] == pytest.approx(1.5)
    # too few rounds at either end is still no line: Leviathan's, said so
    few = RunStats.of(spec.events[:3])
    assert target_line(few, base) is None
    assert "assumes verifying" in k_prediction(few, base=base).data[1].name


def test_break_even_prices_the_step_to_a_drafted_pass_where_the_run_spreads_its_drafts():
    from itertools import accumulate

    from specviz.figures import k_prediction

    # float32 on oneDNN here: the target alone 0.365 s a pass, any drafted pass 0.62 s + 0.02 s a
    # draft. An adaptive run drafting 1, 2, 1, 6, 7 and 7 tokens after round 1 (which teaches
    # nothing); draft passes 0.05 s each.
    lengths = [(4, 4), (1, 1), (2, 0), (1, 0), (6, 6), (7, 3), (7, 7)]
    passes = list(accumulate(k for k, _ in lengths))
    spec = RunStats.of([dataclasses.replace(e, draft_seconds=0.05 * e.k, draft_passes=passes[e.round - 1],
                                            target_seconds=9.0 if e.round == 1 else 0.62 + 0.02 * e.k)
                        for e in run(lengths).events])
    assert spec.draft_pass_seconds == pytest.approx(0.05)
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), target_seconds=5.0 if i == 1 else 0.365)
                        for i in range(1, 9)])
    assert target_line(spec, base) == pytest.approx((0.365, 0.255, 0.02))
    # k = 4: 4 * 0.05 + 0.62 + 0.08 = 0.9 s a round, the target alone 0.365 s a token
    assert break_even_tokens(4, 0.05 / 0.365, 0.02 / 0.365, 0.255 / 0.365) == pytest.approx(0.9 / 0.365)
    even = next(t for t in k_prediction(spec, base=base).data if t.name.startswith("break-even"))
    assert [round(y, 9) for y in even.y[:2]] == [round(0.69 / 0.365, 9), round(0.76 / 0.365, 9)]
    assert "any drafted pass +0.70·T₀" in even.name and "+0.05·T₀" in even.name
    # without the target alone's rounds there is no one-token pass to set the step against: the
    # drafted line alone, no step, and the label says what its T0 is
    assert target_line(spec) == pytest.approx((0.62, 0.0, 0.02))
    alone = next(t for t in k_prediction(spec).data if t.name.startswith("break-even"))
    assert "no one-token pass measured yet: T₀ is the drafted rounds' line at 0 drafts" in alone.name
    assert "no one-token pass" not in even.name


def test_the_run_tabs_plots_show_the_hand_counted_tokens_passes_and_seconds():
    from specviz.figures import all_figures

    # 5, 2 and 1 tokens in passes 1-3, ending at 1.5, 2.0 and 2.5 s; the target alone one token a
    # pass for 8 passes, 0.5 s each
    spec = RunStats.of([dataclasses.replace(e, elapsed=1.0 + 0.5 * e.round)
                        for e in run([(4, 4), (4, 1), (4, 0)]).events])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), elapsed=0.5 * i) for i in range(1, 9)])
    figures = all_figures(spec, base)
    bars = figures["tokens_per_pass"].data[0]
    assert (list(bars.x), list(bars.y)) == ([1, 2, 3], [5, 2, 1])
    assert figures["tokens_per_pass"].layout.shapes[0].y0 == 1.0  # the baseline's token a pass
    (fast, alone), (fast_t, alone_t) = figures["cumulative"].data, figures["time"].data
    assert (list(fast.x), list(fast.y)) == ([0, 1, 2, 3], [0, 5, 7, 8])  # from the origin
    assert (list(alone.x), list(alone.y)) == (list(range(9)), list(range(9)))
    assert (list(fast_t.x), list(fast_t.y)) == ([0, 1.5, 2.0, 2.5], [0, 5, 7, 8])
    assert (list(alone_t.x), list(alone_t.y)) == ([0.5 * i for i in range(9)], list(range(9)))


def test_the_pages_legend_entries_wrap_instead_of_running_off_the_plot():
    from specviz.figures import LEGEND_CHARS, all_figures, k_prediction

    spec = RunStats.of([dataclasses.replace(e, draft_seconds=0.6, target_seconds=1.5)
                        for e in run([(2, 1)] * 10).events])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), target_seconds=1.0)
                        for i in range(1, 21)])

    def even(data):
        return next(t.name for t in data if t.name.startswith("break-even"))

    long, shown = even(k_prediction(spec, base=base).data), even(all_figures(spec, base)["k_prediction"].data)
    assert len(long) > 1.5 * LEGEND_CHARS and shown.replace("<br>", " ") == long
    assert max(len(line) for line in shown.split("<br>")) <= LEGEND_CHARS


def test_a_legend_is_given_its_lines_below_the_plot_and_a_row_one_height():
    from specviz import figures as f

    # a 390 px plot's row is 320 px; an entry 48 px and 5.6 a character: "speculative" (109.6) and
    # "baseline" (92.8) fit in one; with 40 characters (272) among them they do not (528), and plotly
    # lays them out in columns as wide as the widest, 320 // 272 = 1 a row: 1 + 3 + 1 + 1 lines; nine
    # entries of at most 17 characters (143.2, the lab's variants) go 2 a row, 5 rows; in a 600 px
    # plot (530) 3 a row, 3 rows
    assert f.legend_lines(["speculative", "baseline"]) == 1
    assert f.legend_lines(["speculative", "a<br>b<br>c", "x" * 40, "baseline"]) == 1 + 3 + 1 + 1
    assert f.legend_lines(["x" * 48, "y"]) == 2
    nine = ["target p", "exact", "correction_from_p"] + ["y" * 12] * 6
    assert (f.legend_lines(nine), f.legend_lines(nine, f.PAGE_HALF_PX)) == (5, 3)
    fig = f.go.Figure(f.go.Bar(x=[1, 2], y=[2, 2], name="speculative"))
    f.fit_legend(fig)  # one trace: no legend, the layout's height
    assert fig.layout.height == f.PLOT_HEIGHT
    fig = f.tokens_per_pass(RunStats.of(run([(2, 1)] * 3).events))  # bars and the baseline's entry
    assert fig.layout.height == f.PLOT_HEIGHT + f.LINE_PX + 10
    spec = RunStats.of([dataclasses.replace(e, draft_seconds=0.6, target_seconds=1.5)
                        for e in run([(2, 1)] * 9 + [(1, 0)]).events])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), target_seconds=1.0)
                        for i in range(1, 21)])
    figures = f.all_figures(spec, base)
    k = figures["k_prediction"]
    lines = f.legend_lines([t.name for t in k.data])
    assert lines >= 6  # the break-even line's measured costs take three or more
    room = f.LINE_PX * lines + 10
    assert (k.layout.height, k.layout.margin.b) == (f.PLOT_HEIGHT + room, f.AXIS_TITLE_PX + room)
    assert (k.layout.legend.yref, k.layout.legend.y, k.layout.legend.yanchor) == ("container", 0, "bottom")
    assert figures["cumulative"].layout.height == f.PLOT_HEIGHT + f.LINE_PX + 10  # "speculative", "baseline"
    for row in f.ROWS[:2]:
        assert len({figures[name].layout.height for name in row}) == 1, row
    assert figures["acceptance"].layout.height == k.layout.height


def test_a_run_that_drafted_nothing_says_why_its_k_plot_is_empty():
    from specviz.figures import k_prediction

    fig = k_prediction(run([(0, 0)] * 4))  # an n-gram that never matched: one token a pass
    assert not fig.data and "no round drafted a token" in fig.layout.annotations[0].text
    assert not k_prediction(run([(4, 4), (4, 1)])).layout.annotations


def test_a_run_of_varying_k_is_plotted_at_its_mean_k():
    from specviz.figures import k_prediction

    spec = run([(4, 4), (2, 1), (0, 0), (4, 0)])  # 5 + 2 + 1 + 1 tokens in 4 passes
    names = {t.name: t for t in k_prediction(spec).data}
    point = names["this run (k varies by round: mean 2.5)"]
    assert (point.x[0], point.y[0]) == (2.5, pytest.approx(9 / 4))
    assert names["i.i.d. prediction for its rounds' k"].y[0] == pytest.approx(spec.predicted_tokens_per_pass)
    fixed = run([(4, 4), (4, 1), (3, 0)])  # the last round cut by the budget: still k = 4
    assert [t.x[0] for t in k_prediction(fixed).data if t.name == "this run"] == [4]
    # a budget of 10 tokens: from position 6 on, each round drafts what is left less one
    tail = run([(4, 4), (4, 0), (3, 0), (2, 0), (1, 0), (0, 0)]).events
    cut = RunStats.of(tail[:-1] + (dataclasses.replace(tail[-1], stop="length"),))
    assert cut.new_tokens == 10 and cut.fixed_k == 4
    assert [t.x[0] for t in k_prediction(cut).data if t.name == "this run"] == [4]
    # EOS as the budget's last token: the engine says "eos", and the rounds were still cut
    assert RunStats.of(tail[:-1] + (dataclasses.replace(tail[-1], stop="eos"),)).fixed_k == 4
    assert RunStats.of(tail).fixed_k is None  # the run goes on: those short rounds were chosen
    assert spec.fixed_k is None and run([]).fixed_k is None


def test_a_run_of_varying_k_gets_the_break_even_of_its_own_rounds():
    """The curve at the mean k prices every round at that many drafts; a round that drafted nothing
    is a one-token pass. Rounds of 0, 2 and 8 n-gram drafts (mean 10/3) at T0 = 1 s, a drafted
    pass 1.7 s + 0.05 s a draft: the run's bar is (2 * 1 + 2 * 1.8 + 2 * 2.1) / 6 = 1.633, where the
    curve says 1.867 at the mean, above the run's 1.833 tokens a pass though it is 1.12x faster."""
    from specviz.figures import k_prediction

    pattern = [(0, 0), (2, 2), (8, 0), (0, 0), (2, 1), (8, 2)] * 3
    events, position = [], 0
    for i, (k, accepted) in enumerate(pattern, 1):
        seconds = 5.0 if i == 1 else 1.0 if k == 0 else 1.7 + 0.05 * k  # round 1 reads the prompt
        events.append(dataclasses.replace(round_(i, position, k, accepted), source="ngram", draft_passes=0,
                                          target_seconds=seconds, round_seconds=seconds))
        position += accepted + 1
    spec = RunStats.of(events)
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), source="none", target_seconds=1.0)
                        for i in range(1, 40)])
    assert target_line(spec, base) == pytest.approx((1.0, 0.7, 0.05))
    names = {t.name: t for t in k_prediction(spec, base=base).data}
    bar = names["break-even for its rounds' k"]
    assert (bar.x[0], bar.y[0]) == (pytest.approx(10 / 3), pytest.approx((2 + 3.6 + 4.2) / 6))
    assert names["this run (k varies by round: mean 3.3)"].y[0] == pytest.approx(33 / 18)
    curve = next(t for t in k_prediction(spec, base=base).data if t.name.startswith("break-even 1 + Δ"))
    assert curve.y[2] == pytest.approx(1 + 0.7 + 3 * 0.05)  # k=3: the line's own, unchanged
    assert "break-even for its rounds' k" not in {t.name for t in k_prediction(run([(4, 4), (4, 1)])).data}


def test_a_hybrid_runs_own_break_even_charges_draft_passes_only_to_the_rounds_that_made_them():
    """A hybrid's n-gram rounds make no draft pass: priced at k C_D each, as the curve prices every
    round, the bar of a review's hybrid run read 3.24 where its rounds cost 2.175 one-token passes.
    Rounds: a model draft of 4 (4 passes at C_D = 0.3 s), an n-gram draft of 8 (none), nothing;
    T0 = 1 s, a drafted pass 1.7 s + 0.05 s a draft."""
    from specviz.figures import k_prediction, own_break_even

    pattern = [("draft", 4, 2), ("ngram", 8, 3), ("ngram", 0, 0)] * 4
    events, position, passes = [], 0, 0
    for i, (source, k, accepted) in enumerate(pattern, 1):
        passes += 4 if source == "draft" else 0
        seconds = 1.0 if k == 0 else 1.7 + 0.05 * k
        drafted = round_(i, position, k, accepted)
        events.append(dataclasses.replace(drafted, source=source, draft_passes=passes, target_seconds=seconds,
                                          draft_seconds=1.2 * (source == "draft"), round_seconds=seconds))
        position += accepted + 1
    spec = RunStats.of(events)
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), source="none", target_seconds=1.0)
                        for i in range(1, 40)])
    assert target_line(spec, base) == pytest.approx((1.0, 0.7, 0.05)) and spec.draft_pass_seconds == 0.3
    # model round: 1 + 0.7 + 4 * 0.05 + 4 * 0.3 = 3.1; n-gram: 1 + 0.7 + 8 * 0.05 = 2.1; nothing: 1
    assert own_break_even(spec.events, 0.3, 0.05, 0.7) == pytest.approx((3.1 + 2.1 + 1.0) / 3)
    bar = next(t for t in k_prediction(spec, base=base).data if t.name == "break-even for its rounds' k")
    assert bar.y[0] == pytest.approx((3.1 + 2.1 + 1.0) / 3) and bar.x[0] == pytest.approx(4.0)


def test_a_budget_cut_chain_that_ends_on_eos_before_the_budget_is_still_fixed_k():
    def ended(pattern, stop):
        events = run(pattern).events
        return RunStats.of(events[:-1] + (dataclasses.replace(events[-1], stop=stop),))

    # a budget of 10: positions 6 and 7 draft 10 - 6 - 1 = 3 and 2; EOS at position 8 ends it at 9
    assert ended([(4, 4), (4, 0), (3, 0), (2, 0), (1, 0)], "eos").fixed_k == 4
    # the cut rounds name different budgets (6 + 2 + 1 = 9, 7 + 2 + 1 = 10): chosen lengths
    assert ended([(4, 4), (4, 0), (2, 0), (2, 0), (1, 0)], "eos").fixed_k is None
    # a full round after a short one: the short one was chosen, not cut
    assert ended([(4, 4), (2, 0), (4, 0), (1, 0)], "eos").fixed_k is None
    # stopped on the budget: the cut rounds' budget is where the run ended (10, not 9)
    assert ended([(4, 4), (4, 0), (3, 0), (2, 0), (1, 0)], "length").fixed_k is None
    assert ended([(4, 4), (4, 0), (3, 0), (2, 0), (1, 1)], "length").fixed_k == 4
    # the last round must draft what the budget left it: 24 - 19 - 1 = 4, not 3
    assert ended([(8, 8), (8, 8), (5, 0), (3, 0)], "eos").fixed_k is None


def test_rounds_from_a_drafter_that_chooses_its_lengths_are_never_fixed_k():
    events = run([(8, 8), (8, 8), (5, 0), (4, 0)]).events  # shaped like a budget of 24 cut it
    chain = events[:-1] + (dataclasses.replace(events[-1], stop="eos"),)
    assert RunStats.of(chain).fixed_k == 8
    for source in ("ngram", "adaptive"):
        assert RunStats.of([dataclasses.replace(e, source=source) for e in chain]).fixed_k is None
    mixed = (dataclasses.replace(chain[0], source="ngram"),) + chain[1:]  # a hybrid's rounds
    assert RunStats.of(mixed).fixed_k is None


def test_drafts_accepted_past_an_eos_count_nowhere():
    """The rule accepted 4 drafts, but the second was an EOS: the output kept 2, and the refusal
    after the kept drafts of another round lies past its EOS. α, the acceptance by position and
    the histogram describe the output that tokens per pass counts."""
    from dataclasses import replace

    eos_kept = replace(round_(2, 5, 4, 4), new_tokens=[7, 2], stop="eos")  # EOS = draft 2 of 4
    stats = RunStats.of([round_(1, 0, 4, 4), eos_kept])
    assert (stats.accepted, stats.rejections, stats.new_tokens) == (6, 0, 7)  # by hand: 4 + 2
    assert stats.alpha == 1.0 and stats.tokens_per_pass == 3.5
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0, 1.0]  # round 2 reached positions 1-2 only
    assert stats.accepted_histogram == {0: 0, 1: 0, 2: 1, 3: 0, 4: 1}
    refused_past = replace(round_(2, 5, 4, 2), new_tokens=[7, 2], stop="eos")  # EOS = draft 2; 3 refused
    stats = RunStats.of([round_(1, 0, 4, 1), refused_past])
    assert (stats.accepted, stats.rejections) == (3, 1)  # round 1's refusal only
    assert stats.alpha == pytest.approx(3 / 4)
    assert stats.acceptance_by_position == [1.0, 0.5, None, None]
    # the drafts that could have become output: round 1's k, and in round 2 the one before its EOS
    # (the rule kept 2 drafts, EOS the second, so no correction follows it: kept == new tokens)
    assert [reach(e) for e in stats.events] == [4, 1]
    target_eos = replace(round_(2, 5, 4, 2), new_tokens=[7, 8, 2], stop="eos")  # EOS is the target's
    assert RunStats.of([target_eos]).rejections == 1 and RunStats.of([target_eos]).accepted == 2


def test_a_round_an_accepted_eos_ended_is_predicted_at_its_reach():
    """k=4, α = 1: round 1 keeps its 4 drafts (5 tokens); round 2's rule accepts all 4, but draft 1
    is the EOS, so the output ends there (1 token) and α leaves drafts 2-4 out. By hand the
    prediction is (5 + 1) / 2 = 3.0 a pass, the run's own, not 5 (each round at k = 4); the
    figure plots it beside the run, as for a budget cut. An EOS the target gave (its correction)
    ends no drafts early: that round is predicted at its k."""
    from dataclasses import replace

    from specviz import figures

    first_is_eos = replace(round_(2, 5, 4, 4), new_tokens=[2], stop="eos")
    stats = RunStats.of([round_(1, 0, 4, 4), first_is_eos])
    assert (stats.alpha, stats.tokens_per_pass, reach(first_is_eos)) == (1.0, 3.0, 0)
    assert stats.predicted_tokens_per_pass == pytest.approx(3.0)
    points = {t.name: (t.x[0], t.y[0]) for t in figures.k_prediction(stats).data if t.mode == "markers"}
    assert points == {"this run": (4, 3.0),
                      "i.i.d. prediction for its rounds' reach (the budget or an EOS cut the last)": (4, 3.0)}
    second = replace(round_(2, 5, 4, 4), new_tokens=[7, 2], stop="eos")  # EOS = draft 2 of 4
    assert RunStats.of([round_(1, 0, 4, 4), second]).predicted_tokens_per_pass == pytest.approx((5 + 2) / 2)
    target_eos = replace(round_(2, 5, 4, 2), new_tokens=[7, 8, 2], stop="eos")
    a = 2 / 3  # 2 kept, 1 refused
    assert reach(target_eos) == 4
    assert RunStats.of([target_eos]).predicted_tokens_per_pass == pytest.approx((1 - a ** 5) / (1 - a))


def test_a_budget_cut_chain_plots_the_prediction_for_the_rounds_it_ran():
    """k=8 and a 16-token budget: 9 tokens, then 7 (the budget let round 2 draft 6). α = 1, so
    the curve says 9 a pass at k=8 where this run could make (9 + 7) / 2 = 8: that is plotted too."""
    from specviz import figures

    stats = run([(8, 8), (6, 6)])
    assert stats.fixed_k == 8 and stats.tokens_per_pass == 8.0
    points = {t.name: (t.x[0], t.y[0]) for t in figures.k_prediction(stats).data if t.mode == "markers"}
    assert points["this run"] == (8, 8.0)
    assert points["i.i.d. prediction for its rounds' reach (the budget or an EOS cut the last)"] == (8, 8.0)
    full = {t.name for t in figures.k_prediction(run([(4, 4), (4, 4)])).data}
    assert not any("budget cut" in name for name in full)  # nothing cut: the curve is the prediction


def test_the_plots_print_alpha_as_the_table_does_never_rounded_onto_all():
    from specviz.figures import acceptance_by_position, k_prediction

    spec = run([(1, 1)] * 249 + [(1, 0)])  # α = 249 / 250: "1.00" said nothing was refused
    assert spec.alpha == pytest.approx(0.996)
    assert acceptance_by_position(spec).data[1].name == "per-token α = 99.6%"
    assert k_prediction(spec).data[0].name == "i.i.d. prediction at α = 99.6%"


def test_a_plots_reference_levels_are_named_in_its_legend_never_written_over_its_bars():
    """The acceptance plot's "per-token α = 92.3%" sat on its dotted line at the right, over
    position 3's "11/12" and the top of position 4's bar (seen in chromium on the embedded pair);
    the baseline's label on the tokens-per-pass plot hid the bars it crossed. Each level (the tree
    plot's "target alone" too: 1 token a pass) is a line across the plot (a shape at its y) and a
    legend entry drawn as that line, no text on it; α's line runs beneath the bars' counts it
    crosses."""
    from specviz import figures

    spec = run([(4, 3), (4, 4), (2, 0), (4, 4)])  # kept 3 + 4 + 0 + 4 = 11, refused 1 + 1: α = 11/13
    assert spec.alpha == pytest.approx(11 / 13)
    for fig, y, name, dash, layer in (
            (figures.acceptance_by_position(spec), 11 / 13, "per-token α = 84.6%", "dot", "below"),
            (figures.tokens_per_pass(spec), 1.0, "baseline: 1 token/pass", "dash", "above"),
            (figures.tree_vs_chain(spec, spec, 4), 1.0, "target alone", "dash", "above")):
        assert not fig.layout.annotations  # nothing written inside the plot
        (line,) = fig.layout.shapes
        assert (line.y0, line.y1, line.line.dash, line.layer) == (pytest.approx(y), pytest.approx(y), dash,
                                                                  layer)
        entry = fig.data[1]
        assert (entry.name, entry.mode, entry.line.dash, entry.line.color) == (name, "lines", dash,
                                                                              line.line.color)
        assert fig.layout.height > figures.PLOT_HEIGHT  # the legend below the axis has its room


def test_a_baseline_that_measured_no_time_draws_no_break_even_line():
    from specviz.figures import k_prediction

    # a chain at k=4, 0.5 s a verify pass, beside a target alone whose passes took 0.0 s (a trace
    # may say so): no T0 to divide by, so no fitted line (the replay view raised ZeroDivisionError);
    # Leviathan's 1 + k C_D/C_T from the run's own passes instead
    spec = RunStats.of([dataclasses.replace(e, target_seconds=0.5, draft_seconds=0.1)
                        for e in run([(4, 4)] * 5).events])
    base = RunStats.of([round_(i, i - 1, 0, 0) for i in range(1, 8)])
    assert all(e.target_seconds == 0.0 for e in base.events)
    assert target_line(spec, base) is None
    names = [t.name for t in k_prediction(spec, base=base).data]
    assert [name for name in names if name.startswith("break-even")] == [
        "break-even 1 + k·C_D/C_T (C_D/C_T=0.05; assumes verifying k tokens costs one pass)"]


def test_each_bar_of_tokens_per_pass_is_the_tokens_its_round_committed():
    """Round 1 keeps all 4 drafts and the bonus (5 tokens); round 2 accepts 4 too, but an EOS
    (its second draft) cuts it at 2 tokens: its bar is 2, not accepted + 1 = 5. (Only an EOS cuts
    a round there: the budget leaves room for the target's token.)"""
    from specviz.figures import tokens_per_pass

    events = list(run([(4, 4), (4, 1)]).events)
    events[-1] = dataclasses.replace(events[-1], accepted=4, kind="bonus", new_tokens=[0, 1], stop="eos")
    fig = tokens_per_pass(RunStats.of(events))
    assert list(fig.data[0].x) == [1, 2] and list(fig.data[0].y) == [5, 2]


def test_the_race_over_outputs_of_different_lengths_says_the_rate_after_the_prompts_reading():
    """A sampled run stops at its own EOS: 8 tokens against the target alone's 64, each after a
    1 s prompt read, raced at 8 / 1.4 s against 64 / 7.4 s = 0.66x, though each later token came
    twice as fast (6 in 0.3 s against 63 in 6.3 s). The status line now says both."""
    from specviz.views import race_text

    spec = RunStats.of([dataclasses.replace(round_(i, 2 * (i - 1), 1, 1), elapsed=1.0 + 0.1 * i,
                                            stop="eos" if i == 4 else None) for i in range(1, 5)])
    base = RunStats.of([dataclasses.replace(round_(i, i - 1, 0, 0), elapsed=1.0 + 0.1 * i,
                                            stop="length" if i == 64 else None) for i in range(1, 65)])
    assert (spec.new_tokens, base.new_tokens) == (8, 64)
    assert (8 / 1.4) / (64 / 7.4) == pytest.approx(0.6607, abs=1e-4)
    assert race_text(spec, base) == ("0.66× the target alone over outputs of 8 and 64 tokens; "
                                     "2.00× after the prompt's reading")
    same = RunStats.of(base.events[:8])  # equal lengths: the speedup alone
    assert race_text(same, same) == "1.00× the target alone"
    assert race_text(spec, RunStats.of([dataclasses.replace(e, elapsed=0.0) for e in base.events])) \
        == "no time measured"
