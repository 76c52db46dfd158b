"""gpucheck: the quick CPU run's report, its profile, its goals, and its import path."""

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FakeTime, TimedPasses

from specviz import gpucheck, gpumeasure, profiles
from specviz.lm import CachedLM

ROOT = Path(__file__).parent.parent
# Runs the CLI in a fresh interpreter and lists the files that imported one of the app's packages
# (transformers imports psutil itself when it is installed; specviz must not need it).
PROBE = """
import builtins, json, sys
APP, importers, real_import = {"gradio", "plotly", "psutil"}, set(), builtins.__import__
def spy(name, globals=None, *args, **kwargs):
    if name.split(".")[0] in APP:
        importers.add((globals or {}).get("__name__", "?").split(".")[0] + ":" + name.split(".")[0])
    return real_import(name, globals, *args, **kwargs)
builtins.__import__ = spy
from specviz.cli import main
code = main(sys.argv[1:])
print("IMPORTED", json.dumps(sorted(importers)))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """`python -m specviz gpucheck --device cpu --quick --json --out DIR` (about 10 s on one core)."""
    out = tmp_path_factory.mktemp("gpucheck")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, "gpucheck", "--device", "cpu", "--quick", "--json",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-2]), json.loads(lines[-1].removeprefix("IMPORTED ")), out


def test_quick_check_imports_no_app_package(quick):
    # torch + transformers (+ the stdlib) only: nothing of specviz's asks for gradio, plotly or psutil
    assert not [m for m in quick[1] if m.startswith("specviz:") or not m.endswith(":psutil")], quick[1]


def test_quick_report_has_every_section(quick):
    report = quick[0]
    assert report["format"] == "specviz-gpucheck" and report["settings"]["quick"] is True
    assert report["bandwidth_gbs"] > 0 and report["bandwidth_limit_ms"] > 0
    assert set(report["paths"]) == {"eager", "fast"}
    assert report["paths"]["fast"]["cache"] == "static" and report["paths"]["fast"]["compiled"] is False
    assert set(report["paths"]["eager"]["target_ms"]) == {"1", "2", "5"}
    assert set(report["paths"]["fast"]["target_ms"]) == {"1", "5"}
    assert all(report["paths"][p]["draft_ms"] > 0 for p in ("eager", "fast"))
    for path in ("eager", "fast"):
        assert [r["drafter"] for r in report["projection"][path]] == list(profiles.CPU_TOKENS_PER_PASS)
        a = report["target_alone"][path]
        assert math.isclose(a["over_limit"], a["ms"] / report["bandwidth_limit_ms"])
    assert [g["met"] in (True, False) for g in report["goals"]] == [True] * 5
    w = report["weights"]["target"]
    assert w["read_per_pass"] < w["bytes"] and w["params"] > 0


def test_quick_check_fast_path_is_identical_to_eager_in_float32(quick):
    ident = quick[0]["identity"]
    assert ident["eager_equals_cache_free"] and ident["fast_greedy_equals_eager"]
    assert ident["fast_verify_equals_eager"] and ident["first_difference"] is None
    assert ident["max_logit_difference"] < 1e-3
    assert quick[0]["goals"][-1]["met"] is True


def test_quick_check_writes_a_profile_that_loads_back(quick):
    report, _, out = quick
    name = report["profile"]["name"]
    assert name.startswith("cpu-") and name.endswith("-bfloat16-quick")
    loaded = profiles.load(out / f"{name}.json")
    assert loaded.to_dict() == profiles.load(report["profile"]).to_dict()
    assert loaded.quick and set(loaded.paths) == {"eager", "fast"}
    assert loaded.path("eager").target_seconds(1) * 1e3 == report["paths"]["eager"]["target_ms"]["1"]
    assert json.loads((out / "gpucheck.json").read_text())["goals"] == report["goals"]


def test_text_report_says_met_or_not_for_every_goal(quick):
    text = gpucheck.text(quick[0])
    goals = [line for line in text.splitlines() if line.startswith("  ") and ("met" in line or "MET" in line)]
    assert len(goals) == 5 and "goals (set for an H200):" in text
    assert "projected (acceptance measured on CPU" in text and "draft-4" in text


def hand_profile() -> profiles.Profile:
    return profiles.Profile("hand", {"name": "x"}, {}, {
        "eager": profiles.PathCosts("dynamic", False, 7.0, ((1, 8.0), (5, 8.4))),
        "fast": profiles.PathCosts("static", True, 0.1, ((1, 1.0), (5, 1.2)))})


def test_goals_match_a_hand_computation():
    ident = {"eager_equals_cache_free": True, "fast_greedy_equals_eager": True,
             "fast_verify_equals_eager": False}
    s = gpucheck.summary(hand_profile(), read_bytes=2_000_000_000, bandwidth=4000.0, ident=ident, k=4)
    assert math.isclose(s["bandwidth_limit_ms"], 0.5)  # 2 GB over 4000 GB/s
    speedup, over, ratio = (g["value"] for g in s["goals"][:3])
    assert math.isclose(speedup, 8.0) and math.isclose(over, 2.0) and math.isclose(ratio, 0.1)
    t4 = profiles.CPU_TOKENS_PER_PASS["draft-4"]
    assert math.isclose(s["goals"][3]["value"], 1.0 / ((4 * 0.1 + 1.2) / t4))  # 2.43x
    assert [g["met"] for g in s["goals"]] == [True, True, True, True, False]  # the verify rounds differed
    assert gpucheck.summary(hand_profile(), 1, 1.0, None, 4)["goals"][4]["met"] is None  # not measured


def test_goals_of_a_fast_path_whose_capture_failed_are_shown_not_judged():
    """The capture failed, so the fast path's figures time its eager fallback: the hand profile's 8x,
    2x the limit, 0.1 and 2.43x are kept, each "not judged" (they read as four goals the captured
    steps missed, or met); the identity goal, judged on its own run, stands."""
    from dataclasses import replace

    profile = hand_profile()
    fast = replace(profile.paths["fast"], note="compiled capture failed: eager steps")
    fell = replace(profile, paths={**profile.paths, "fast": fast})
    ident = dict.fromkeys(gpumeasure.IDENTITY_KEYS, True)
    goals = gpucheck.summary(fell, 2_000_000_000, 4000.0, ident, 4)["goals"]
    assert [g["met"] for g in goals] == [None, None, None, None, True]
    assert math.isclose(goals[0]["value"], 8.0) and math.isclose(goals[1]["value"], 2.0)
    assert all(g["goal"].endswith("(compiled capture failed: eager steps: not judged)") for g in goals[:4])
    lines = gpucheck.goal_lines(goals)
    assert lines[1] == ("  not judged   target alone: fast path >= 4x faster than eager (compiled capture "
                        "failed: eager steps: not judged): 8.00")
    assert lines[5].startswith("  met          fast-path greedy identical")


def test_engine_section_splits_each_round_and_prices_its_passes():
    from dataclasses import replace

    from specviz import enginecheck
    from specviz.engine import RoundEvent

    def event(n, k, draft_passes, draft_ms, target_ms, round_ms, new, position):
        return RoundEvent(n, k, [1] * k, len(new) - 1, 2, "recovered", new, [], [], n, draft_passes,
                          draft_ms / 1e3, target_ms / 1e3, round_ms / 1e3, 0.0, position, "draft", 0, None)

    # a run of 7 tokens at k = 2: round 1 fed the prompt, the last round's drafts were cut to 1
    events = [event(1, 2, 2, 90.0, 50.0, 150.0, [3], 0),
              event(2, 2, 4, 2.0, 1.2, 4.0, [3], 1), event(3, 2, 6, 2.0, 1.2, 5.0, [1, 3], 2),
              event(4, 2, 9, 3.0, 1.2, 4.5, [3], 4), event(5, 1, 10, 1.0, 9.0, 11.0, [1, 3], 5)]
    r = enginecheck.split(events, k=2, max_new_tokens=7)
    assert (r["rounds"], r["tokens"], r["draft_passes"], r["widths"]) == (3, 4, 7, {"3": 3})
    assert math.isclose(r["nodes"], 2) and math.isclose(r["round_ms"], 13.5 / 3)
    assert math.isclose(r["draft_ms"], 7 / 3) and math.isclose(r["target_ms"], 1.2)
    assert math.isclose(r["engine_ms"], (0.8 + 1.8 + 0.3) / 3)  # each round's rest
    assert math.isclose(r["engine_share"], 2.9 / 13.5)
    assert r["accepted"] == 1 and r["tree"] is False  # round 3 kept one draft; no tree
    profile = profiles.Profile("hand", {"name": "x"}, {}, {
        "fast": profiles.PathCosts("static", True, 0.1, ((1, 1.0), (3, 1.1), (5, 1.2)))})
    # 7 draft passes at 0.1 ms and three verify passes of 3 tokens at 1.1 ms: 4.0 ms
    assert math.isclose(enginecheck.projected_ms(r, profile, "fast"), 4.0 / 3)
    assert enginecheck.projected_ms(r, profile, "eager") is None  # no such path
    # these are rounds after round 1: a profile's eager path adds no round 1 read of the prompt
    eager = profiles.PathCosts("dynamic", False, 14.0, ((1, 16.0), (3, 17.0)))
    both = replace(profile, paths={**profile.paths, "eager": eager})
    assert math.isclose(enginecheck.projected_ms(r, both, "fast"), 4.0 / 3)
    assert math.isclose(enginecheck.projected_ms(r, both, "eager"), (7 * 14.0 + 3 * 17.0) / 3)
    # the target drafting for itself ("self"): each draft pass is a target one-token pass, 1.0 ms
    # (priced at the draft's 0.1 ms it printed a projection a third of what the rounds took)
    assert math.isclose(enginecheck.projected_ms(r, profile, "fast", drafts_by_target=True), (7.0 + 3.3) / 3)
    assert "self k=2" in "\n".join(enginecheck.lines({"self": r}, profile))
    assert f"projects {(7.0 + 3.3) / 3:.3f} ms" in "\n".join(enginecheck.lines({"self": r}, profile))
    assert "*" not in "\n".join(enginecheck.lines({"self": r}, profile))  # width 3 was measured
    # a path that measured only C_T(1) prices the 3-token verify flat at it: an estimate, marked
    short = replace(profile, paths={"fast": profiles.PathCosts("static", True, 0.1, ((1, 1.0),))})
    text = enginecheck.lines({"chain": r}, short)
    assert f"projects {(0.7 + 3.0) / 3:.3f} ms*" in text[1]
    assert text[-1].startswith("  * a verify priced past")
    with pytest.raises(ValueError, match="a full round after the first"):
        enginecheck.split(events[:1] + events[-1:], k=2, max_new_tokens=7)
    # tree rounds verify their nodes (3 and 5), a round of the chain its k (2): means, not the largest
    from specviz.tree import TreeNode

    node = TreeNode(-1, 5, 1, 0.5, 0.5)
    mixed = [events[0], replace(events[1], tree=(node,) * 3), events[2], replace(events[3], tree=(node,) * 5),
             events[4]]
    r = enginecheck.split(mixed, k=2, max_new_tokens=7)
    assert math.isclose(r["nodes"], 10 / 3) and r["widths"] == {"3": 1, "4": 1, "6": 1} and r["tree"] is True
    untimed = [replace(e, draft_seconds=0.0, target_seconds=0.0, round_seconds=0.0) for e in events]
    assert enginecheck.split(untimed, k=2, max_new_tokens=7)["engine_share"] == 0.0


def test_the_engine_section_captures_the_drafts_catch_up_before_its_timed_rounds(compiled_pair, monkeypatch):
    """Random weights rarely accept a whole draft: the draft's 2-token step would otherwise be
    captured (seconds on CUDA) inside a timed round. The chain section warms every step of a
    chain at its k (engine.warm_steps: the draft's 1 and 2 among them) before its first run."""
    from specviz import enginecheck

    calls = []
    warm, generate = enginecheck.warm_steps, enginecheck.generate
    monkeypatch.setattr(enginecheck, "warm_steps", lambda pair, k: calls.append(("warm", k)) or warm(pair, k))
    monkeypatch.setattr(enginecheck, "generate",
                        lambda *a, **kw: calls.append(("run", kw["k"])) or generate(*a, **kw))
    models = {"target": compiled_pair.target, "draft": compiled_pair.draft}
    r = enginecheck.engine_run(models, "compiled", "chain", k=2, context=8, tokens=6)
    # then the target alone, after the timed run, for the identity
    assert calls == [("warm", 2), ("run", 2), ("run", 2), ("run", 2)] and r["rounds"] >= 1
    assert r["equals_target_alone"] is True
    calls.clear()
    enginecheck.engine_run(models, "compiled", "tree", k=2, context=8, tokens=6)
    assert calls == [("run", 2), ("run", 2), ("run", 2)]  # a tree's masked passes: captured by its warm-up


def test_quick_check_times_the_engines_own_rounds(quick):
    report = quick[0]
    assert set(report["engine"]) == {"self", "chain", "tree"}
    for name, r in report["engine"].items():
        assert r["rounds"] >= 1 and r["tokens"] >= r["rounds"] and r["k"] == 4
        assert r["tokens"] == r["accepted"] + r["rounds"]  # each round: its accepted drafts and one more
        assert r["tree"] == (name == "tree")
        assert math.isclose(r["round_ms"], r["draft_ms"] + r["target_ms"] + r["engine_ms"], rel_tol=1e-9)
        assert 0 <= r["engine_share"] < 1 and sum(r["widths"].values()) == r["rounds"]
    assert max(map(int, report["engine"]["tree"]["widths"])) == 1 + 16  # the fixed 16-node budget
    assert all(r["equals_target_alone"] is True for r in report["engine"].values())
    text = gpucheck.text(report)
    assert "engine rounds (fast path" in text and "the profile projects" in text
    assert text.count("output = the target alone's") == 3
    assert report["steps"] == {"capture": "direct", "pack": False, "nested": False, "shared": True,
                               "tuned": False, "candidates": 16}
    assert "fast path: static caches, eager steps (nothing compiled)" in text  # a CPU compiles nothing
    assert "measured by `python -m specviz gpucheck --device cpu --quick`" in report["profile"]["note"]
    # the draft as the engine runs it on a CPU (int4: a profile of the bf16 draft priced C_D 4x over),
    # and whether this CPU multiplies bf16 in hardware, which sets what a wide pass costs
    from specviz import dense

    assert report["profile"]["models"]["draft"]["name"].endswith(", int4 weights, as the engine drafts here")
    assert "as the engine" not in report["profile"]["models"]["target"]["name"]
    assert report["profile"]["hardware"]["name"].endswith(
        ", bf16 in hardware" if dense.native_bf16() else ", no bf16 hardware")
    # drafting for itself the target accepts every draft (float32 here: no rounding between widths)
    assert report["engine"]["self"]["accepted"] == 4 * report["engine"]["self"]["rounds"]


def tiny(layers=3):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)


def test_random_model_is_the_architecture_with_seeded_weights():
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_config(tiny())
    a = gpumeasure.random_model(tiny(), "cpu", torch.float32, seed=1)
    b = gpumeasure.random_model(tiny(), "cpu", torch.float32, seed=1)
    assert {n: p.shape for n, p in a.named_parameters()} == {n: p.shape for n, p in ref.named_parameters()}
    for (name, buf), (_, want) in zip(a.named_buffers(), ref.named_buffers(), strict=True):
        assert torch.equal(buf, want), name  # rotary frequencies rebuilt, not left empty
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    head = a.get_output_embeddings().weight
    assert len(torch.unique(head, dim=0)) == head.shape[0]  # no two rows alike
    assert torch.isfinite(a(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


def test_quick_configs_shrink_widths_but_keep_depths():
    for role in gpumeasure.ROLES:
        full, small = gpumeasure.config(role, False), gpumeasure.config(role, True)
        assert small.num_hidden_layers == full.num_hidden_layers in (24, 28)
        assert small.hidden_size == 64 < full.hidden_size and small.vocab_size == 4096


@torch.inference_mode()
def test_verify_rounds_reproduce_greedy_through_rejections():
    model = gpumeasure.random_model(tiny(), "cpu", torch.float32, seed=2)
    prompt = [5, 6, 7, 8]
    reference, _ = gpumeasure.greedy(CachedLM(model, 300), prompt, 15)
    lm = CachedLM(model, 300)
    assert gpumeasure.verify_rounds(lm, prompt, reference, 3) == reference
    assert lm.passes < 15  # several tokens a pass: drafts were kept


def test_bad_arguments_are_refused():
    from specviz.cli import main

    assert main(["gpucheck", "--device", "cpu", "--repeats", "0"]) == 2
    assert main(["gpucheck", "--device", "cpu", "--budget", "1"]) == 2
    if not torch.cuda.is_available():
        assert main(["gpucheck", "--device", "cuda"]) == 2


def test_preflight_refuses_a_transformers_that_drops_the_cache(monkeypatch):
    """transformers 5.17 silently ignores the forward argument `cache=`: simulated here, on
    whichever argument specviz passes the cache through with the installed transformers."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

    from specviz import fastpath

    gpumeasure.preflight("cpu")  # this transformers: fine
    forward, kv = Qwen2Model.forward, fastpath._cache_argument(Qwen2Model)

    def dropping_the_cache(self, *a, **kw):
        kw.pop(kv, None)
        return forward(self, *a, **kw)

    monkeypatch.setattr(Qwen2Model, "forward", dropping_the_cache)
    with pytest.raises(ValueError, match="dynamic cache fails with transformers"):
        gpumeasure.preflight("cpu")


def test_a_goal_without_its_measured_width_is_not_judged():
    p = hand_profile()
    only_one = profiles.PathCosts("static", True, 0.1, p.paths["fast"].target_ms[:1])
    short = profiles.Profile("hand", {}, {}, {"eager": p.paths["eager"], "fast": only_one})
    s = gpucheck.summary(short, 1, 1.0, None, 4)
    goals = s["goals"]
    assert goals[3]["value"] is None and goals[3]["met"] is None  # C_T(5) was skipped
    # and the table marks what it priced past C_T(1), flat: verifying as free (2.77x, unmarked)
    lines = gpucheck.projection_lines(s["projection"])
    fast = {line.split()[0]: line.split()[-1] for line in lines[1:-1]}
    assert all(cell.endswith("x*") for cell in fast.values()) and lines[-1].startswith("  * C_T(k+1) not")
    eager = {r["drafter"]: r["extrapolated"] for r in s["projection"]["eager"]}
    assert eager == {d: int(d.rsplit("-", 1)[1]) + 1 > 5 for d in profiles.CPU_TOKENS_PER_PASS}  # eager: 1, 5


def test_a_path_without_a_draft_cost_projects_no_draft_speedup():
    """Priced at no draft time, the draft rows of a path measured without a draft read 3.9x at
    k=4 (the goal 'projected draft speedup >= 2x' met on nothing measured)."""
    fast = profiles.PathCosts("static", True, None, ((1, 1.0), (5, 1.2)))
    bare = profiles.Profile("hand", {"name": "x"}, {}, {**hand_profile().paths, "fast": fast})
    s = gpucheck.summary(bare, read_bytes=2_000_000_000, bandwidth=4000.0, ident=None, k=4)
    assert [r["drafter"] for r in s["projection"]["fast"]] == ["ngram-8"]
    assert s["goals"][2]["met"] is None and s["goals"][3]["met"] is None  # C_D/C_T, draft speedup
    lines = gpucheck.projection_lines(s["projection"])
    assert lines[0].split() == ["drafter", "eager", "ms/tok", "eager", "speedup", "fast", "ms/tok", "fast",
                                "speedup"]
    draft4 = next(line for line in lines if line.split()[0] == "draft-4").split()
    assert draft4[3:] == ["-", "-"] and len(lines) == 1 + len(profiles.CPU_TOKENS_PER_PASS) + 1  # + the *'s


def test_identity_through_a_failed_capture_is_not_called_met():
    """A capture that fails falls back to eager steps: "fast equals eager" is then eager against
    eager, and the float32 identity goal read met."""
    same = {"eager_equals_cache_free": True, "fast_greedy_equals_eager": True,
            "fast_verify_equals_eager": True}
    for captured, met in ((True, True), (None, True), (False, None)):
        s = gpucheck.summary(hand_profile(), 1, 1.0, same | {"compiled_ok": captured}, 4)
        assert s["goals"][4]["met"] is met, captured


def test_figures_beside_a_bar_print_the_digits_that_keep_their_side():
    """3.04x the bandwidth limit printed "3.0x" beside "NOT MET", a 1.996x speedup "2.00x"."""
    # hand: (4 * 0.1 + 1.2) / T(4) ms a token against C_T(1) = 1.0: 1.996x at T(4) = 1.6 * 1.996
    rows = profiles.projection(hand_profile(), "fast", {"draft-4": 1.6 * 1.996})
    assert math.isclose(rows[0]["speedup"], 1.996)
    line = gpucheck.projection_lines({"fast": rows})[1].split()
    assert line[2] == "1.996x", line


@pytest.mark.parametrize(("load", "shared"), [([1.5, 1.1], False), ([1.5, 99.0], True),
                                             ([16.0, 2.0], False)])  # at the count: not above it
def test_the_load_note_says_other_work_shared_the_cpus_only_when_the_load_passed_their_count(load, shared,
                                                                                          monkeypatch):
    monkeypatch.setattr(gpucheck.os, "cpu_count", lambda: 16)
    note = gpucheck.load_note(load)
    assert note.startswith(f"; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    assert ("above the CPU count" in note) is shared
    assert gpucheck.load_note([None, 1.0]) == ""


@pytest.mark.parametrize("stale", [False, True])
def test_the_graph_probe_catches_a_replay_that_baked_its_position_in(cpu_graphs, monkeypatch, stale):
    from specviz import graphprobe

    monkeypatch.setattr(cpu_graphs, "stale", stale)
    monkeypatch.setattr(graphprobe, "sync", lambda device: None)
    model = gpumeasure.random_model(gpumeasure.config("target", True), "cpu", torch.float32, seed=0)
    ident = graphprobe.greedy_identity(model, 8, 16)
    # a tiny random model's argmax barely reads its context, so the rows are the evidence
    assert (ident["max_logit_difference"] > 1e-3) is stale, ident
    if not stale:
        assert ident["graph_greedy_equals_eager"] and ident["first_difference"] is None
    timed = graphprobe.time_width(model, 3, 16, 2)  # one replay from the capture point: equal rows
    assert timed["max_logit_difference"] == 0.0 and timed["argmax_equal"]


def test_the_graph_probe_reports_a_replay_that_differs_and_its_timings(monkeypatch):
    """A stand-in capture that moves one logit by 1000 (onto another argmax): time_width's
    difference and argmax verdict, greedy_identity's first differing token; the timings by a
    hand clock: eager passes of 0.25 s, a capture of 0.5 s, replays of 0.0625 s."""
    from types import SimpleNamespace

    from specviz import graphprobe
    from specviz.fastpath import cache_argument, step

    calls, sizes = [], []

    def captured(model, cache, width):
        def replay(ids):
            calls.append(1)
            out = step(model, cache, ids, width, False, cache_argument(model)).clone()
            if len(calls) == moved:
                out[0, (int(out[0].argmax()) + 1) % out.shape[-1]] += 1000.0
            return out
        return replay

    static_cache = graphprobe.static_cache
    monkeypatch.setattr(graphprobe, "static_cache",
                        lambda model, n: sizes.append(n) or static_cache(model, n))
    monkeypatch.setattr(graphprobe, "captured", captured)
    monkeypatch.setattr(graphprobe, "sync", lambda device: None)
    clock = iter([0.0, 0.25, 1.0, 1.25, 2.0, 2.5, 3.0, 3.0625, 4.0, 4.0625])
    monkeypatch.setattr(graphprobe, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    model = gpumeasure.random_model(gpumeasure.config("target", True), "cpu", torch.float32, seed=0)
    moved = 1  # the capture's own pass
    timed = graphprobe.time_width(model, 3, 16, 2, max_len=64)
    assert sizes == [64] and not timed["argmax_equal"]
    assert timed["max_logit_difference"] == pytest.approx(1000.0, rel=1e-5)
    assert (timed["eager_static_ms"], timed["graph_ms"], timed["speedup"], timed["capture_s"]) == (
        250.0, 62.5, 4.0, 0.5)
    calls.clear()
    moved = 3  # the third replay: the fourth output token
    ident = graphprobe.greedy_identity(model, 6, 16)
    assert not ident["graph_greedy_equals_eager"] and ident["first_difference"] == 3


def test_each_sdpa_variant_holds_attention_to_its_backend(monkeypatch):
    import torch.nn.attention as attn

    from specviz import graphprobe

    held = []
    monkeypatch.setattr(attn, "sdpa_kernel",
                        lambda backends: held.append(backends) or contextlib.nullcontext())
    model = gpumeasure.random_model(gpumeasure.config("draft", True), "cpu", torch.float32, seed=1)
    for variant in ("sdpa", "sdpa-efficient", "sdpa-math", "sdpa-cudnn", "eager"):
        with graphprobe.attention(model, variant):
            pass
    B = attn.SDPBackend
    assert held == [[B.EFFICIENT_ATTENTION], [B.MATH], [B.CUDNN_ATTENTION]]


def test_the_probe_profiles_each_models_passes_and_checks_identity_only_where_asked(monkeypatch):
    from specviz import gpumeasure, graphprobe

    timed, profiled, checked = [], [], []
    monkeypatch.setattr(graphprobe, "random_pair", lambda device, dtype, quick: {"target": "T", "draft": "D"})
    monkeypatch.setattr(graphprobe, "random_model", lambda config, device, dtype, seed: "T32")
    monkeypatch.setattr(gpumeasure, "time_path", lambda models, path, s, *a: timed.append((models, s.repeats))
                        or {"draft_ms": 1.0, "target_ms": {1: 2.0, s.k + 1: 2.5}, "compiled_ok": True})
    monkeypatch.setattr(graphprobe, "kernel_share", lambda model, s, width=1, refine=True:
                        profiled.append((model, width, refine)) or ({}, "t"))
    monkeypatch.setattr(gpumeasure, "identity", lambda model, s: checked.append(model) or {"ok": True})
    out = {}
    graphprobe.modes(["direct", "direct+packed"], ["direct+packed"], out, [], lambda: None, repeats=7,
                     device="cpu", quick=True)  # 7: not the quick settings' own 3
    k = gpumeasure.Settings.for_device("cpu", True).k
    assert timed == [({"target": "T", "draft": "D"}, 7)] * 2
    assert profiled == [("T", 1, True), ("T", k + 1, True), ("D", 1, False)] * 2  # the draft as it drafts
    assert checked == ["T32"] and "identity_float32" not in out["direct"]
    assert out["direct+packed"]["identity_float32"] == {"ok": True}


def test_the_graph_probe_restores_the_models_attention_and_names_its_variants():
    from specviz import graphprobe

    model = gpumeasure.random_model(gpumeasure.config("draft", True), "cpu", torch.float32, seed=1)
    before = model.config._attn_implementation
    for variant in ("eager", "sdpa-math"):
        with graphprobe.attention(model, variant):
            assert model.config._attn_implementation == ("eager" if variant == "eager" else "sdpa")
        assert model.config._attn_implementation == before
    with pytest.raises(SystemExit, match="unknown attention variants"):
        graphprobe.main(["--attention", "sdpa,flash9"])
    with pytest.raises(SystemExit, match=r"unknown capture modes \['direct\+sharded'\]"):
        graphprobe.main(["--modes", "direct+shared,direct+sharded"])
    with pytest.raises(SystemExit, match=r"graphs\+shared: the graphs mode compiles nothing"):
        graphprobe.main(["--modes", "direct+packed+nested+shared,graphs+packed,graphs+shared"])


class Passes:
    """A stand-in CachedLM for pass_ms: each pass takes `seconds` (the first, a capture, `first`)."""

    def __init__(self, seconds: float, first: float = 0.0):
        self.seconds, self.first, self.times = seconds, first, []

    def forward(self, ids, last=1):
        import time

        self.times.append(time.perf_counter())
        time.sleep(self.first if len(self.times) == 1 else self.seconds)

    def rollback(self, ids):
        pass


@pytest.mark.parametrize(("settle", "first", "at_least"), [(0.0, 0.0, 3 + 5), (0.3, 0.0, 1 + 0.3 / 0.01 + 5),
                                                           (0.3, 0.5, 1 + 0.3 / 0.01 + 5)])
def test_pass_timings_start_after_the_warm_up_passes_and_the_settling_time(settle, first, at_least):
    """On the H200 the eager widths timed first came out 24-28 ms where the rest gave about 18: the
    timed passes now wait for `settle` seconds of passes after the first one (a capture on a
    compiled path, whose own length does not count)."""
    lm = Passes(0.01, first)
    ms = gpumeasure.pass_ms(lm, [1, 2], 1, repeats=5, warmup=3, device="cpu", vocab=50, settle=settle)
    # sleeps overshoot, on a loaded machine by half (a suite's two workers on two cores): fewer fit
    assert len(lm.times) >= at_least * 0.5 and len(lm.times) >= 3 + 5
    assert 9 <= ms < 100
    assert lm.times[-5] - lm.times[1] >= settle  # the first timed pass began after settling


def test_the_graph_probe_times_the_engines_steps_under_a_capture_mode_and_restores_it(cpu_graphs,
                                                                                     monkeypatch):
    """graphprobe --modes on CPU, with the stand-in graphs: the engine's own graphed steps timed
    (CachedLM through time_path), unpacked and packed, their kernel share, float32 identity;
    fastpath.CAPTURE, fastpath.PACK, fastpath.NESTED and fastpath.SHARED as they were."""
    from specviz import fastpath, graphprobe, packing

    out, tables, saved, packed, profiled = {}, [], [], [], []
    pack = packing.pack
    monkeypatch.setattr(packing, "pack", lambda model: packed.append(pack(model)))

    class NoCpuOps(torch.profiler.profile):
        """torch's profiler, run as the probe runs it, with the CPU ops left unrecorded: the
        kernel share counts CUDA kernels (none on this CPU either way), and parsing the 60,000
        CPU ops of 10 passes of the 28-layer quick target took 35 of this test's 45 s."""

        def __enter__(self):
            profiled.append(self)
            torch._C._autograd._enable_record_function(False)
            try:
                return super().__enter__()
            except BaseException:
                torch._C._autograd._enable_record_function(True)
                raise

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            finally:
                torch._C._autograd._enable_record_function(True)

    monkeypatch.setattr(torch.profiler, "profile", NoCpuOps)
    graphprobe.modes(["graphs", "graphs+packed"], ["graphs+packed"], out, tables,
                     lambda: saved.append(dict(out)), repeats=2, device="cpu", quick=True)
    assert len(profiled) == 6  # each mode's target at width 1 and k + 1, and its draft
    for mode in ("graphs", "graphs+packed"):
        r = out[mode]
        assert "error" not in r and r["compiled_ok"] and set(r["target_ms"]) == {1, 5}
        assert r["kernels"]["compiled_passes"] == 13  # 3 warm-up and 10 profiled passes, all replayed
        assert r["kernels_wide"]["compiled_passes"] == 13  # the verify width's passes, on the same slot
    ident = out["graphs+packed"]["identity_float32"]  # the packed steps against eager unpacked
    assert ident["fast_greedy_equals_eager"] and ident["fast_verify_equals_eager"] and ident["compiled_ok"]
    assert packed == [True, True, True]  # the timed pair, then the float32 target; unpacked mode: none
    assert saved and tables[0].startswith("graphs: the target's width-1 pass")
    assert tables[1].startswith("graphs: the target's width-5 pass")
    flags = (fastpath.CAPTURE, fastpath.PACK, fastpath.NESTED, fastpath.SHARED)
    assert flags == ("direct", False, False, True)
    assert not fastpath._SLOTS


def test_the_probe_lists_the_last_passs_kernels_in_order_with_the_idle_time_between_them():
    from types import SimpleNamespace

    from torch.autograd.profiler_util import Interval

    from specviz import graphprobe

    def kernel(name, start, end):
        return SimpleNamespace(name=name, time_range=Interval(start, end))

    # two passes of three kernels, listed out of order: the last pass runs 100-104, 105-107, 110-111
    events = [kernel("c", 110, 111), kernel("a", 0, 4), kernel("b", 5, 7), kernel("a", 100, 104),
              kernel("c", 10, 11), kernel("b", 105, 107)]
    summary, text = graphprobe.last_pass(events, 2)
    assert summary == {"last_pass_span_ms": 0.011, "last_pass_busy_ms": 0.007, "last_pass_gaps_ms": 0.004,
                       "last_pass_host_gaps": 0, "last_pass_host_gaps_ms": 0.0}
    # a pass whose head waited 30 us for the host after the graph: one gap of the host's, apart
    waited = events + [kernel("d", 141, 142), kernel("d", 41, 42)]
    summary, _ = graphprobe.last_pass(waited, 2)
    assert summary["last_pass_gaps_ms"] == 0.034 and summary["last_pass_host_gaps"] == 1
    assert summary["last_pass_host_gaps_ms"] == 0.03
    # kernels that overlap (0-10 and 2-4 us) leave the device idle once, not by their lengths' sum
    overlapping = [kernel("a", 0, 10), kernel("b", 2, 4), kernel("c", 30, 31)]
    summary, _ = graphprobe.last_pass(overlapping, 1)
    assert summary["last_pass_gaps_ms"] == summary["last_pass_host_gaps_ms"] == 0.02
    rows = text.strip().splitlines()[1:]
    assert [row.split() for row in rows] == [["0", "0.00", "4.00", "a"], ["1", "5.00", "2.00", "b"],
                                             ["2", "10.00", "1.00", "c"]]
    assert graphprobe.last_pass([], 10) == ({}, "")  # no CUDA kernels: the CPU tests' stand-in graphs
    # a gap of HOST_GAP_US (10 us) or more is the host's
    summary, _ = graphprobe.last_pass([kernel("a", 0, 4), kernel("b", 14, 15)], 1)
    assert summary["last_pass_host_gaps"] == 1 and summary["last_pass_host_gaps_ms"] == 0.01


def test_each_probe_mode_names_every_step_setting_it_times_under(monkeypatch):
    """graphprobe --modes: a mode's name is all of its settings (plain "direct": unpacked, every
    layer traced, a graph a width), whatever lm's defaults are; lm's settings are restored."""
    from specviz import fastpath, gpumeasure, graphprobe

    seen = []

    def time_path(models, path, s, clock, widths, skipped, label):
        seen.append((fastpath.CAPTURE, fastpath.PACK, fastpath.NESTED, fastpath.SHARED, fastpath.TUNED))
        return {"draft_ms": 1.0, "target_ms": {1: 2.0}, "compiled_ok": True}

    monkeypatch.setattr(gpumeasure, "time_path", time_path)
    monkeypatch.setattr(graphprobe, "kernel_share", lambda model, s, width=1, refine=True: ({}, "table"))
    monkeypatch.setattr(fastpath, "SHARED", True)
    out = {}
    graphprobe.modes(["direct", "direct+shared", "trees+packed+nested", "direct+tuned+shared"], [], out, [],
                     lambda: None, repeats=2, device="cpu", quick=True)
    assert seen == [("direct", False, False, False, False), ("direct", False, False, True, False),
                    ("trees", True, True, False, False), ("direct", False, False, True, True)]
    flags = (fastpath.CAPTURE, fastpath.PACK, fastpath.NESTED, fastpath.SHARED, fastpath.TUNED)
    assert flags == ("direct", False, False, True, False)
    assert out["direct+shared"]["target_ms"] == {1: 2.0}


def test_a_probe_mode_is_saved_before_its_identity_check(monkeypatch):
    """A mode's timings and kernel tables were saved only after its float32 identity check: a
    timeout there (the probe's last step on the device) lost the whole mode."""
    from specviz import gpumeasure, graphprobe

    monkeypatch.setattr(gpumeasure, "time_path", lambda *a, **kw: {"draft_ms": 1.0, "target_ms": {1: 2.0}})
    monkeypatch.setattr(graphprobe, "kernel_share",
                        lambda model, s, width=1, refine=True: ({"n": width}, "t"))

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpumeasure, "identity", cut)
    out, tables, saved = {}, [], []
    with pytest.raises(KeyboardInterrupt):
        graphprobe.modes(["direct+packed"], ["direct+packed"], out, tables,
                         lambda: saved.append(json.dumps(out)), repeats=2, device="cpu", quick=True)
    mode = json.loads(saved[-1])["direct+packed"]
    assert mode["target_ms"] == {"1": 2.0} and mode["kernels_draft"] == {"n": 1}
    assert [t.split(":")[1].strip().split(" ")[1] for t in tables] == ["target's", "target's", "draft's"]


def test_a_probe_mode_is_saved_before_its_profiler_tables(monkeypatch):
    """The probe's timeout (240 s on the device) can land while a mode's three profiler tables are
    made, after its timings: they were saved only after the tables, so --fastest never saw them."""
    from specviz import gpumeasure, graphprobe

    monkeypatch.setattr(gpumeasure, "time_path", lambda *a, **kw: {"draft_ms": 1.0, "target_ms": {1: 2.0}})

    def cut(*args, **kwargs):
        raise KeyboardInterrupt  # timeout's signal, as it were, during the first table

    monkeypatch.setattr(graphprobe, "kernel_share", cut)
    out, saved = {}, []
    with pytest.raises(KeyboardInterrupt):
        graphprobe.modes(["direct+shared"], [], out, [], lambda: saved.append(json.dumps(out)), repeats=2,
                         device="cpu", quick=True)
    assert json.loads(saved[-1])["direct+shared"]["target_ms"] == {"1": 2.0}


def test_the_graphed_path_is_timed_through_captured_uncompiled_steps(cpu_graphs):
    """ZeroGPU's path in gpucheck (on devices that capture graphs): the static cache, the plain
    step captured by fastpath.GraphedStep, and "compiled" in its profile entry, as its short passes are
    padded to a captured width like the compiled path's (profiles.fed)."""
    from specviz import fastpath

    s = gpumeasure.Settings.for_device("cpu", quick=True, repeats=2)
    models = {role: gpumeasure.random_model(gpumeasure.config(role, True), "cpu", torch.float32, seed=i)
              for i, role in enumerate(gpumeasure.ROLES)}
    out = gpumeasure.time_path(models, "graphed", s, gpumeasure.Clock(60), (1, 5), [], "random")
    assert out["cache"] == "static" and out["compiled"] and out["compiled_ok"]
    assert set(out["target_ms"]) == {1, 5} and out["draft_ms"] > 0
    slots = [s for held in fastpath._SLOTS.values() for s in held]
    assert len(slots) == 2 and all(s.steps == "graphs" and s.step.fn is fastpath.step and s.step.graphs
                                   for s in slots)
    assert gpumeasure.path_steps("fast", s) is None and gpumeasure.path_steps("eager", s) is None


def test_the_step_flags_set_how_the_compiled_path_builds_its_steps(monkeypatch):
    import argparse

    from specviz import fastpath

    monkeypatch.setattr(fastpath, "PACK", False)
    monkeypatch.setattr(fastpath, "NESTED", False)
    p = argparse.ArgumentParser()
    gpucheck.add_step_args(p)
    gpucheck.apply_step_args(p.parse_args(["--pack", "on"]))
    assert fastpath.PACK and not fastpath.NESTED
    gpucheck.apply_step_args(p.parse_args([]))  # unset: as they were
    assert fastpath.PACK and not fastpath.NESTED
    gpucheck.apply_step_args(p.parse_args(["--pack", "off", "--nested", "on"]))
    assert not fastpath.PACK and fastpath.NESTED
    monkeypatch.setattr(fastpath, "SHARED", True)
    gpucheck.apply_step_args(p.parse_args(["--shared", "off"]))
    assert not fastpath.SHARED and fastpath.NESTED and not fastpath.PACK
    monkeypatch.setattr(fastpath, "TUNED", False)
    gpucheck.apply_step_args(p.parse_args(["--tuned", "on"]))
    assert fastpath.TUNED and not fastpath.SHARED


def test_tuning_reaches_inductor_on_a_graph_device_only(monkeypatch):
    """fastpath.TUNED compiles a graph device's steps with inductor's coordinate-descent tuning, which
    torch.compile takes as an option (never beside a mode: it refuses both at once), so the
    graph trees' mode becomes its option; on the CPU, and for another backend, nothing changes."""
    from specviz import fastpath

    monkeypatch.setattr(fastpath, "COMPILE", {"dynamic": False})
    monkeypatch.setattr(fastpath, "TUNED", False)
    assert fastpath.compile_settings("cuda") == {"dynamic": False}
    assert fastpath.compile_settings("cuda", graphs=True) == {"dynamic": False, "mode": "reduce-overhead"}
    monkeypatch.setattr(fastpath, "TUNED", True)
    tuned = {"dynamic": False, "options": {"coordinate_descent_tuning": True}}
    assert fastpath.compile_settings("cuda") == tuned
    assert fastpath.compile_settings("cuda", graphs=True) == {
        "dynamic": False, "options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True}}
    assert fastpath.compile_settings("cpu") == {"dynamic": False}
    import torch._inductor

    assert torch._inductor.list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    monkeypatch.setattr(fastpath, "COMPILE", {"backend": "aot_eager", "dynamic": False})
    assert fastpath.compile_settings("cuda", graphs=True) == {"backend": "aot_eager", "dynamic": False}
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    monkeypatch.setattr(fastpath, "COMPILE", {"dynamic": False})
    monkeypatch.setattr(fastpath, "SHARED", False)
    assert fastpath.fixed_step("cuda", "compiled").fn is fastpath.step  # "direct": captured by a GraphedStep
    assert seen == [{"dynamic": False, "options": {"coordinate_descent_tuning": True}}]


def test_enginecheck_alone_compares_each_run_with_the_target_alone(capsys, monkeypatch):
    from specviz import enginecheck

    status = enginecheck.main(["--device", "cpu", "--fast", "static", "--quick", "--kinds", "self,chain",
                               "--context", "16", "--tokens", "12"])
    out = capsys.readouterr().out
    assert status == 0 and out.count("output = the target alone's") == 2
    assert out.startswith("self {") and "\nchain {" in out
    with pytest.raises(SystemExit, match="unknown kinds"):
        enginecheck.main(["--kinds", "selfish"])
    with pytest.raises(SystemExit, match="--kinds ',' names no run: pick from chain, tree, self"):  # passed
        enginecheck.main(["--kinds", ",", "--device", "cpu", "--quick"])
    if not torch.cuda.is_available():  # torch's AssertionError before
        with pytest.raises(SystemExit, match="enginecheck: device 'cuda': no CUDA GPU for this torch here"):
            enginecheck.main(["--device", "cuda", "--quick"])
    run = enginecheck.engine_run  # an output that differs is the exit status 1
    monkeypatch.setattr(enginecheck, "engine_run",
                        lambda *a: run(*a) | {"equals_target_alone": a[2] != "chain"})
    assert enginecheck.main(["--device", "cpu", "--fast", "static", "--quick", "--kinds", "self,chain",
                             "--context", "16", "--tokens", "12"]) == 1
    assert "chain k=4" in capsys.readouterr().out.split("output NOT the target alone's")[0]


def test_an_engine_runs_difference_keeps_each_runs_margin_in_order(compiled_pair, monkeypatch):
    """margins: [the engine run's, the target alone's], as compare names them; the target's end of
    sequence is put back after the run; "self" drafts with the target, "chain" with the draft."""
    from types import SimpleNamespace

    from specviz import enginecheck

    drafts, pair = [], enginecheck.Pair
    monkeypatch.setattr(enginecheck, "Pair", lambda target, vocab, draft, *a, **kw:
                        drafts.append(draft) or pair(target, vocab, draft, *a, **kw))
    warmed, warm = [], enginecheck.warm_steps
    monkeypatch.setattr(enginecheck, "warm_steps", lambda p, k: warmed.append(k) or warm(p, k))

    differs = SimpleNamespace(identical=False, position=2, verdict="unexplained: please report",
                              threshold=0.125, spec_top2=0.5, base_top2=0.25, margin=lambda top2: top2)
    monkeypatch.setattr(enginecheck, "compare", lambda *a: differs)
    target = compiled_pair.target
    monkeypatch.setattr(target.generation_config, "eos_token_id", 7)
    r = enginecheck.engine_run({"target": target, "draft": compiled_pair.draft}, "static", "chain", k=2,
                               context=8, tokens=6)
    assert (r["equals_target_alone"], r["first_difference"], r["margins"], r["near_tie_bound"]) == (
        False, 2, [0.5, 0.25], 0.125)
    assert target.generation_config.eos_token_id == 7
    enginecheck.engine_run({"target": target, "draft": compiled_pair.draft}, "static", "self", k=2, context=8,
                           tokens=6)
    assert drafts == [compiled_pair.draft, target] and warmed == [2, 2]  # each chain's steps warmed first


def test_enginecheck_runs_each_kind_as_asked_and_a_failed_run_fails_the_check(tmp_path, monkeypatch, capsys):
    from specviz import enginecheck, fastpath, gpumeasure

    made, runs = [], []
    monkeypatch.setattr(gpumeasure, "random_pair", lambda *a: made.append(a) or {"target": "T"})

    def engine_run(models, fast, kind, k, context, tokens):
        runs.append((models, fast, kind, k, context, tokens))
        if kind == "chain":
            raise RuntimeError("no graph")
        return {"k": k, "nodes": 4.0, "round_ms": 1.0, "draft_ms": 0.5, "target_ms": 0.25, "engine_ms": 0.25,
                "engine_share": 0.25, "equals_target_alone": True}

    monkeypatch.setattr(enginecheck, "engine_run", engine_run)
    monkeypatch.setattr(fastpath, "PACK", False)
    out = tmp_path / "engine.json"
    assert enginecheck.main(["--device", "cpu", "--pack", "on", "--out", str(out)]) == 1  # chain failed
    assert made == [("cpu", torch.bfloat16, False)] and fastpath.PACK is True
    assert runs == [({"target": "T"}, "compiled", kind, 4, 128, 48) for kind in ("self", "tree", "chain")]
    report = json.loads(out.read_text())
    assert list(report) == ["self", "tree", "chain"]
    assert report["chain"] == {"error": "RuntimeError: no graph"}
    assert "  self k=4, 4.0 nodes a round: round 1.000 ms" in capsys.readouterr().out
    runs.clear()
    assert enginecheck.main(["--device", "cpu", "--kinds", "self", "--k", "2", "--context", "16", "--tokens",
                             "12", "--fast", "static", "--dtype", "float32", "--quick"]) == 0
    assert runs == [({"target": "T"}, "static", "self", 2, 16, 12)]
    assert made[-1] == ("cpu", torch.float32, True)


def test_an_engine_run_that_differs_from_the_target_alone_says_where_and_whether_a_near_tie(compiled_pair,
                                                                                              monkeypatch):
    """On a GPU in bfloat16 a verify pass's rows can round apart from a one-token pass's: the
    report said only "output NOT the target alone's". It now says from which token, the top-2
    margins there and the near-tie bound (compare.compare, as the page's verdict)."""
    from dataclasses import replace as swap

    from specviz import enginecheck

    generate = enginecheck.generate

    def alone_differs(*a, **kw):  # the target alone's token 3 swapped for its runner-up
        events = list(generate(*a, **kw))
        if kw.get("proposer") == "none":
            e = events[3]
            events[3] = swap(e, token=e.target_top2[0][1][0], new_tokens=[e.target_top2[0][1][0]])
        return events

    monkeypatch.setattr(enginecheck, "generate", alone_differs)
    models = {"target": compiled_pair.target, "draft": compiled_pair.draft}
    r = enginecheck.engine_run(models, "static", "chain", k=2, context=8, tokens=6)
    assert r["equals_target_alone"] is False and r["first_difference"] == 3
    margin = min(m for m in r["margins"] if m is not None)  # compare's rule: the smaller of the two
    near = margin <= r["near_tie_bound"]
    assert margin >= 0 and r["verdict"] == ("near-tie flipped by floating point" if near
                                            else "unexplained: please report")
    line = enginecheck.lines({"chain": r}, None)[1]
    # 1-based, as `run` and the bench count: the fourth token
    assert f"output NOT the target alone's from output token 4 ({r['verdict']}; the top-2 margins " in line


def test_a_clock_can_keep_part_of_its_budget_back_for_a_later_section():
    clock = gpumeasure.Clock(100.0)
    kept = clock.keeping(40.0)
    assert 59.0 < kept.left() <= 60.0 and 99.0 < clock.left() <= 100.0
    assert kept.start == clock.start  # the same time spent on both


def test_a_check_cut_short_leaves_the_report_so_far(monkeypatch):
    """On the device a `timeout` kills gpucheck at its limit: the report and the profile were written
    only at the end, so a run cut in its engine sections left nothing but its log. Each section now
    hands the report so far to the checkpoint (written to --out, marked partial)."""
    from specviz import enginecheck

    def cut(*args, **kwargs):
        raise KeyboardInterrupt  # what the timeout's SIGTERM amounts to: nothing after it runs

    monkeypatch.setattr(enginecheck, "engine_run", cut)
    from dataclasses import replace

    snapshots = []
    s = replace(gpumeasure.Settings.for_device("cpu", True), fast_widths=(1, 3, 5))  # 3: past the goals'
    with pytest.raises(KeyboardInterrupt):
        gpucheck.run(s, log=lambda line: None, checkpoint=snapshots.append)
    last = snapshots[-1]
    assert last["partial"] is True and {"eager", "fast"} <= set(last["paths"])
    assert last["identity"]["fast_greedy_equals_eager"] and last["goals"]
    assert set(profiles.load(last["profile"]).paths) >= {"eager", "fast"}
    # the widths past the goals' were timed before the engine sections
    assert set(last["paths"]["fast"]["target_ms"]) == {1, 3, 5}
    assert "PARTIAL" in last["profile"]["note"]


def test_with_one_shared_graph_a_further_wide_width_is_priced_at_a_capture(monkeypatch):
    """The widths after the goals' were priced at the costliest first use so far, a compile
    (22-30 s on the H200), so with 40 s left gpucheck skipped them all, though each needs only a
    capture once the shared wide graph is compiled."""
    from specviz.gpumeasure import CAPTURE_SECONDS, width_price

    seconds = {1: 25.0, 5: 28.0}  # width 1's graph, then the shared wide one: both compiled
    assert width_price(seconds, 9, shared=True) == CAPTURE_SECONDS
    assert width_price(seconds | {9: 1.5, 3: 2.5}, 17, shared=True) == 2.5  # captures measured
    assert width_price(seconds, 9, shared=False) == 28.0  # a graph a width: each compiles
    assert width_price({1: 25.0}, 5, shared=True) == 25.0  # the shared graph not compiled yet


def test_the_fastest_probed_mode_gives_gpucheck_its_flags(tmp_path, monkeypatch, capsys):
    """docs/gpu-next.sh runs gpucheck under the probe's fastest mode: the one whose chain round
    (k draft passes and a target pass of k + 1 tokens) costs least, by hand from the H200's
    figures; the defaults' mode unless another beats it by more than 2%; never a mode that failed
    or fell back to eager, nor one of another capture than gpucheck runs."""
    from specviz import fastpath, graphprobe

    monkeypatch.setattr(fastpath, "CAPTURE", "direct")
    for name, on in (("PACK", False), ("NESTED", False), ("SHARED", True), ("TUNED", False)):
        monkeypatch.setattr(fastpath, name, on)
    probed = Path(__file__).parents[1] / "docs/gpu-2026-12-04b/capture-modes-h200.json"
    h200 = json.loads(probed.read_text())
    direct = h200["modes"]["direct"]  # draft 1.7309 ms, target 2.9331 (1) and 3.5071 (5)
    assert graphprobe.round_ms(direct) == pytest.approx(4 * 1.7309425 + 3.507145)
    faster = {"draft_ms": 1.2, "target_ms": {"1": 2.5, "5": 3.1}, "compiled_ok": True}  # 7.9 ms
    report = {"modes": {"direct+shared": direct,  # 10.431 ms
                        "direct+packed+shared": {**faster, "draft_ms": 1.70},  # 9.9 ms: 5% faster
                        "direct+tuned+packed+shared": faster,
                        "trees+shared": {**faster, "draft_ms": 0.1},  # gpucheck cannot pick its capture
                        "direct+nested+shared": {**faster, "compiled_ok": False},  # eager: not its speed
                        "direct+tuned+shared": {"error": "RuntimeError: ..."}}}
    assert graphprobe.fastest(report) == (
        "direct+tuned+packed+shared", ["--pack", "on", "--nested", "off", "--shared", "on", "--tuned", "on"])
    close = {"draft_ms": 1.70, "target_ms": {"1": 2.9, "5": 3.45}}  # 10.25 ms: 1.7% faster, within noise
    assert graphprobe.fastest({"modes": {"direct+packed+shared": close, "direct+shared": direct}})[0] \
        == "direct+shared"
    assert graphprobe.fastest({"modes": {"direct+packed+shared": close}})[0] == "direct+packed+shared"
    assert graphprobe.fastest({"modes": {"direct+shared": {"draft_ms": 1.0, "target_ms": {"1": 2.0}}}}) \
        == (None, [])  # no wide pass timed: no round to price
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(report))
    assert graphprobe.main(["--fastest", str(path)]) == 0
    assert capsys.readouterr().out == "--pack on --nested off --shared on --tuned on\n"
    path.write_text(json.dumps({"modes": {}}))
    graphprobe.main(["--fastest", str(path)])
    assert capsys.readouterr().out == "\n"
    # a probe that wrote no report (or a cut one): no flags, a line saying so (a traceback before)
    # and one of another shape (a hand-edited or foreign file): the same line, a traceback before
    for body in (None, "{\"modes\": {", "[1]", "{\"modes\": [1]}", "{\"modes\": {\"direct\": 3}}",
                 "{\"modes\": {\"direct+shared\": {\"draft_ms\": 1.0, \"target_ms\": {\"a\": 2, \"b\": 3}}}}",
                 ):
        if body is not None:
            path.write_text(body)
        assert graphprobe.main(["--fastest", str(path if body else tmp_path / "none.json")]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.startswith("graphprobe --fastest: ")
        assert "the defaults stand" in out.err


def test_the_prepared_device_call_names_modes_and_flags_its_tools_accept():
    """docs/gpu-next.sh runs once, on a machine lent for minutes: every mode it probes is one
    graphprobe accepts, and gpucheck's parser takes each flag set --fastest can hand it."""
    import itertools
    import re

    from specviz import fastpath, graphprobe
    from specviz.cli import build_parser

    script = (Path(__file__).parents[1] / "docs/gpu-next.sh").read_text()
    names = re.search(r"--modes (\S+)", script).group(1).split(",")
    assert names == ["direct+shared", "direct+packed+tuned+shared"]  # the defaults first, as they are
    probe = int(re.search(r"timeout -k 15 (\d+) python3 -m specviz.graphprobe", script).group(1))
    total = int(re.search(r"left=\$\(\((\d+) - ", script).group(1))
    assert total - probe - 40 >= 290  # gpucheck's budget less the seconds before the probe: over its
    # default 270 s, where the old split left it about 190
    for name in names:
        capture, extras = graphprobe.mode_parts(name)
        assert capture == fastpath.CAPTURE and extras <= graphprobe.EXTRAS
    assert "--fastest" in script and "$flags" in script
    assert list(graphprobe.FLAG_EXTRAS) == [flag for flag, _, _ in gpucheck.STEP_FLAGS]
    assert set(graphprobe.FLAG_EXTRAS.values()) == graphprobe.EXTRAS
    for ons in itertools.product(("on", "off"), repeat=len(graphprobe.FLAG_EXTRAS)):
        flags = [w for flag, on in zip(graphprobe.FLAG_EXTRAS, ons, strict=True) for w in (f"--{flag}", on)]
        args = build_parser().parse_args(["gpucheck", "--device", "cuda", "--budget", "150", *flags,
                                          "--out", "o"])
        assert [getattr(args, flag) for flag in graphprobe.FLAG_EXTRAS] == list(ons)


def test_the_prepared_second_device_call_runs_its_sweep_end_to_end(tmp_path):
    """docs/gpu-sweep.sh, the architecture sweep on CUDA after gpu-next.sh, runs where nothing else
    can be tried first: here as its dry run (DEVICE=cpu), both stages, every row what its header
    says it should be, the OPT fallback's line in the rows, and no pytest imported on the way."""
    root = Path(__file__).parents[1]
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(tmp_path / "no-pytest")}
    (tmp_path / "no-pytest").mkdir()
    (tmp_path / "no-pytest" / "pytest.py").write_text("raise ImportError('the device has no pytest')\n")
    done = subprocess.run(["bash", "docs/gpu-sweep.sh"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "arch-sweep.jsonl").read_text().splitlines()]
    assert [r["argv"][r["argv"].index("--paths") + 1] for r in rows if r.get("header")] == \
        ["eager,graphed", "compiled"]
    runs = [r for r in rows if "outcome" in r]
    # the compiled stage starts runs while its wall-clock budget lasts: on a CPU busy beside this
    # test its last run (opt's tree) can be "skipped", as the script's header says
    late = [r for r in runs if r["outcome"] == "skipped"]
    assert all(r["path"] == "compiled" and (r["arch"], r["proposer"]) == ("opt", "tree") for r in late), late
    assert {r["outcome"] for r in runs} - {"skipped"} == {"identical", "refused"}, done.stdout[-3000:]
    assert {(r["arch"], r["proposer"]) for r in runs if r["outcome"] == "refused"} == \
        {("bloom", "tree"), ("falcon_alibi", "tree")}
    assert {r["arch"] for r in runs if r["path"] == "compiled"} == {"mistral", "opt"}
    opt = next(r for r in runs if r["arch"] == "opt" and r["path"] == "compiled" and r["proposer"] == "draft")
    assert any("running eager from now on" in line for line in opt["logged"]), opt
    assert "tally:" in done.stdout and "total:" in done.stdout


def test_the_report_says_how_its_steps_were_built_and_its_profile_the_command(monkeypatch):
    """gpucheck's "compiled steps" line left out the tuning and described packed, captured steps
    where nothing compiled (a CPU, --compile off); a profile's note named the plain command
    whatever flags measured it, though the note is its one record of how."""
    from specviz import fastpath

    steps = {"capture": "direct", "pack": True, "nested": False, "shared": True, "tuned": True,
             "candidates": 16}
    cuda = {"steps": steps, "settings": {"device": "cuda", "compile": True}}
    assert gpucheck.steps_line(cuda) == (
        "compiled steps: capture direct, packed projections, every layer traced, one graph for all "
        "widths over 1, coordinate-descent tuning on, head refined over the top 16 logits first")
    assert gpucheck.steps_line({**cuda, "settings": {"device": "cpu", "compile": True}}) == (
        "compiled steps: no graphs (not CUDA), every layer traced, one graph for all widths over 1, "
        "head refined over the top 16 logits first")
    assert gpucheck.steps_line({**cuda, "settings": {"device": "cuda", "compile": False}}) \
        == "fast path: static caches, eager steps (nothing compiled)"
    s = gpumeasure.Settings.for_device("cuda")
    assert gpucheck.command_of(s) == "python -m specviz gpucheck --device cuda"
    for name, on in (("PACK", True), ("TUNED", True), ("SHARED", False)):
        monkeypatch.setattr(fastpath, name, on)
    assert gpucheck.command_of(s) == ("python -m specviz gpucheck --device cuda --pack on --shared off "
                                      "--tuned on")
    quick = gpumeasure.Settings.for_device("cpu", True, dtype="float32", compile=True)
    assert gpucheck.command_of(quick) == ("python -m specviz gpucheck --device cpu --quick --dtype float32 "
                                          "--compile on --pack on --shared off --tuned on")
    off = gpumeasure.Settings.for_device("cuda", compile=False)  # the step flags change nothing
    assert gpucheck.command_of(off) == "python -m specviz gpucheck --device cuda --compile off"
    assert gpucheck.command_of(off, every=True) == gpucheck.command_of(off)  # nothing compiled
    assert gpucheck.command_of(s, every=True) == ("python -m specviz gpucheck --device cuda --pack on "
                                                  "--nested off --shared off --tuned on")


def test_a_probe_modes_profiler_failure_keeps_its_timings_for_the_choice(monkeypatch):
    """A mode whose kernel tables failed was marked failed whole, so --fastest dropped timings it
    had measured (every mode, should the profiler fail on the GPU: gpucheck then ran the defaults
    silently). A mode whose timing failed is not profiled again (it would compile again)."""
    from specviz import fastpath, graphprobe

    def time_path(models, path, s, clock, widths, skipped, label):
        if fastpath.TUNED:
            raise RuntimeError("compile failed")
        return {"draft_ms": 1.0 if fastpath.PACK else 1.5, "target_ms": {1: 2.0, 5: 2.5}, "compiled_ok": True}

    profiled = []

    def kernel_share(model, s, width=1, refine=True):
        profiled.append((fastpath.PACK, fastpath.TUNED))
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(gpumeasure, "time_path", time_path)
    monkeypatch.setattr(graphprobe, "kernel_share", kernel_share)
    out = {}
    graphprobe.modes(["direct+shared", "direct+packed+shared", "direct+tuned+shared"], [], out, [],
                     lambda: None, repeats=2, device="cpu", quick=True)
    assert out["direct+packed+shared"]["kernels_error"].startswith("RuntimeError: CUPTI")
    assert "error" not in out["direct+packed+shared"] and out["direct+tuned+shared"]["error"]
    assert profiled == [(False, False), (True, False)]  # not the mode whose timing failed
    assert graphprobe.fastest({"modes": out})[0] == "direct+packed+shared"  # 6.5 against 8.5 ms


def test_the_copy_bandwidth_counts_bytes_read_and_written_over_the_median_timed_copy(monkeypatch):
    """1 MiB copied in a median 2^-10 s (of 2^-12, 2^-10 and 2^-6), read and written: 2 MiB a copy,
    2.147483648 GB/s; the first two copies (10 s each here) are untimed warm-ups."""
    clock, copies = FakeTime(), []
    real_copy = torch.Tensor.copy_
    seconds = [10.0, 10.0, 2.0 ** -6, 2.0 ** -12, 2.0 ** -10]

    def copy(dst, src):
        clock.now += seconds[len(copies)]
        copies.append(1)
        return real_copy(dst, src)

    monkeypatch.setattr(gpumeasure, "time", clock)
    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    gbs = gpumeasure.copy_bandwidth("cpu", mib=1, repeats=3)
    monkeypatch.undo()
    assert len(copies) == 5 and math.isclose(gbs, 2 * 2**20 * 2**10 / 1e9)


@pytest.mark.parametrize(("seconds", "warmup", "settle", "repeats", "ms"), [
    ((9.0, 5.0, 5.0, 0.001, 0.002, 0.009), 3, 0.0, 3, 2.0),  # the median of the passes after the warm-ups
    ((5.0, 0.3, 0.3, 0.004), 1, 0.5, 1, 4.0),  # the first timed pass starts 0.6 s after the first pass
])
def test_pass_times_are_the_median_of_the_passes_after_warm_up_and_settling(monkeypatch, seconds, warmup,
                                                                            settle, repeats, ms):
    clock = FakeTime()
    lm = TimedPasses(clock, seconds)
    monkeypatch.setattr(gpumeasure, "time", clock)
    got = gpumeasure.pass_ms(lm, [1, 2], 2, repeats=repeats, warmup=warmup, device="cpu", vocab=50,
                             settle=settle)
    assert math.isclose(got, ms) and len(lm.fed) == len(seconds)
    assert lm.fed[0] == ([1, 2, 1, 4], 2) and lm.fed[1] == ([1, 2, 8, 11], 2)  # 2 new tokens a pass
    assert lm.rolled == [[1, 2, 0]] * len(seconds)  # back to the context after every pass


def test_a_wide_width_is_priced_at_a_capture_only_after_the_first_wide_one_and_never_width_one():
    from specviz.gpumeasure import CAPTURE_SECONDS, width_price

    # width 2 compiled the shared graph; 9 was its capture
    assert width_price({1: 20.0, 2: 30.0, 9: 1.0}, 17, shared=True) == 1.0
    assert width_price({1: 20.0, 2: 30.0}, 17, shared=True) == CAPTURE_SECONDS
    assert width_price({5: 28.0, 9: 1.5}, 1, shared=True) == 28.0  # width 1: a graph of its own


def at_the_bars(eager_ms: float, fast_ms: float, draft_ms: float) -> profiles.Profile:
    return profiles.Profile("bars", {"name": "x"}, {}, {
        "eager": profiles.PathCosts("dynamic", False, 7.0, ((1, eager_ms), (5, eager_ms))),
        "fast": profiles.PathCosts("static", True, draft_ms, ((1, fast_ms), (5, fast_ms)))})


@pytest.mark.parametrize(("eager_ms", "fast_ms", "draft_ms", "speedup", "met"), [
    (12.0, 3.0, 1.5, 2.0, True),  # 4x, 3x the limit, 0.5 and 2x: each exactly at its bar
    (10.5, 3.5, 1.925, 1.99, False),  # 3x, 3.5x the limit, 0.55 and 1.99x: each past it
])
def test_each_goal_is_met_at_its_bar_and_not_past_it(monkeypatch, eager_ms, fast_ms, draft_ms, speedup, met):
    rows = [{"drafter": "draft-4", "k": 4, "ms_per_token": 1.0, "speedup": speedup, "extrapolated": False}]
    monkeypatch.setattr(gpucheck.profiles, "projection", lambda profile, path: rows)
    # 1 GB a pass over 1000 GB/s: a limit of 1 ms, 1000 tokens a second
    s = gpucheck.summary(at_the_bars(eager_ms, fast_ms, draft_ms), 1_000_000_000, 1000.0, None, 4)
    assert s["bandwidth_limit_ms"] == 1.0 and s["bandwidth_limit_tokens_per_second"] == 1000.0
    values = [g["value"] for g in s["goals"][:4]]
    want = [eager_ms / fast_ms, fast_ms, draft_ms / fast_ms, speedup]
    assert all(math.isclose(v, w) for v, w in zip(values, want, strict=True)), values
    assert [g["met"] for g in s["goals"][:4]] == [met] * 4
    assert [g["bar"] for g in s["goals"][:4]] == [4, 3, 0.5, 2]
    alone = s["target_alone"]["fast"]
    assert math.isclose(alone["ms"], fast_ms) and math.isclose(alone["tokens_per_second"], 1e3 / fast_ms)
    assert math.isclose(alone["over_limit"], fast_ms)


def test_every_identity_check_must_hold_for_the_identity_goal():
    for key in gpumeasure.IDENTITY_KEYS:
        ident = dict.fromkeys(gpumeasure.IDENTITY_KEYS, True) | {key: False}
        assert gpucheck.summary(hand_profile(), 1, 1.0, ident, 4)["goals"][4]["met"] is False, key


def goal_report(*met) -> dict:
    return {"profile": hand_profile().to_dict(),
            "goals": [{"goal": f"goal {i}", "value": 1.0, "met": m, "bar": 1} for i, m in enumerate(met)]}


@pytest.mark.parametrize(("met", "strict", "code"), [
    ((True, None, True), True, 0),  # a goal not measured is no failure
    ((True, False, None), True, 1),
    ((True, False, None), False, 0),  # without --strict: 0 whatever was missed
])
def test_strict_exits_1_only_when_a_measured_goal_is_missed(tmp_path, monkeypatch, capsys, met, strict, code):
    from specviz.cli import main

    monkeypatch.setattr(gpucheck, "run", lambda s, log, checkpoint: goal_report(*met))
    argv = ["gpucheck", "--device", "cpu", "--json", "--out", str(tmp_path)] + ["--strict"] * strict
    assert main(argv) == code
    assert json.loads((tmp_path / "gpucheck.json").read_text())["goals"] == goal_report(*met)["goals"]
    assert profiles.load(tmp_path / "hand.json") == hand_profile()



def test_strict_exits_1_where_the_fast_paths_capture_failed(tmp_path, monkeypatch):
    """Its four timing goals are "not judged" and the identity goal not measured (eager against
    eager): no goal reads False, yet the path the goals are about never ran."""
    from specviz.cli import main

    report = goal_report(True, None, None, None, None)
    report["profile"]["paths"]["fast"]["note"] = "compiled capture failed: eager steps"
    monkeypatch.setattr(gpucheck, "run", lambda s, log, checkpoint: report)
    argv = ["gpucheck", "--device", "cpu", "--json", "--out", str(tmp_path)]
    assert main(argv + ["--strict"]) == 1 and main(argv) == 0


def test_the_settings_gpucheck_runs_with_come_from_its_arguments(tmp_path, monkeypatch, capsys):
    from specviz.cli import main

    seen = []
    monkeypatch.setattr(gpucheck, "run", lambda s, log, checkpoint: seen.append(s) or goal_report(True))
    monkeypatch.setattr(gpucheck.torch.cuda, "is_available", lambda: False)
    out = ["--json", "--out", str(tmp_path)]
    # the edges of --repeats 1..1000 and --budget 10..3600 are accepted
    assert main(["gpucheck", "--repeats", "1", "--budget", "10", *out]) == 0
    assert main(["gpucheck", "--device", "cpu", "--repeats", "1000", "--budget", "3600", "--no-real",
                 *out]) == 0
    assert main(["gpucheck", "--device", "cpu", "--repeats", "1001", *out]) == 2
    assert main(["gpucheck", "--device", "cpu", "--budget", "3601", *out]) == 2
    assert [(s.device, s.repeats, s.budget, s.real) for s in seen] == [("cpu", 1, 10.0, True),
                                                                       ("cpu", 1000, 3600.0, False)]
    monkeypatch.setattr(gpucheck.torch.cuda, "is_available", lambda: True)  # the default device: cuda here
    assert main(["gpucheck", *out]) == 0 and seen[-1].device == "cuda" and seen[-1].compile is True


def test_the_hardware_line_gives_memory_in_gib_and_the_copy_bandwidth_to_two_decimals(monkeypatch):
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 3 * 2**18}  # 3 GiB
    monkeypatch.setattr(gpucheck.os, "sysconf", pages.__getitem__)
    monkeypatch.setattr(gpucheck.os, "cpu_count", lambda: 6)
    hw = gpucheck.hardware("cpu", 12.3456)
    assert (hw["device"], hw["memory_gib"], hw["cpus"], hw["copy_gbs"]) == ("cpu", 3.0, 6, 12.35)
    assert ", 6 CPUs, torch " in hw["name"]
    from types import SimpleNamespace

    props = SimpleNamespace(name="GPU " + "x" * 120, total_memory=int(139.8 * 2**30))
    monkeypatch.setattr(gpucheck.torch.cuda, "get_device_properties", lambda index: props)
    assert gpucheck.hardware("cuda", 4250.06) == {"device": "cuda", "name": props.name[:100],
                                                  "memory_gib": 139.8, "cpus": 6, "copy_gbs": 4250.1}


def test_the_text_report_prints_the_hand_computed_figures():
    """2 GB a pass over 4000 GB/s: a 0.5 ms limit, 2000 tok/s; the fast target at 1.48 ms a token is
    675.7 tok/s and 2.96x the limit, printed 2.96 beside the 3x bar (not rounded to 3.0)."""
    hand = hand_profile()
    fast = profiles.PathCosts("static", True, 0.1, ((1, 1.48), (5, 1.6)))
    prof = profiles.Profile("hand", {"name": "x", "device": "cpu"}, {"torch": "t", "transformers": "x",
                                                                     "python": "p", "cuda": None},
                            {"eager": hand.paths["eager"], "fast": fast})
    s = gpucheck.summary(prof, 2_000_000_000, 4000.0, None, 4)
    report = {"profile": prof.to_dict(), "settings": {"device": "cpu", "compile": False}, "steps": {},
              "seconds": 1.0, "bandwidth_gbs": 4000.0, "skipped": ["a width (time budget)"],
              "weights": {"target": {"read_per_pass": 2_000_000_000}},
              "paths": {"fast": {"seconds": {"1": 0.5}, "draft_seconds": 0.2, "compiled_ok": True}}, **s}
    lines = gpucheck.text(report).splitlines()
    assert "copy bandwidth 4000.0 GB/s; target reads 2.000 GB a pass: limit 0.500 ms, 2000 tok/s" in lines
    assert "target alone, fast: 1.480 ms/token, 675.7 tok/s, 2.96x the bandwidth limit" in lines
    assert "target alone, eager: 8.000 ms/token, 125.0 tok/s, 16.0x the bandwidth limit" in lines
    assert "skipped: a width (time budget)" in lines
    goals = lines[lines.index("goals (set for an H200):") + 1:]
    assert goals[1] == "  met          target alone on the fast path within 3x of the bandwidth limit: 2.96"
    assert goals[4] == "  not measured fast-path greedy identical to eager (float32): None"


def identity_with(monkeypatch, eager=None, fast=None) -> dict:
    """identity() on a tiny model, the eager or the fast path's logits changed by eager(logits) or
    fast(logits)."""

    class Changed(CachedLM):
        def forward(self, ids, last=1):
            logits = super().forward(ids, last)
            change = fast if self.static else eager
            return logits if change is None else change(logits)

    monkeypatch.setattr(gpumeasure, "CachedLM", Changed)
    model = gpumeasure.random_model(tiny(), "cpu", torch.float32, seed=4)
    return gpumeasure.identity(model, gpumeasure.Settings.for_device("cpu", True))


def below_the_least(logits):
    """0.25 off each row's least logit: every argmax as it was."""
    return logits - 0.25 * torch.nn.functional.one_hot(logits.argmin(-1), logits.shape[-1])


def test_the_identity_check_reports_each_comparison_and_the_exact_differences(monkeypatch):
    r = identity_with(monkeypatch, fast=below_the_least)
    assert (r["tokens"], r["k"], r["fast_greedy_equals_eager"], r["fast_verify_equals_eager"]) \
        == (12, 4, True, True)
    assert r["eager_equals_cache_free"] and r["first_difference"] is None and r["compiled_ok"] is None
    assert math.isclose(r["max_logit_difference"], 0.25, rel_tol=1e-5)  # the most, not the mean
    model = gpumeasure.random_model(tiny(), "cpu", torch.float32, seed=4)
    prompt = torch.randint(0, 300, (32,), generator=torch.Generator().manual_seed(3)).tolist()
    _, rows = gpumeasure.greedy(CachedLM(model, 300), prompt, 12)
    top2 = rows.topk(2, dim=-1).values
    assert r["min_top2_margin"] == float((top2[:, 0] - top2[:, 1]).min())  # the nearest tie


def test_the_identity_check_catches_an_eager_path_that_differs(monkeypatch):
    """An eager cache that misleads: eager differs from the cache-free forward, and the (right)
    fast path from eager, greedy and verify rounds both."""
    def wrong(logits):
        return logits + 1e3 * torch.nn.functional.one_hot(logits.argmin(-1), logits.shape[-1])

    r = identity_with(monkeypatch, eager=wrong)
    assert [r[key] for key in gpumeasure.IDENTITY_KEYS] == [False, False, False]
    assert r["first_difference"] == 0


class Staged:
    """gpucheck.run with every measurement stood in for: each time_path call spends `costs[i]` of a
    fake clock's budget and records what it was asked; the rest records its arguments."""

    def __init__(self, monkeypatch, costs, real_cached=False, identity=None, real_identity=None):
        self.spent, self.costs = 0.0, list(costs)
        self.calls, self.built, self.engines, self.loaded = [], [], [], []
        staged = self

        class Clock:
            def __init__(self, budget):
                self.budget = budget

            def left(self):
                return self.budget - staged.spent

            def keeping(self, seconds):
                return Clock(self.budget - seconds)

            elapsed = property(lambda self: staged.spent)

        def time_path(models, path, s, clock, widths, skipped, label, into=None, margin=1.0):
            self.calls.append((label, path, tuple(widths), clock.left(), into is not None, margin))
            self.spent += self.costs.pop(0)
            out = into or {"cache": "dynamic" if path == "eager" else "static", "compiled": False,
                           "dtype": s.dtype, "target_ms": {}, "seconds": {}, "draft_ms": 0.5, "max_len": 99}
            for w in widths:
                out["target_ms"][w], out["seconds"][w] = 1.0 + w, 1.0
            return out

        def random_model(cfg, device, dtype, seed):
            self.built.append((dtype, seed))
            return gpumeasure.random_model(tiny(1), device, dtype, seed)

        def ident(model, s):
            return dict(identity if model.dtype == torch.float32 and not self.loaded else real_identity)

        def real_models(device, dtype, roles=("target", "draft")):  # None: the cache is not built
            self.loaded.append((dtype, roles))
            if not real_cached:
                return None
            return {r: gpumeasure.random_model(tiny(1), device, dtype, 7) for r in roles}

        pair = {r: gpumeasure.random_model(tiny(1), "cpu", torch.float32, i)
                for i, r in enumerate(gpumeasure.ROLES)}
        for name, value in {"Clock": Clock, "time_path": time_path, "random_model": random_model,
                            "identity": ident, "real_models": real_models, "preflight": lambda device: None,
                            "copy_bandwidth": lambda device, mib: 100.0, "random_pair": lambda *a: pair,
                            "real_cached": lambda: real_cached}.items():
            monkeypatch.setattr(gpucheck, name, value)
        monkeypatch.setattr(gpucheck.enginecheck, "engine_run",
                            lambda models, fast, kind, *a: self.engines.append(kind) or {"kind": kind})


SAME = dict.fromkeys(gpumeasure.IDENTITY_KEYS, True) | {"compiled_ok": None}


def staged_settings(quick=False, **changes):
    from dataclasses import replace

    return replace(gpumeasure.Settings.for_device("cpu", quick), budget=100.0, fast_widths=(1, 5, 9, 3),
                   **({"real": False} | changes))


def test_gpucheck_times_the_goals_widths_first_then_the_rest_and_checks_identity_on_a_float32_target(
        monkeypatch):
    staged = Staged(monkeypatch, [10.0] * 4, identity=SAME)
    report = gpucheck.run(staged_settings(), log=lambda line: None)
    assert [c[1:3] + c[4:] for c in staged.calls] == [
        ("eager", gpumeasure.Settings.for_device("cpu").eager_widths, False, 1.0),
        ("fast", (1, 5), False, 1.0), ("fast", (9, 3), True, 2.0)]  # C_T(1) and C_T(k+1) first
    assert staged.calls[2][3] == 80.0  # nothing kept back without a real pair to time
    assert staged.built == [(torch.float32, 0)]  # the timed target's architecture and seed
    assert report["identity"] == SAME and report["goals"][4]["met"] is True
    assert staged.engines == ["self", "tree", "chain"] and report["skipped"] == []
    assert [c["note"] for c in report["profile"]["paths"].values()] == ["", ""]  # no capture failed
    read = report["weights"]["target"]["read_per_pass"]
    assert read < report["weights"]["target"]["bytes"]
    assert math.isclose(report["bandwidth_limit_ms"], read / 100e9 * 1e3)  # the bytes a pass reads


def test_a_graphed_path_that_raises_outside_its_steps_costs_nothing_after_it(monkeypatch):
    """ZeroGPU's graphed path, timed before the goals' fast widths, has never run through CachedLM
    on a GPU: an error outside its steps' own fallback (slots, packing, the head) ended the whole
    check there. It is said, left out, and the goals, identity and engine rounds still come."""
    from specviz import fastpath

    staged = Staged(monkeypatch, [10.0] * 4, identity=SAME)
    monkeypatch.setattr(fastpath, "GRAPH_DEVICES", ("cpu",))
    staged_time_path = gpucheck.time_path

    def time_path(models, path, *a, **kw):
        if path == "graphed":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        return staged_time_path(models, path, *a, **kw)

    monkeypatch.setattr(gpucheck, "time_path", time_path)
    lines = []
    report = gpucheck.run(staged_settings(), log=lines.append)
    assert report["skipped"] == ["graphed path: RuntimeError: CUDA error: operation not permitted when "
                                 "stream is capturing"]
    assert set(report["profile"]["paths"]) == {"eager", "fast"} and report["goals"][4]["met"] is True
    assert staged.engines == ["self", "tree", "chain"]
    assert any(line.startswith("graphed path failed, left out") for line in lines)


def test_an_identity_check_that_raises_leaves_its_goal_unmeasured_and_the_rest_runs(monkeypatch):
    staged = Staged(monkeypatch, [10.0] * 4, identity=SAME)

    def identity(model, s):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(gpucheck, "identity", identity)
    report = gpucheck.run(staged_settings(), log=lambda line: None)
    assert report["skipped"] == ["float32 identity check: OutOfMemoryError: CUDA out of memory. Tried to "
                                 "allocate 2.00 GiB"]
    assert report["identity"] is None and report["goals"][4]["met"] is None
    assert staged.engines == ["self", "tree", "chain"]


def test_a_tight_budget_skips_the_identity_and_engine_sections_except_with_quick(monkeypatch):
    # 15 s of 100 left after eager, 5 after the fast widths: under 5 + 2.5 or 3.5 captures of 1 s
    staged = Staged(monkeypatch, [85.0, 1.0, 9.0], identity=SAME)
    report = gpucheck.run(staged_settings(), log=lambda line: None)
    assert report["identity"] is None and staged.built == [] and report["goals"][4]["met"] is None
    assert report["skipped"] == ["float32 identity check (time budget)", "engine rounds, self (time budget)",
                                 "engine rounds, tree (time budget)", "engine rounds, chain (time budget)"]
    staged = Staged(monkeypatch, [85.0, 1.0, 9.0], identity=SAME)
    report = gpucheck.run(staged_settings(quick=True), log=lambda line: None)
    assert report["identity"] == SAME and staged.engines == ["self", "tree", "chain"]


@pytest.mark.parametrize(("costs", "real_identity", "skipped"), [
    ([10.0, 1.0, 1.0, 1.0, 1.0], True, []),  # 40 s of 100 kept back for the real pair
    ([10.0, 1.0, 1.0, 70.0, 1.0], False, ["real pair: float32 identity check (time budget)"]),
    ([10.0, 1.0, 50.0], None, [f"engine rounds, {kind} (time budget)" for kind in ("self", "tree", "chain")]
     + ["real pair (time budget)"]),
])
def test_the_real_pair_has_its_share_of_the_budget_kept_back(monkeypatch, costs, real_identity, skipped):
    staged = Staged(monkeypatch, costs, real_cached=True, identity=SAME, real_identity=SAME)
    report = gpucheck.run(staged_settings(real=True), log=lambda line: None)
    assert staged.calls[2][2:] == ((9, 3), 100.0 - 11.0 - 40.0, True, 2.0)  # the rest: within the 60 s
    real = [c[1:3] for c in staged.calls if c[0] == "real"]
    assert real == ([("eager", (1, 5)), ("fast", (1, 5))] if real_identity is not None else [])
    assert staged.loaded == [(torch.bfloat16, ("target", "draft"))] * (real_identity is not None) \
        + [(torch.float32, ("target",))] * bool(real_identity)
    assert (report["real_identity"] == SAME) is bool(real_identity) and report["skipped"] == skipped


def test_no_budget_is_kept_back_for_a_real_pair_whose_cache_is_not_built(monkeypatch):
    staged = Staged(monkeypatch, [10.0, 1.0, 1.0], real_cached=False, identity=SAME)
    report = gpucheck.run(staged_settings(real=True), log=lambda line: None)
    assert staged.calls[2][2:] == ((9, 3), 100.0 - 11.0, True, 2.0)  # all of the rest, none kept back
    assert staged.loaded == [(torch.bfloat16, ("target", "draft"))]  # asked once, and not there
    assert report["real"] is None and report["skipped"] == ["real pair: the embedded cache is not built here"]


@pytest.mark.parametrize(("random", "real", "met"), [
    (SAME, SAME | {"fast_verify_equals_eager": False}, False),  # the real target's check failed
    (SAME | {"compiled_ok": False}, SAME | {"compiled_ok": True}, None),  # a capture failed on one
    (SAME | {"compiled_ok": True}, SAME | {"compiled_ok": True}, True),
])
def test_the_identity_goal_needs_both_targets_checks(monkeypatch, random, real, met):
    Staged(monkeypatch, [10.0, 1.0, 1.0, 1.0, 1.0], real_cached=True, identity=random, real_identity=real)
    report = gpucheck.run(staged_settings(real=True), log=lambda line: None)
    assert report["identity"] == random and report["real_identity"] == real
    assert report["goals"][4]["met"] is met


def fake_passes(monkeypatch) -> list:
    """pass_ms stood in for: 10 ms a token of width; each call's (width, warmup, static cache)."""
    calls = []

    def pass_ms(lm, ctx, width, repeats, warmup, device, vocab, settle=0.0):
        calls.append((width, warmup, lm.static))
        return 10.0 * width

    monkeypatch.setattr(gpumeasure, "pass_ms", pass_ms)
    return calls


def test_a_path_is_timed_width_by_width_and_the_first_width_whatever_the_budget(monkeypatch):
    calls = fake_passes(monkeypatch)
    models = {role: gpumeasure.random_model(tiny(2), "cpu", torch.float32, seed=i)
              for i, role in enumerate(gpumeasure.ROLES)}
    s = gpumeasure.Settings.for_device("cpu", quick=True)  # 16 tokens of context, eager widths 1, 2, 5
    skipped = []
    out = gpumeasure.time_path(models, "eager", s, gpumeasure.Clock(0.0), (1, 2, 5), skipped, "random")
    assert (out["cache"], out["compiled"], out["dtype"]) == ("dynamic", False, "bfloat16")
    assert out["draft_ms"] == 10.0
    assert out["target_ms"] == {1: 10.0} and set(out["seconds"]) == {1} and "compiled_ok" not in out
    assert out["max_len"] == 16 + 5 + 2  # the context, the widest pass and 2
    assert skipped == [f"random eager: target width {w} (time budget)" for w in (2, 5)]
    assert calls == [(1, 1, False), (1, 1, False)]  # the draft's pass, the target's: one warm-up each


def test_a_graphed_path_warms_up_past_its_capture_and_says_when_a_capture_failed(monkeypatch, cpu_graphs):
    calls = fake_passes(monkeypatch)
    models = {role: gpumeasure.random_model(tiny(2), "cpu", torch.float32, seed=i)
              for i, role in enumerate(gpumeasure.ROLES)}
    # the draft's capture failed, the target's did not
    monkeypatch.setattr(gpumeasure, "compiled_throughout", lambda lm: lm.model is not models["draft"])
    s = gpumeasure.Settings.for_device("cpu", quick=True)
    out = gpumeasure.time_path(models, "graphed", s, gpumeasure.Clock(60.0), (1,), [], "random")
    assert out["compiled"] and out["compiled_ok"] is False and out["max_len"] >= 1024
    out = gpumeasure.time_path(models, "graphed", s, gpumeasure.Clock(60.0), (5,), [], "random", into=out)
    assert out["compiled_ok"] is False and out["target_ms"] == {1: 10.0, 5: 50.0}  # still failed
    assert calls == [(1, 3, True), (1, 3, True), (5, 3, True)]  # capture, graph warm-up, replay


def test_a_pass_run_eager_for_want_of_memory_is_not_a_compiled_one():
    from types import SimpleNamespace

    assert gpumeasure.compiled_throughout(SimpleNamespace(_step=object(), memory_fallbacks=0))
    assert not gpumeasure.compiled_throughout(SimpleNamespace(_step=object(), memory_fallbacks=1))
    assert not gpumeasure.compiled_throughout(SimpleNamespace(_step=None))


def test_verify_rounds_corrupt_a_draft_every_other_round():
    """With an lm that always predicts the reference, a round keeps all k drafts and its own token,
    but every other round one draft (position round % k) is off by one: the rounds then keep 1 + 1
    and 0 + 1 tokens, so the cache is rolled back past rejected ones."""
    prompt, reference, k = [1, 2], list(range(10, 22)), 3
    truth, fed = prompt + reference + [0] * (k + 1), []

    class Oracle:
        vocab_size = 50

        def forward(self, ids, last=1):
            fed.append(ids[-k:])
            rows = torch.zeros(last, 50)
            for j in range(last):
                rows[j, truth[len(ids) - last + j + 1]] = 1.0
            return rows

    assert gpumeasure.verify_rounds(Oracle(), prompt, reference, k) == reference
    assert fed == [[10, 11, 12], [14, 16, 16], [16, 17, 18], [21, 21, 0], [21, 0, 0]]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_preflight_refuses_a_cache_whose_logits_are_off_by_a_hundredth(monkeypatch, kind):
    forward = CachedLM.forward

    def off(self, ids, last=1):
        return forward(self, ids, last) + (0.01 if self.static == (kind == "static") else 0.0)

    monkeypatch.setattr(CachedLM, "forward", off)
    with pytest.raises(ValueError, match=f"specviz's {kind} cache gives wrong logits .*difference 0.01 from"):
        gpumeasure.preflight("cpu")


def test_preflight_refuses_a_cache_that_is_not_rolled_back(monkeypatch):
    from specviz import kvcache

    monkeypatch.setattr(kvcache, "crop", lambda cache, remove: None)  # the written 2 positions stay
    with pytest.raises(ValueError, match="specviz's (dynamic|static) cache"):
        gpumeasure.preflight("cpu")


def test_random_models_differ_by_seed():
    a, b = (gpumeasure.random_model(tiny(1), "cpu", torch.float32, seed=i) for i in (0, 1))
    assert not torch.equal(a.get_output_embeddings().weight, b.get_output_embeddings().weight)


def test_the_settings_each_device_measures_with():
    cuda, cpu, quick = (gpumeasure.Settings.for_device(d, q) for d, q in (("cuda", False), ("cpu", False),
                                                                          ("cpu", True)))
    assert (cuda.compile, cuda.repeats, cuda.context, cuda.k, cuda.copy_mib, cuda.budget, cuda.settle) \
        == (True, 20, 128, 4, 2048, 270.0, 0.25)
    assert cuda.eager_widths == (*range(1, 18), 33, 65) and cuda.fast_widths == (1, 5, 9, 3, 2, 17, 33, 65)
    assert (cuda.identity_tokens, cuda.engine_tokens, cuda.real, cuda.dtype) == (48, 48, True, "bfloat16")
    assert (cpu.compile, cpu.repeats, cpu.context, cpu.copy_mib, cpu.budget, cpu.settle) \
        == (False, 3, 64, 256, 900.0, 0.0)
    assert cpu.eager_widths == (1, 2, 3, 5, 9, 17) and cpu.fast_widths == (1, 5, 9, 3, 2, 17)
    assert (quick.repeats, quick.context, quick.eager_widths, quick.fast_widths, quick.copy_mib, quick.real,
            quick.budget, quick.identity_tokens) == (3, 16, (1, 2, 5), (1, 5), 64, False, 120.0, 12)
    assert gpumeasure.Settings.for_device("cuda", repeats=None, budget=30.0).budget == 30.0  # None: unset


@pytest.mark.parametrize("tied", [False, True])
def test_a_pass_reads_every_weight_but_the_input_embedding_unless_the_head_is_that_matrix(tied):
    """parameters() yields a tied weight once: taking the input embedding off the total then also
    took off the head every pass reads (15% of a tied 1.5B model), which lowered the bandwidth limit
    and flattered the "x the limit" figure."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specviz.gpumeasure import weight_bytes

    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(config)
    embedding = 64 * 16 * 4  # float32
    total = sum(p.numel() * 4 for p in model.parameters())
    assert weight_bytes(model) == (total, total if tied else total - embedding)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
