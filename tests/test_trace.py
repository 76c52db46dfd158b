"""Traces: round trip, and rejection of malformed or oversized ones with a clear message."""

import json

import pytest

import specviz
from specviz import explorer, trace
from specviz.render import all_spans


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
