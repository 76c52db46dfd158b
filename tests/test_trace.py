"""Traces: round trip, and rejection of malformed or oversized ones with a clear message."""

import json
from dataclasses import asdict, fields

import pytest
import torch

import specviz
from specviz import explorer, trace
from specviz.render import all_spans
from specviz.tree import TreeNode


@pytest.fixture(scope="module")
def saved(pair):
    ids = pair.encode("def fibonacci(n):")
    events = list(specviz.generate(pair, ids, k=3, max_new_tokens=20))
    base = list(specviz.generate(pair, ids, proposer="none", max_new_tokens=20))
    stats = specviz.RunStats.of(events)
    rec = explorer.record(pair, ids, stats, "draft", 20)
    t = trace.Trace({"k": 3, "prompt": "def fibonacci(n):"}, {"target": "tiny", "draft": "tiny-d"},
                    ids, tuple(events), tuple(all_spans(events, pair.tokenizer, ids)), tuple(base), rec)
    return t, t.to_json()


def test_round_trip_keeps_everything(saved):
    t, text = saved
    back = trace.loads(text)
    assert back == t
    assert back.stats.summary()["tokens_per_pass"] == t.stats.summary()["tokens_per_pass"]
    assert explorer.replay(back.recording, 5) == explorer.replay(t.recording, 5)


def mutate(text, fn):
    d = json.loads(text)
    fn(d)
    return json.dumps(d)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.update(version=99), "version 99 is not supported"),
    (lambda d: d.update(events=[]), r"events must be a list of 1\.\."),
    (lambda d: d["events"][0].update(accepted="many"), r"events\[0\]\.accepted must be an integer"),
    (lambda d: d["events"][0].pop("token"), r"events\[0\] fields differ.*: missing token"),
    (lambda d: d["events"][0].update(__class__="x"), r"events\[0\] fields differ.*: unknown '__class__'"),
    (lambda d: d["events"][0].update(stop="exploded"), "stop"),
    (lambda d: d["spans"][0].update(fate="<script>"), "fate"),
    (lambda d: d.update(prompt_ids=["a"]), "prompt_ids"),
    (lambda d: d["recording"].update(proposer="rm -rf"), "proposer"),
    (lambda d: d["recording"].update(guesses=[1]), "recording.guesses"),
    (lambda d: d["recording"].update(confidences=[2.0] * len(d["recording"]["output"])), "confidences"),
])
def test_malformed_traces_are_rejected_clearly(saved, change, message):
    with pytest.raises(trace.TraceError, match=message):
        trace.loads(mutate(saved[1], change))


def test_every_setting_the_page_or_an_operator_allows_saves_a_trace_that_opens(saved, monkeypatch):
    """Save wrote traces Open refused: a custom pair's names of up to the page's 1,000 characters
    (traces took 256), and any run where an operator allowed more than a trace holds (4,096 new
    tokens, 100,000 prompt characters). Names now open as the page takes them, and an operator's
    limit past a trace's stops start-up, naming the bound."""
    from dataclasses import replace

    from specviz.settings import (
        MAX_NAME_CHARS,
        TRACE_MAX_NEW_TOKENS,
        TRACE_MAX_PROMPT_CHARS,
        TRACE_MAX_PROMPT_TOKENS,
        Limits,
    )

    t, _ = saved
    named = replace(t, settings={**t.settings, "pair": "custom", "target": "t" * MAX_NAME_CHARS,
                                 "draft": "d" * MAX_NAME_CHARS, "max_new_tokens": TRACE_MAX_NEW_TOKENS})
    assert trace.loads(named.to_json()) == named
    for name, bound in (("SPECVIZ_MAX_NEW_TOKENS", TRACE_MAX_NEW_TOKENS),
                        ("SPECVIZ_MAX_PROMPT_CHARS", TRACE_MAX_PROMPT_CHARS),
                        ("SPECVIZ_MAX_PROMPT_TOKENS", TRACE_MAX_PROMPT_TOKENS)):
        monkeypatch.setenv(name, str(bound))
        Limits.from_env()  # the bound itself: allowed
        monkeypatch.setenv(name, str(bound + 1))
        with pytest.raises(ValueError, match=f"{name}='{bound + 1}' is over {bound}, the most a saved trace"):
            Limits.from_env()
        monkeypatch.delenv(name)


def test_older_traces_without_confidences_load_but_cannot_replay_adaptive(saved):
    back = trace.loads(mutate(saved[1], lambda d: d["recording"].pop("confidences")))
    assert explorer.replay(back.recording, 3).rounds == explorer.replay(saved[0].recording, 3).rounds
    with pytest.raises(ValueError, match="draft-model recordings with confidences"):
        explorer.replay_adaptive(back.recording)


def test_not_json_and_oversized_are_rejected():
    with pytest.raises(trace.TraceError, match="not JSON"):
        trace.loads("{nope")
    with pytest.raises(trace.TraceError, match=f"limit is {trace.MAX_TRACE_BYTES // 2**20} MiB"):
        trace.loads(" " * (trace.MAX_TRACE_BYTES + 1))


@pytest.fixture(scope="module", params=[0.0, 0.8], ids=["greedy", "sampled"])
def tree_saved(pair, request):
    """A real tree run of the tiny pair, saved as the app saves it (no recording: the k explorer
    replays chain runs only)."""
    ids = pair.encode("def fibonacci(n):")
    events = list(specviz.generate(pair, ids, proposer="tree", k=3, max_new_tokens=12,
                                   temperature=request.param))
    settings = {"k": 3, "proposer": "tree", "temperature": request.param, "max_new_tokens": 12,
                "nodes": 0, "branching": 3}
    t = trace.Trace(settings, {"target": "tiny", "draft": "tiny-d"}, ids, tuple(events),
                    tuple(all_spans(events, pair.tokenizer, ids)))
    return t, t.to_json()


def test_tree_run_round_trips_with_every_node(tree_saved):
    t, text = tree_saved
    assert any(e.tree for e in t.events)
    back = trace.loads(text)
    assert back == t and all(type(n) is TreeNode for e in back.events for n in e.tree)
    assert [e.tree for e in back.events] == [e.tree for e in t.events]
    assert back.stats.summary() == t.stats.summary()
    assert back.stats.nodes_verified == sum(len(e.tree) or e.k for e in t.events)
    for e, d in zip(t.events, json.loads(text)["events"], strict=True):
        saved = d.get("tree", [])  # node objects, fields by name; probabilities to 9 digits,
        assert [x.keys() for x in saved] == [asdict(n).keys() for n in e.tree]
        for x, n in zip(saved, e.tree, strict=True):  # which carry their float32 values exactly
            assert {**x, **dict(zip(("p", "q", "score"), torch.tensor(
                [x["p"], x["q"], x["score"]]).tolist(), strict=True))} == asdict(n)
            assert len(json.dumps(x, separators=(",", ":"))) <= 112
        assert ("tree" in d) == bool(e.tree)  # a round that drafted nothing saves as a chain round


def test_chain_events_keep_their_shape_and_traces_without_trees_open(saved):
    t, text = saved
    d = json.loads(text)
    chain_keys = {f.name for f in fields(specviz.RoundEvent)} - {"tree"}
    assert all(e.keys() == chain_keys for e in d["events"] + d["baseline"])  # as before trees
    back = trace.loads(text)
    assert all(e.tree == () for e in back.events + back.baseline)
    # an old trace: no tree, no top-2 rows, settings without nodes and branching
    old = mutate(text, lambda d: [e.pop("target_top2") for e in d["events"]])
    assert [e.tree for e in trace.loads(old).events] == [()] * len(t.events)
    assert "nodes" not in back.settings and "branching" not in back.settings
    # an empty tree list (RoundEvent's own asdict) reads as a chain round too
    assert trace.loads(mutate(text, lambda d: [e.update(tree=[]) for e in d["events"]])) == back


def test_older_traces_without_a_verify_line_price_every_pass_at_the_mean(saved):
    fitted = trace.loads(mutate(saved[1], lambda d: d["recording"].update(verify_line=[0.25, 0.125])))
    assert fitted.recording.verify_line == (0.25, 0.125)  # a run's own fit loads as saved
    assert explorer.replay(fitted.recording, 3).predicted_seconds > 0
    back = trace.loads(mutate(saved[1], lambda d: d["recording"].pop("verify_line")))
    assert back.recording.verify_line is None
    priced = trace.loads(mutate(saved[1], lambda d: d["recording"].update(ngram_slope=0.55)))
    assert priced.recording.ngram_slope == 0.55 and priced.recording.lookup().slope == 0.55
    older = trace.loads(mutate(saved[1], lambda d: d["recording"].pop("ngram_slope")))
    assert older.recording.ngram_slope is None and older.recording.lookup().slope == 0.04
    stepped = trace.loads(mutate(saved[1], lambda d: d["recording"].update(ngram_step=0.7)))
    assert stepped.recording.ngram_step == 0.7 and stepped.recording.lookup().step == 0.7
    unstepped = trace.loads(mutate(saved[1], lambda d: d["recording"].pop("ngram_step", None)))
    assert unstepped.recording.ngram_step is None and unstepped.recording.lookup().step == 0.0
    rep = explorer.replay(back.recording, 3)
    assert rep.predicted_seconds == pytest.approx(rep.draft_passes * back.recording.draft_pass_seconds
                                                  + rep.target_passes * back.recording.target_pass_seconds)


def test_an_ngram_recording_replays_its_copies_as_it_drafted_them(saved):
    """Since 2026-12-06 an n-gram copy that reaches the context's end reads on in itself; a trace
    saved before drafted with copies cut there, and the k explorer replays each as its run drafted
    (an older run replayed by today's rule missed its own passes at its own k)."""
    assert json.loads(saved[1])["recording"]["ngram_reads_on"] is None  # a draft model's recording
    newer = trace.loads(mutate(saved[1], lambda d: d["recording"].update(ngram_reads_on=True)))
    assert newer.recording.ngram_reads_on is True and newer.recording.lookup().reads_on
    older = trace.loads(mutate(saved[1], lambda d: d["recording"].pop("ngram_reads_on")))
    assert older.recording.ngram_reads_on is None and not older.recording.lookup().reads_on
    with pytest.raises(ValueError, match="recording.ngram_reads_on must be true, false or null"):
        trace.loads(mutate(saved[1], lambda d: d["recording"].update(ngram_reads_on="yes")))
    # "7" repeated after a prompt ending in 7: the first token the target's alone, then whole copies
    made = {"proposer": "ngram", "prompt_ids": [1, 2, 3, 7], "output": [7] * 64, "guesses": [],
            "draft_pass_seconds": 0.0, "target_pass_seconds": 1.0, "max_new_tokens": 64,
            "ngram_slope": 0.04, "ngram_step": 0.0}
    reads_on = explorer.Recording(**made, ngram_reads_on=True)
    cut = explorer.Recording(**made)
    assert explorer.replay(reads_on, 8).target_passes == 8  # 1 + 7 rounds of 8 kept and 1 more
    assert explorer.replay(cut, 8).target_passes == 33  # 1 + 32 rounds of 1 kept and 1 more
