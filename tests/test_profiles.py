"""Cost profiles: exact projections against hand computations, round trips, hostile files refused."""

import copy
import json
import math
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specviz import benchreport, explorer, labview, profiles
from specviz.bench import Record

# eager: C_D 2 ms, C_T 10 / 14 / 18 ms at widths 1 / 3 / 5; fast: no draft cost measured
PROFILE = {
    "format": "specviz-costs", "version": 1, "name": "hand-made", "created": "2026-11-30", "quick": False,
    "note": "made up for the tests",
    "hardware": {"device": "cuda", "name": "Test GPU", "memory_gib": 80.0, "cpus": 8, "copy_gbs": 3000.0},
    "packages": {"torch": "2.11.0", "transformers": "5.17.0", "python": "3.12.3", "cuda": "13.0"},
    "models": {"target": {"name": "t", "params": 10, "weight_bytes": 20, "dtype": "bfloat16"}},
    "paths": {"eager": {"cache": "dynamic", "compiled": False, "draft_ms": 2.0,
                        "target_ms": {"1": 10.0, "3": 14.0, "5": 18.0}},
              "fast": {"cache": "static", "compiled": True, "draft_ms": None, "target_ms": {"1": 1.0}}},
}


def profile():
    return profiles.load(copy.deepcopy(PROFILE))


def test_target_cost_interpolates_over_verify_width():
    eager = profile().path("eager")
    assert [round(eager.target_seconds(w) * 1e3, 9) for w in (1, 2, 3, 4, 5)] == [10, 12, 14, 16, 18]
    assert round(eager.target_seconds(7) * 1e3, 9) == 22  # past the widest: the last segment's slope
    assert profile().path("fast").target_seconds(9) == 1e-3  # one width: flat
    raw = copy.deepcopy(PROFILE)  # noisy widest widths that fall: flat past them, never below
    raw["paths"]["fast"].update(target_ms={"1": 10.0, "3": 12.0, "5": 8.0})
    falling = profiles.load(raw).path("fast")
    assert [falling.target_seconds(w) for w in (4, 5, 9, 17)] == [0.01, 0.008, 0.008, 0.008]
    with pytest.raises(ValueError, match="positive integer"):
        eager.target_seconds(0)


def hand_recording():
    # the target's output and the draft's guess at each position; the draft is wrong at position 1
    return explorer.Recording("draft", [7, 8], [1, 2, 3, 4, 5, 6], [1, 9, 3, 4, 5, 6], 0.5, 1.0, 6)


def test_projection_of_a_replay_matches_a_hand_computation():
    rep = explorer.replay(hand_recording(), 2)
    # round 1 drafts [1, 9]: keeps 1, width 3; round 2 drafts [3, 4]: keeps both, width 3;
    # round 3 has a budget of 0 drafts (6 - 5 - 1): width 1
    assert [(r.k, r.accepted, r.committed) for r in rep.rounds] == [(2, 1, 2), (2, 2, 3), (0, 0, 1)]
    assert profiles.passes_of(rep) == profiles.Passes(4, {3: 2, 1: 1}, k=2)
    assert math.isclose(profiles.project(rep, profile(), "eager"), (4 * 2 + 2 * 14 + 10) / 1e3)
    with pytest.raises(ValueError, match="no draft cost"):
        profiles.project(rep, profile(), "fast")
    with pytest.raises(ValueError, match="pick one of eager, fast"):
        profiles.project(rep, profile(), "graphed")


def test_projection_of_engine_events_counts_their_passes(pair):
    import specviz

    events = list(specviz.generate(pair, "def fibonacci(n):", proposer="draft", k=3, max_new_tokens=12))
    expect = sum(profile().path("eager").target_seconds(e.k + 1) for e in events) \
        + events[-1].draft_passes * 2e-3
    assert math.isclose(profiles.project(events, profile(), "eager"), expect)
    assert profiles.passes_of(events).target == len(events)


def test_projection_of_a_tree_run_charges_every_verified_node(pair):
    import specviz

    events = list(specviz.generate(pair, "def fibonacci(n):", proposer="tree", k=3, nodes=7,
                                   max_new_tokens=12))
    assert any(len(e.tree) > e.k for e in events)  # wider than its walked branch
    expect = sum(profile().path("eager").target_seconds(len(e.tree) + 1) for e in events) \
        + events[-1].draft_passes * 2e-3
    assert math.isclose(profiles.project(events, profile(), "eager"), expect)


def test_a_tree_run_on_a_compiled_path_is_charged_its_padded_width():
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(draft_ms=1.0, target_ms={"1": 1.0, "9": 2.0, "17": 4.0})
    costs = profiles.load(raw)
    # 3 and 5 nodes pad to 4 and 8 (widths 5 and 9), 9 nodes to 16 (width 17); 6 draft passes
    # (round 1, the widest, reads the prompt eager: the eager path's C_T(10) = 28 and C_D = 2)
    tree = profiles.Passes(6, {4: 1, 6: 2, 10: 1}, tree=True)
    assert math.isclose(profiles.project(tree, costs, "fast"), (1.5 + 2 * 2.0 + 28 + 2.0 + 5 * 1.0) / 1e3)
    # a round that drafted no tree is a 1-token pass, not a padded 2-token one
    last = profiles.Passes(6, {4: 1, 6: 2, 10: 1, 1: 1}, tree=True)
    assert math.isclose(profiles.project(last, costs, "fast"),
                        (1.5 + 2 * 2.0 + 28 + 1.0 + 2.0 + 5 * 1.0) / 1e3)
    # the same widths from a chain, and the eager path, are charged as fed: C_T(4), C_T(6), C_T(10)
    chain = profiles.Passes(6, {4: 1, 6: 2, 10: 1})
    assert math.isclose(profiles.project(chain, costs, "fast"), (1.375 + 2 * 1.625 + 28 + 2.0 + 5.0) / 1e3)
    assert math.isclose(profiles.project(tree, costs, "eager"), (16 + 2 * 20 + 28 + 6 * 2.0) / 1e3)


def test_a_chain_verify_narrower_than_k_is_charged_the_padded_k_plus_1_on_a_compiled_path():
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(draft_ms=1.0, target_ms={"1": 1.0, "9": 2.0, "17": 4.0})
    costs = profiles.load(raw)
    # k=4: two verifies of 2 drafts (width 3) pad to 5, a full one is 5, the last round's 1 stays
    # 1; C_T(5) = 1 + (5 - 1) / (9 - 1) * (2 - 1) = 1.5 ms
    chain = profiles.Passes(6, {3: 2, 5: 1, 1: 1}, k=4)
    assert [profiles.fed(w, chain, True) for w in (1, 2, 3, 4, 5, 6)] == [1, 5, 5, 5, 5, 6]
    # round 1's verify of 5 reads the prompt eager: the eager path's C_T(5) = 18 and C_D = 2
    assert math.isclose(profiles.project(chain, costs, "fast"), (2 * 1.5 + 18 + 1.0 + 2.0 + 5 * 1.0) / 1e3)
    # eager feeds each verify as it is: the run's k changes nothing there
    assert profiles.project(chain, costs, "eager") == profiles.project(replace(chain, k=0), costs, "eager")
    # an n-gram run's events: no draft passes, the widest chain stands for the run's k
    events = [SimpleNamespace(k=k, draft_passes=0, nodes=k, tree=()) for k in (2, 4, 1, 0)]
    assert profiles.passes_of(events) == profiles.Passes(0, {3: 1, 5: 1, 2: 1, 1: 1}, k=4)
    assert math.isclose(profiles.project(events, costs, "fast"), (2 * 1.5 + 18 + 1.0) / 1e3)


def test_on_a_compiled_path_round_1_reads_the_prompt_at_the_eager_paths_price():
    """Round 1 feeds the prompt and its drafts, a width no step is compiled for: the engine runs
    it eager, the draft's first pass too. Priced at the fast path's C_T(k + 1) and C_D, a 64-token
    draft-4 run on the H200's profile came out 16% short, and its speedup 1.12x for about 1.05x."""
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(draft_ms=1.7, target_ms={"1": 3.0, "5": 3.5})
    raw["paths"]["eager"].update(draft_ms=14.0, target_ms={"1": 16.0, "5": 18.0})
    costs = profiles.load(raw)
    one_round = profiles.Passes(4, {5: 1}, k=4)  # 4 drafts, one verify of 5
    assert math.isclose(profiles.project(one_round, costs, "fast"), (18.0 + 14.0 + 3 * 1.7) / 1e3)
    alone = profiles.Passes(0, {1: 64})  # the target alone: round 1 eager, 63 replayed passes
    assert math.isclose(profiles.project(alone, costs, "fast"), (16.0 + 63 * 3.0) / 1e3)
    assert math.isclose(profiles.project(one_round, costs, "eager"), (18.0 + 4 * 14.0) / 1e3)
    del raw["paths"]["eager"]  # a profile without an eager path: every pass at the fast price
    assert math.isclose(profiles.project(one_round, profiles.load(raw), "fast"), (3.5 + 4 * 1.7) / 1e3)


def test_projection_table_per_drafter_matches_a_hand_computation():
    rows = {r["drafter"]: r for r in profiles.projection(profile(), "eager")}
    t4 = profiles.CPU_TOKENS_PER_PASS["draft-4"]
    assert math.isclose(rows["draft-4"]["ms_per_token"], (4 * 2 + 18) / t4)
    assert math.isclose(rows["draft-4"]["speedup"], 10 / ((4 * 2 + 18) / t4))
    # the n-gram's 311 passes at their own widths (sum of widths 1778), C_T(w) = 8 + 2w, 453 tokens
    assert math.isclose(rows["ngram-8"]["ms_per_token"], (8 * 311 + 2 * 1778) / 453)
    # no C_D measured on the fast path: no draft-model rows (priced at no draft time, draft-4 read
    # 3.9x there); the n-gram's, which needs no draft pass, stays: C_T(9) = C_T(1) = 1 ms
    fast = {r["drafter"]: r for r in profiles.projection(profile(), "fast")}
    assert list(fast) == ["ngram-8"] and math.isclose(fast["ngram-8"]["speedup"], 453 / 311)


def test_an_ngram_row_prices_each_round_at_the_width_the_path_feeds():
    """A round whose lookup found nothing is a 1-token pass, on a compiled path too: priced at
    C_T(k+1) every round, the H200's n-gram row read 1.26x where its rounds give 1.29x."""
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(target_ms={"1": 1.0, "9": 2.0})  # C_T(w) = 1 + (w - 1) / 8 ms
    costs = profiles.load(raw)
    widths = {"ngram-8": {1: 2, 3: 1, 9: 1}}  # 4 passes: two found nothing, one found 2, one 8
    tokens = {"ngram-8": 2.0}  # 8 tokens
    fast = profiles.projection(costs, "fast", tokens, widths)[0]
    assert math.isclose(fast["ms_per_token"], (2 * 1.0 + 2 * 2.0) / 8)  # the 3 padded to 9
    assert math.isclose(fast["speedup"], 8 / 6) and not fast["extrapolated"]
    eager = profiles.projection(costs, "eager", tokens, widths)[0]  # each at its own width
    assert math.isclose(eager["ms_per_token"], (2 * 10 + 14 + 26) / 8) and eager["extrapolated"]
    plain = profiles.projection(costs, "fast", tokens, {})[0]  # no widths: every round C_T(k+1)
    assert math.isclose(plain["ms_per_token"], 2.0 / 2.0)


def test_tokens_per_pass_are_the_shipped_cpu_benchmarks():
    docs = profiles.SHIPPED.parent.parent / "docs"
    data = json.loads((docs / "bench-cpu-2026-11-30.json").read_text())
    for drafter, tokens in profiles.CPU_TOKENS_PER_PASS.items():
        if drafter not in profiles.CPU_ROUND_WIDTHS:
            assert abs(data["summary"][f"specviz:{drafter}"]["all"]["tokens_per_pass"] - tokens) < 1e-4
    data = json.loads((docs / "bench-hf-cpu-2026-12-07.json").read_text())
    for drafter, widths in profiles.CPU_ROUND_WIDTHS.items():
        records = [r for r in data["records"] if r["method"] == f"specviz:{drafter}"]
        summed = Counter()
        for r in records:
            summed.update({int(w): n for w, n in r["widths"].items()})
        assert len(records) == 8 and dict(summed) == widths
        per_pass = sum(r["tokens"] for r in records) / summed.total()
        assert math.isclose(profiles.CPU_TOKENS_PER_PASS[drafter], per_pass)
        assert math.isclose(data["summary"][f"specviz:{drafter}"]["all"]["tokens_per_pass"], per_pass)


def test_profile_round_trips_through_a_file(tmp_path):
    p = profile()
    path = profiles.save(p, tmp_path / "x.json")
    assert profiles.load(path) == p and profiles.load(path.read_text()) == p
    assert profiles.load(path.read_bytes()).to_dict() == p.to_dict()
    # a str is a path (the CLI's --profile) unless it reads as JSON text, leading blanks and all
    assert profiles.load(str(path)) == p and profiles.load("\n  " + path.read_text()) == p
    assert profiles.shipped(tmp_path) == ["x"] and profiles.load_shipped("x", tmp_path) == p


def test_shipped_profiles_load_and_have_both_paths():
    names = profiles.shipped()
    assert names, "ship the measured profile(s) in assets/profiles/"
    for name in names:
        p = profiles.load_shipped(name)
        assert set(p.paths) == {"eager", "fast"} and not p.quick and p.path("eager").draft_ms
        assert p.name == name


def mutate(path: list, value):
    data = copy.deepcopy(PROFILE)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


HOSTILE = {
    "NaN cost": mutate(["paths", "eager", "target_ms", "1"], float("nan")),
    "infinite cost": mutate(["paths", "eager", "target_ms", "3"], float("inf")),
    "negative cost": mutate(["paths", "eager", "draft_ms", ], -1.0),
    "zero cost": mutate(["paths", "eager", "target_ms", "1"], 0),
    "huge cost": mutate(["paths", "eager", "target_ms", "1"], 1e300),
    "bool cost": mutate(["paths", "eager", "target_ms", "1"], True),
    "string cost": mutate(["paths", "eager", "target_ms", "1"], "10"),
    "no width 1": mutate(["paths", "eager", "target_ms", "1"], KeyError),
    "width 0": mutate(["paths", "eager", "target_ms", "0"], 1.0),
    "width 66": mutate(["paths", "eager", "target_ms", "66"], 1.0),
    "width text": mutate(["paths", "eager", "target_ms", "wide"], 1.0),
    "unknown top key": mutate(["extra"], 1),
    "unknown path key": mutate(["paths", "eager", "script"], "x"),
    "unknown hardware key": mutate(["hardware", "owner"], "x"),
    "unknown package": mutate(["packages", "gradio"], "6"),
    "unknown model role": mutate(["models", "judge"], {}),
    "bad cache": mutate(["paths", "eager", "cache"], "paged"),
    "compiled not bool": mutate(["paths", "eager", "compiled"], "yes"),
    "no paths": mutate(["paths"], {}),
    "too many paths": mutate(["paths"], {f"p{i}": {"target_ms": {"1": 1.0}} for i in range(9)}),
    "path name with a slash": mutate(["paths"], {"../x": {"target_ms": {"1": 1.0}}}),
    "path not an object": mutate(["paths", "eager"], [1, 2]),
    "name with markup": mutate(["name"], "<b>x</b>"),
    "empty name": mutate(["name"], ""),
    "control character": mutate(["hardware", "name"], "GPU\x1b[31m"),
    "long note": mutate(["note"], "x" * 501),
    "wrong format": mutate(["format"], "specviz-trace"),
    "version 2": mutate(["version"], 2),
    "version true": mutate(["version"], True),  # True == 1 in Python: refused by its type, as a trace's
    "version 1.0": mutate(["version"], 1.0),
    "quick not bool": mutate(["quick"], 1),
    "negative cpus": mutate(["hardware", "cpus"], -1),
    "float params": mutate(["models", "target", "params"], 1.5),
    "top level list": [PROFILE],
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_profiles_are_refused_naming_the_problem(case):
    with pytest.raises(ValueError, match="profile|cost profile"):
        profiles.load(HOSTILE[case])
    with pytest.raises(ValueError):  # the same through the JSON text path
        profiles.load(json.dumps(HOSTILE[case]))


def test_hostile_files_are_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps(PROFILE | {"note": "x" * 70_000}))
    missing = tmp_path / "missing.json"
    for source, match in [(big, "at most 64 KiB"), (str(big), "at most 64 KiB"),
                          (big.read_text(), "at most 64 KiB"),
                          (missing, "cannot read"), (str(missing), "cannot read"),
                          ("{not json", "must be JSON"), ("[" * 100_000 + "]" * 100_000, "KiB|JSON"),
                          ("[" * 30_000, "JSON")]:
        with pytest.raises(ValueError, match=match):
            profiles.load(source)
    for name in ("../etc/passwd", "hand-made", None, 3, ["x"]):
        with pytest.raises(ValueError, match="no shipped cost profile"):
            profiles.load_shipped(name, tmp_path)


def test_a_profile_of_exactly_64_kib_loads_and_one_byte_more_is_refused(tmp_path):
    """The cap is on what is over 64 KiB: a profile padded to 65,536 bytes loads from a file, as
    text and as bytes; at 65,537 each is refused."""
    text = json.dumps(PROFILE)
    at_cap = text + " " * ((64 << 10) - len(text))  # JSON's trailing whitespace
    path = tmp_path / "at-cap.json"
    path.write_text(at_cap)
    assert len(at_cap) == path.stat().st_size == 65_536
    for source in (path, str(path), at_cap, at_cap.encode()):
        assert profiles.load(source) == profile()
    path.write_text(at_cap + " ")
    accented = json.dumps(dict(PROFILE, note="é"), ensure_ascii=False)  # 65,536 characters, 65,537
    accented += " " * ((64 << 10) - len(accented))  # bytes in UTF-8, as a file saves them
    for source in (path, at_cap + " ", (at_cap + " ").encode(), accented):
        with pytest.raises(ValueError, match="a cost profile is at most 64 KiB"):
            profiles.load(source)


def test_short_json_text_of_a_list_is_read_as_json_not_opened_as_a_file_name():
    """Text starting with "[" is JSON, as with "{": refused for what it holds (a list, not the
    profile's object), not as a file that cannot be read."""
    with pytest.raises(ValueError, match=r"profile field \(top level\) must be an object"):
        profiles.load(json.dumps([PROFILE]))


def test_a_file_that_gives_no_size_is_read_no_further_than_the_limit(tmp_path):
    """A special file reports size 0 and may never end (bench --profile /dev/zero): the size check
    passed it and the whole stream was read into memory, a MemoryError's traceback, or the machine's
    memory. A pipe stands in for it here, fed up to 16 MiB: the load stops one byte past 64 KiB."""
    import os
    import threading

    fifo = tmp_path / "stream.json"
    os.mkfifo(fifo)
    written = [0]

    def feed():
        chunk = b" " * (64 << 10)
        try:
            with open(fifo, "wb") as f:
                while written[0] < 16 << 20:
                    f.write(chunk)
                    f.flush()
                    written[0] += len(chunk)
        except BrokenPipeError:  # the reader stopped
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    with pytest.raises(ValueError, match="at most 64 KiB"):
        profiles.load(fifo)
    writer.join(timeout=30)
    assert not writer.is_alive() and written[0] < 4 << 20, written[0]


def test_explorer_views_project_the_replay_onto_a_profile():
    rec = hand_recording()
    _, numbers, fig = labview.explorer_views(rec, 2, False, None, None, profile())
    assert "On hand-made: Test GPU, torch 2.11.0, transformers 5.17.0" in numbers
    # eager: 46 ms for 6 tokens (130.4 tok/s); the target alone: 6 passes of 10 ms = 60 ms
    assert "eager (dynamic cache) 0.046 s (130.4 tok/s, 1.30x the target alone)" in numbers
    assert "fast" not in numbers.split("On hand-made")[1]  # no draft cost on fast: left out
    # whose passes it timed: a run of a 7B pair priced on a 1.5B's costs read as if it were its own
    assert "The profile timed the target t (bfloat16): a pair of other sizes costs more or less a " \
        "pass." in numbers
    both = copy.deepcopy(PROFILE)
    both["models"]["draft"] = {"name": "d <b>", "params": 5, "weight_bytes": 10}
    assert profiles.load(both).measured == "the target t (bfloat16); the draft d <b>"
    assert "the draft d &lt;b&gt;" in labview.on_profile(explorer.replay(rec, 2), profiles.load(both))
    del both["models"]["target"]
    assert profiles.load(both).measured == "" and "The profile timed" not in labview.on_profile(
        explorer.replay(rec, 2), profiles.load(both))
    names = [t.name for t in fig.data]
    assert "tokens / s on hand-made, eager (dynamic cache)" in names and "predicted tokens / s" not in names
    eager = next(t for t in fig.data if t.name == "tokens / s on hand-made, eager (dynamic cache)")
    k2 = list(eager.x).index(2)
    assert math.isclose(eager.y[k2], 6 / 0.046)


def test_the_explorer_names_the_fastest_k_on_the_runs_costs_and_on_each_path_of_a_profile():
    """By hand, eager C_T(w) = 8 + 2w ms, C_D 2 ms: k = 1 makes 3 rounds of width 2 (3 * 2 + 3 * 12
    = 42 ms), k = 2 makes 46 ms, k = 3 two rounds of width 4 (6 * 2 + 2 * 16 = 44 ms), k = 4 48 ms,
    each wider k more. At the recording's own costs (C_D 0.5 s, C_T 1 s flat): k = 1 3 rounds and 3
    drafts, 4.5 s; k = 2 and 3, 5 s. The fast path has no draft cost: no line, as no curve."""
    numbers = labview.explorer_views(hand_recording(), 2, False, None, None, profile())[1]
    assert ("<br>Fastest predicted k of 1 to 16: at this run's costs, k = 1 (1.3 tokens / s). On hand-made, "
            "eager (dynamic cache): k = 1 (142.9 tokens / s).") in numbers
    eager = PROFILE["paths"]["eager"]
    flat = copy.deepcopy(PROFILE)  # verifying free, drafting all but free: every k from 5 on makes
    flat["paths"]["eager"] = dict(eager, draft_ms=1e-6, target_ms={"1": 10.0})  # the 6 tokens in 1 pass,
    numbers = labview.explorer_views(replace(hand_recording(), guesses=[1, 2, 3, 4, 5, 6]), 2, False, None,
                                     None, profiles.load(flat))[1]
    # k = 3 and 4 in 2 (20 ms against 10 ms: outside 2 %); the smallest of the near-tie is named
    assert ("eager (dynamic cache): k = 5 (600.0 tokens / s), with k = 6 to 16 within 2% of its time."
            in numbers)


def test_explorer_views_price_a_compiled_paths_short_round_at_its_padded_width():
    """On a compiled path the engine pads a chain's verify of 2..k tokens to k + 1 (profiles.fed):
    the explorer's line and curve price a budget-cut round so, by hand here (a helper found no
    test of the explorer on a compiled path with a draft cost)."""
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(draft_ms=1.0, target_ms={"1": 4.0, "5": 6.0})
    output = [5, 6, 7, 8, 9, 3, 4]  # every guess right; the budget leaves round 2 one draft
    rec = explorer.Recording("draft", [1, 2], output, list(output), draft_pass_seconds=0.001,
                             target_pass_seconds=0.01, max_new_tokens=7)
    rep = explorer.replay(rec, 4)
    assert [(r.k, r.committed) for r in rep.rounds] == [(4, 5), (1, 2)] and rep.draft_passes == 5
    _, numbers, fig = labview.explorer_views(rec, 4, False, None, None, profiles.load(raw))
    # eager: 5 draft passes of 2 ms, verifies of widths 5 and 2 (18 + 12 ms): 40 ms; alone 7 x 10 ms
    assert "eager (dynamic cache) 0.04 s (175.0 tok/s, 1.75x the target alone)" in numbers
    # compiled: round 1 eager (its verify of 5: 18 ms, its first draft pass 2 ms), 4 x 1 ms, and
    # width 2 padded to 5: 6 ms; 30 ms; alone: round 1 eager (10 ms), 6 x 4 ms = 34 ms
    assert "fast (static cache, compiled) 0.03 s (233.3 tok/s, 1.13x the target alone)" in numbers
    fast = next(t for t in fig.data if t.name == "tokens / s on hand-made, fast (static cache, compiled)")
    assert math.isclose(fast.y[list(fast.x).index(4)], 7 / 0.030)


def test_a_paths_label_says_what_it_ran():
    """The CPU profile's "fast" path is the static cache uncompiled, slower than eager there: the
    menu and the plots name each path with what it ran."""
    p = profile()
    assert [p.path_label(n) for n in p.paths] == ["eager (dynamic cache)", "fast (static cache, compiled)"]
    cpu = profiles.load_shipped("cpu-x86-64-bfloat16")
    assert cpu.path_label("fast") == "fast (static cache)"
    raw = copy.deepcopy(PROFILE)  # ZeroGPU's path: fixed-shape steps (padded), no compiler
    raw["paths"]["graphed"] = {"cache": "static", "compiled": True, "draft_ms": 1.5,
                               "target_ms": {"1": 2.0, "5": 3.0}}
    assert profiles.load(raw).path_label("graphed") == "graphed (static cache, captured steps)"


def test_explorer_views_take_shipped_names_only():
    rec = hand_recording()
    plain = labview.explorer_views(rec, 2, False, None, None)
    assert labview.explorer_views(rec, 2, False, None, None, "")[1] == plain[1]
    with pytest.raises(ValueError, match="no shipped cost profile"):
        labview.explorer_views(rec, 2, False, None, None, "../../docs/x")
    with pytest.raises(ValueError, match="no shipped cost profile"):
        labview.explorer_views(rec, 2, False, None, None, {"paths": {}})
    name = profiles.shipped()[0]
    assert f"On {name}:" in labview.explorer_views(rec, 2, False, None, None, name)[1]


def test_profile_text_is_escaped_in_the_explorer():
    hostile = profiles.load(mutate(["hardware", "name"], "<img src=x onerror=alert(1)>"))
    numbers = labview.explorer_views(hand_recording(), 2, False, None, None, hostile)[1]
    assert "<img" not in numbers and "&lt;img" in numbers


def brec(method, family, tokens, draft, widths):
    return Record(method, family, None, 0, "edit", 0, tokens, 1.0, draft_passes=draft, widths=widths)


def test_bench_projection_matches_a_hand_computation():
    records = [brec("specviz:none", "specviz", 6, 0, {1: 6}),
               brec("specviz:draft-2", "specviz", 6, 4, {3: 2, 1: 1}),
               brec("hf:target", "transformers", 6, 0, {1: 6}),
               brec("hf:assisted-2", "transformers", 6, 0, None)]
    out = benchreport.projected(records, profile())
    assert set(out) == {"specviz:none", "specviz:draft-2", "hf:target"}  # assisted: widths not observed
    assert math.isclose(out["specviz:draft-2"]["eager"]["seconds"], 0.046)
    assert math.isclose(out["specviz:draft-2"]["eager"]["speedup"], 0.060 / 0.046)
    assert "fast" not in out["specviz:draft-2"]
    assert math.isclose(out["specviz:none"]["fast"]["seconds"], 0.015)  # round 1 eager (10 ms), 5 of 1 ms
    table = benchreport.projected_table(out, profile())
    assert "| specviz:draft-2 | 0.05 s, 130.4 tok/s, 1.30x | - |" in table


def test_bench_records_passes_and_projects_onto_a_profile_file(model_dirs, tmp_path, capsys):
    from specviz.cli import main

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"class": "code", "prompt": "def fibonacci(n):"}]))
    path = profiles.save(profile(), tmp_path / "gpu.json")
    out = tmp_path / "b.json"
    rc = main(["bench", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--dtype", "float32", "--device", "cpu", "--prompts", str(prompts), "--ks", "2",
               "--max-new-tokens", "8", "--methods", "hf:target,specviz:none,specviz:draft-2",
               "--json", str(out), "--markdown", str(tmp_path / "b.md"), "--profile", str(path)])
    assert rc == 0
    data = json.loads(out.read_text())
    draft = next(r for r in data["records"] if r["method"] == "specviz:draft-2")
    seconds = draft["draft_passes"] * 2e-3 + sum(
        n * profile().path("eager").target_seconds(int(w)) for w, n in draft["widths"].items())
    assert math.isclose(data["projected"]["specviz:draft-2"]["eager"]["seconds"], seconds)
    alone = next(r for r in data["records"] if r["method"] == "hf:target")
    assert data["projected"]["hf:target"]["eager"]["seconds"] == pytest.approx(alone["target_passes"] * 0.010)
    written = (tmp_path / "b.md").read_text()
    assert "Projected onto the cost profile hand-made" in written
    assert "The profile timed the target t (bfloat16): a pair of other sizes" in written
    assert main(["bench", "--profile", str(tmp_path / "nope.json")]) == 2  # refused before any load
    assert main(["bench", "--profile", "nvidia-h200"]) == 2  # a mistyped name: the shipped ones named
    assert "no shipped profile of that name: give a profile file, or one of cpu-x86-64-bfloat16, " \
           "nvidia-h200-bfloat16" in capsys.readouterr().err


def test_bench_refuses_a_profile_name_too_long_for_a_path_naming_the_fix(capsys):
    """A --profile longer than a file name may be (the OS's ENAMETOOLONG from the existence check)
    printed the errno and all 5,000 characters back, and no fix; it is no file and no shipped name."""
    from specviz.cli import main

    assert main(["bench", "--profile", "a" * 5000]) == 2  # refused before any load
    err = capsys.readouterr().err
    assert "no such file, and no shipped profile of that name: give a profile file" in err
    assert len(err) < 300 and "Errno" not in err


def test_the_explorer_marks_the_measured_run_at_its_own_tokens_per_pass():
    """The replay at k=2 commits 2, 3, 1 (2.00 a pass). A measured run of 1, 1, 1, 3 tokens a round
    (4 passes: 1.50 a pass) does not match it: the marker shows the run's 1.50, not the replay's."""
    _, numbers, fig = labview.explorer_views(hand_recording(), 2, False, 2, [1, 1, 1, 3])
    marker = next(t for t in fig.data if t.name == "measured run")
    assert list(marker.x) == [2] and list(marker.y) == [1.5] and "does NOT match" in numbers
    _, numbers, fig = labview.explorer_views(hand_recording(), 2, False, 2, [2, 3, 1])
    marker = next(t for t in fig.data if t.name == "measured run")
    assert list(marker.y) == [2.0] and "matches it round by round" in numbers


def test_a_profile_holds_every_width_gpucheck_times():
    """gpucheck times widths up to 65 on CUDA (1 + a full 64-node tree), while profiles refused
    any past 64: a GPU run's own profile failed to load and gpucheck --out exited 2."""
    from specviz.gpumeasure import Settings

    widths = sorted({*Settings("cuda").eager_widths, *Settings("cuda").fast_widths})
    raw = copy.deepcopy(PROFILE)
    for path in raw["paths"].values():
        path["target_ms"] = {str(w): 1.0 + w / 100 for w in widths}
    loaded = profiles.load(raw)
    assert max(widths) == 65 and loaded.path("eager").target_seconds(65) == pytest.approx(1.65e-3)


def test_the_shipped_h200_profile_is_the_recorded_run_and_its_goals_recompute_by_hand():
    """assets/profiles/nvidia-h200-bfloat16.json is the profile of the H200 gpucheck report in
    docs/gpu-2026-12-04b/ (steps compiled, then captured directly), and the report's figures
    follow from its pass costs by hand."""
    from specviz import gpucheck

    report = json.loads((profiles.SHIPPED.parent.parent / "docs" / "gpu-2026-12-04b" / "gpucheck-h200.json")
                        .read_text())
    shipped = profiles.load_shipped("nvidia-h200-bfloat16")
    assert profiles.load(report["profile"]) == shipped
    fast, eager = shipped.path("fast"), shipped.path("eager")
    assert fast.compiled and fast.cache == "static" and shipped.packages["transformers"] == "5.17.0"
    # by hand: 3.087 GB a pass over 4,250.1 GB/s is 0.726 ms; 16.070 / 2.985 = 5.38; 2.985 / 0.726
    # = 4.11; 1.729 / 2.985 = 0.579; k=4: (4 * 1.729 + 3.500) / 3.8957 = 2.674 ms a token, 1.12x
    limit = 3_087_428_608 / 4250.086233621224e9 * 1e3
    assert math.isclose(limit, 0.72644, rel_tol=1e-4)
    ms_per_token = (4 * fast.draft_ms + dict(fast.target_ms)[5]) / 3.8957
    assert math.isclose(ms_per_token, 2.67375, rel_tol=1e-4)
    want = [16.070133000013698 / 2.9853645000059714, 2.9853645000059714 / limit,
            1.7290040000119689 / 2.9853645000059714, 2.9853645000059714 / ms_per_token, True]
    bandwidth = report["bandwidth_gbs"]  # 4250.1 GB/s, unrounded
    ident = report["identity"] | {"compiled_ok": True}
    summary = gpucheck.summary(shipped, 3_087_428_608, bandwidth, ident, 4)
    for goal, value, met in zip(summary["goals"], want, [True, False, False, False, True], strict=True):
        same = goal["value"] is value or math.isclose(goal["value"], value, rel_tol=1e-4)
        assert goal["met"] is met and same, goal
    assert [round(v, 2) for v in want[:4]] == [5.38, 4.11, 0.58, 1.12]
    assert math.isclose(eager.target_seconds(1) * 1e3, 16.070133000013698)
    assert report["goals"] == summary["goals"]


def test_the_explorer_states_a_projected_time_past_1000_s_without_an_exponent():
    """600 tokens, no draft ever kept: at k=16 every round drafts up to 16 and commits 1, which on
    the shipped CPU profile's eager path takes about 2,700 s. The line said "2.75e+03 s" where the
    explorer's own prediction, like every other time it states, reads as a hand figure (sig3)."""
    rec = explorer.Recording("draft", [7, 8], list(range(1, 601)), [0] * 600, 0.5, 1.0, 600)
    cpu = profiles.load_shipped("cpu-x86-64-bfloat16")
    rep = explorer.replay(rec, 16)
    assert rep.target_passes == 600 and rep.draft_passes == 16 * 584 + sum(range(16))
    seconds = profiles.project(rep, cpu, "eager")
    assert seconds > 1000
    numbers = labview.explorer_views(rec, 16, False, None, None, cpu.name)[1]
    on = numbers.split("On cpu-x86-64-bfloat16")[1]
    assert f"eager (dynamic cache) {seconds:,.0f} s ({600 / seconds:.1f} tok/s, " in on
    assert "e+" not in on


def test_bench_projection_marks_a_verify_priced_past_the_widest_pass_the_path_measured():
    """A path that measured only C_T(1) (a gpucheck whose budget ran out) prices every wider verify
    as a one-token pass: the bench's projection gave draft-4 2.86x there, verifying free, and said
    nothing of it, where gpucheck's own projection marks such a row an estimate ("*")."""
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(draft_ms=1.0, target_ms={"1": 10.0})
    costs = profiles.load(raw)
    records = [brec("specviz:none", "specviz", 12, 0, {1: 12}),
               brec("specviz:draft-4", "specviz", 12, 12, {5: 3})]
    out = benchreport.projected(records, costs)
    # fast: 12 draft passes of 1 ms + 3 verifies of width 5 priced at C_T(1) = 10 ms, but round 1's
    # eager (18 ms, a 2 ms draft pass): 51 ms for 12 tokens, against 120 ms alone; eager measured
    # width 5: 12 * 2 + 3 * 18 = 78 ms
    assert math.isclose(out["specviz:draft-4"]["fast"]["seconds"], 0.051)
    assert out["specviz:draft-4"]["fast"]["extrapolated"] is True
    assert out["specviz:draft-4"]["eager"]["extrapolated"] is False
    assert out["specviz:none"]["fast"]["extrapolated"] is False
    table = benchreport.projected_table(out, costs)
    assert "| specviz:draft-4 | 0.08 s, 153.8 tok/s, 1.54x | 0.05 s, 235.3 tok/s, 2.35x* |" in table
    assert "| specviz:none | 0.12 s, 100.0 tok/s, 1.00x | 0.12 s, 100.0 tok/s, 1.00x |" in table
    assert "* C_T(width) not measured" in table


def test_a_method_is_marked_an_estimate_when_any_of_its_runs_was_priced_past_the_measured_widths():
    """Of specviz:draft-4's two prompts on the path that measured only C_T(1), one verified at width
    5 (priced past it) and one only at width 1: the method's row sums both, an estimate in part,
    and is marked; a row whose every pass was measured is not."""
    raw = copy.deepcopy(PROFILE)
    raw["paths"]["fast"].update(draft_ms=1.0, target_ms={"1": 10.0})
    costs = profiles.load(raw)
    records = [brec("specviz:none", "specviz", 12, 0, {1: 12}),
               brec("specviz:draft-4", "specviz", 12, 12, {5: 3}),
               brec("specviz:draft-4", "specviz", 12, 0, {1: 12})]
    assert [profiles.extrapolated(r.passes, costs, "fast") for r in records[1:]] == [True, False]
    out = benchreport.projected(records, costs)
    assert out["specviz:draft-4"]["fast"]["extrapolated"] is True
    assert out["specviz:none"]["fast"]["extrapolated"] is False
    # fast: 12 draft passes of 1 ms and 3 verifies at C_T(1) = 10 ms, but round 1's eager (18 ms,
    # a 2 ms draft pass), then 12 one-token passes (round 1's eager too, 10 ms): 171 ms for 24
    # tokens (140.4 tok/s), against the target alone's 12 in 120 ms (100.0 tok/s)
    row = next(line for line in benchreport.projected_table(out, costs).splitlines()
               if line.startswith("| specviz:draft-4 |"))
    assert row.endswith("| 0.17 s, 140.4 tok/s, 1.40x* |")
