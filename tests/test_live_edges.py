"""Live runs at edges the constructed-event tests do not reach: every drafter's figures where EOS
is common enough that the rule accepts a drafted EOS, and the README's seed promise under a clock
that never repeats."""

import dataclasses
import random
import time
from collections import Counter

import pytest

import specviz
from specviz.engine import RoundEvent
from specviz.metrics import RunStats
from specviz.theory import expected_tokens_per_pass
from specviz.tree import REJECTED

PROMPT = "def fibonacci(n):\n    if n < 2:"


def run(pair, prompt=PROMPT, **kw):
    return [e for e in specviz.generate(pair, prompt, **kw) if isinstance(e, RoundEvent)]


def restated(events, eos_ids):
    """RunStats' figures from the events, by the rules written out again here (kept drafts end at
    the output's end): a second statement of each rule, which catches the two drifting apart on
    live runs; each rule itself is pinned by hand on constructed events (test_metrics.py,
    test_treeview.py, test_round_fields.py)."""
    kept = [min(e.accepted, len(e.new_tokens)) for e in events]
    rejections = sum(sum(n.fate == REJECTED and n.depth <= len(e.new_tokens) for n in e.tree) if e.tree
                     else int(e.accepted < e.k and len(e.new_tokens) > e.accepted) for e in events)
    nodes = sum(len(e.tree) if e.tree else e.k for e in events)
    alpha = sum(kept) / (sum(kept) + rejections) if sum(kept) + rejections else 0.0
    top = max(e.k for e in events)
    by_position = []
    for i in range(1, top + 1):
        reached = [kp for e, kp in zip(events, kept, strict=True)
                   if e.k >= i and kp >= i - 1 and len(e.new_tokens) >= i]
        by_position.append(sum(kp >= i for kp in reached) / len(reached) if reached else None)

    def reach(e):  # up to a drafted EOS the rule accepted, else the round's k
        return next((j for j, t in enumerate(e.draft_tokens[: e.accepted]) if t in eos_ids), e.k)

    predicted = (None if any(e.tree for e in events)
                 else sum(expected_tokens_per_pass(alpha, reach(e)) for e in events) / len(events))
    return {"tokens_per_pass": sum(map(len, (e.new_tokens for e in events))) / events[-1].target_passes,
            "alpha": alpha, "acceptance_rate": sum(kept) / nodes if nodes else 0.0,
            "rejections": rejections, "acceptance_by_position": by_position,
            "predicted_tokens_per_pass": predicted}


@pytest.mark.parametrize("proposer", ["draft", "hybrid", "adaptive", "tree", "ngram", "none"])
def test_every_drafters_figures_hold_where_the_rule_accepts_a_drafted_eos(pair, proposer):
    """EOS set to each of the target's commonest tokens in turn: runs end on it, often on a
    drafted EOS the rule accepted with drafts after it. Every figure agrees with the rules restated
    from the events, and greedy output is the target's own, cut at the EOS."""
    common = [t for t, _ in Counter(RunStats.of(run(pair, proposer="none", max_new_tokens=40)).tokens)
              .most_common(6)]
    config = pair.target.generation_config
    old, drafted_eos = config.eos_token_id, 0
    try:
        for eos in common:
            config.eos_token_id = eos
            stop_pair = dataclasses.replace(pair)  # eos_ids read afresh
            alone = RunStats.of(run(stop_pair, proposer="none", max_new_tokens=40)).tokens
            for temperature in (0.0, 0.7):
                events = run(stop_pair, proposer=proposer, k=4, max_new_tokens=40, temperature=temperature,
                             seed=1)
                stats, hand = RunStats.of(events), restated(events, stop_pair.eos_ids)
                for name, value in hand.items():
                    assert getattr(stats, name) == pytest.approx(value), (eos, temperature, name)
                if temperature == 0:
                    assert stats.tokens == alone and stats.stop == "eos"
                last = events[-1]
                drafted_eos += last.stop == "eos" and last.accepted >= len(last.new_tokens)
    finally:
        config.eos_token_id = old
    if proposer in ("draft", "hybrid", "adaptive", "tree"):
        assert drafted_eos  # the case this test is for was reached


@pytest.mark.parametrize("shape", [dict(proposer="draft", k=3), dict(proposer="tree", k=3, nodes=5),
                                   dict(proposer="tree", k=4, nodes=12),
                                   dict(proposer="tree", k=2, nodes=1, branching=1)])
def test_a_seed_repeats_a_fixed_size_drafters_sampled_run_whatever_the_clock_says(pair, monkeypatch, shape):
    """README: at temperature > 0 the seed repeats a run's text with the draft model and with a
    token tree whose nodes are set (the auto width included): nothing they draft may depend on
    measured time. Three runs under three clocks (one nearly steady, two with heavy-tailed jumps)
    give one text; the adaptive drafter or an auto-sized tree under these clocks draw differently."""
    real = time.perf_counter
    texts = []
    for trial in range(3):
        rng, drift = random.Random(trial), [0.0]

        def jittery(rng=rng, drift=drift, scale=0.5 if trial else 0.001):
            drift[0] += rng.random() ** 4 * scale
            return real() + drift[0]

        monkeypatch.setattr(time, "perf_counter", jittery)
        texts.append([e.new_tokens for e in run(pair, max_new_tokens=40, temperature=1.0, seed=11, **shape)])
        monkeypatch.undo()
    assert texts[0] == texts[1] == texts[2]
