"""An opened trace shows what the live run showed: the views read from a trace name its tokens as
the run did, and the Run tab's buttons act on it as on the run it holds."""

import json
from dataclasses import replace

import pytest
from conftest import handler
from test_hostile_app import args, page_request

import specviz
from specviz import explorer, trace
from specviz.compare import compare
from specviz.metrics import RunStats
from specviz.render import all_spans
from specviz.service import replay_view
from specviz.settings import Limits, RunSettings
from specviz.store import pair_models
from specviz.views import verdict_html


def flipped_trace(pair, prompt: str = "def fibonacci(n):", n: int = 12):
    """A greedy run's trace whose baseline took the target's second choice at one output position
    (a near-tie flipped by floating point, as a bfloat16 run's can be), where that token is none of
    the run's own: the verdict names it."""
    ids = pair.encode(prompt)
    events = list(specviz.generate(pair, ids, k=3, max_new_tokens=n))
    spans = all_spans(events, pair.tokenizer, ids)
    shown = {s.token for s in spans}
    alone = list(specviz.generate(pair, ids, proposer="none", max_new_tokens=n))
    at = next(i for i, e in enumerate(alone) if e.target_top2[0][1][0] not in shown)
    e = alone[at]
    (a, la), (b, lb) = e.target_top2[0]
    base = alone[:at] + [replace(e, token=b, new_tokens=[b], target_top2=[[(b, la), (a, la - 1e-4)]],
                                 stop="length")]
    rec = explorer.record(pair, ids, RunStats.of(events), "draft", n)
    t = trace.Trace({"k": 3, "temperature": 0.0, "proposer": "draft", "max_new_tokens": n,
                     "prompt": prompt}, pair_models(pair), ids, tuple(events), tuple(spans),
                    tuple(base), rec)
    return trace.loads(t.to_json()), b


def test_an_opened_runs_verdict_names_the_top2_tokens_as_the_live_run_did(pair):
    """The live verdict decodes the top-2 ids with the pair's tokenizer; opened (the same pair
    loaded) it named a token no span shows as ⟨id⟩, and a token whose span holds part of a
    character by that span's text, so the two pages disagreed on the same run."""
    opened, b = flipped_trace(pair)
    live = verdict_html(compare(opened.stats, RunStats.of(opened.baseline), pair.dtype, pair.device,
                                pair.numerics), pair.tokenizer, True)
    assert "differ" in live and f"⟨{b}⟩" not in live
    assert replay_view(opened, pair).verdict_html == live


def test_an_opened_runs_verdict_labels_a_partial_character_by_its_bytes_as_the_live_run_did(pair):
    """The live verdict labels a token holding part of a character by its bytes (detok.token_label):
    opened with the pair that made it, the same label; with no pair, the text the trace holds."""
    from specviz.detok import token_label
    from specviz.service import _NoTokenizer

    opened, _ = flipped_trace(pair)
    partial = [i for i in range(pair.vocab_size) if "\ufffd" in pair.tokenizer.decode([i])]
    assert len(partial) > 10
    live = [token_label(pair.tokenizer, i) for i in partial]
    assert len(set(live)) == len(live) and not any("\ufffd" in shown for shown in live)
    assert [token_label(_NoTokenizer(opened, pair), i) for i in partial] == live
    # without it, a partial character's id the trace holds reads as its text (partial[0] read "⟨95⟩",
    # no U+FFFD: a label that could be nothing else)
    alone = _NoTokenizer(opened)
    held = [i for i in partial if "\ufffd" in alone.text.get(i, "")]
    assert held and all(token_label(alone, i) == repr(alone.text[i]) for i in held)


def test_an_opened_runs_verdict_without_its_pair_names_tokens_the_trace_holds(pair):
    """With no pair loaded, a token the trace's recording names (token_text: each id decoded
    alone, as the live verdict decodes it) is named so, not ⟨id⟩."""
    opened, b = flipped_trace(pair)
    text = {str(t): f"«{t}»" for t in set(opened.prompt_ids) | set(opened.stats.tokens) | {b}}
    opened = trace.loads(json.dumps(json.loads(opened.to_json()) | {
        "recording": opened.recording.to_dict() | {"token_text": text}}))
    verdict = replay_view(opened).verdict_html
    assert f"«{b}»" in verdict and f"⟨{b}⟩" not in verdict


def test_an_opened_runs_verdict_from_another_pair_names_tokens_the_trace_holds(pair):
    """A trace another pair made, opened while this one is loaded: its ids are that pair's, so the
    verdict names them as the trace does (its recording's token_text), never as the loaded
    tokenizer decodes them."""
    opened, b = flipped_trace(pair)
    text = {str(t): f"«{t}»" for t in set(opened.prompt_ids) | set(opened.stats.tokens) | {b}}
    d = json.loads(opened.to_json())
    d["recording"]["token_text"] = text
    d["models"]["target"] = "someone/another-target"
    elsewhere = trace.loads(json.dumps(d))
    verdict = replay_view(elsewhere, pair).verdict_html
    assert f"«{b}»" in verdict


def test_an_opened_runs_verdict_names_an_id_past_the_vocabulary_by_its_number(pair):
    """An edited trace that names the loaded pair as its maker may hold an id the pair's tokenizer
    has not got (its baseline's token here, past the vocabulary): decoded, it read as "", an empty
    token in the verdict; it is named by its number, as a trace without its pair names it."""
    opened, _ = flipped_trace(pair)
    d = json.loads(opened.to_json())
    far, last = pair.vocab_size + 5, d["baseline"][-1]
    last["token"], last["new_tokens"] = far, [far]
    last["target_top2"][0][0][0] = far  # the baseline's choice, beside the run's token
    edited = trace.loads(json.dumps(d))
    for verdict in (replay_view(edited, pair).verdict_html, replay_view(edited).verdict_html):
        assert "differ" in verdict and f"⟨{far}⟩" in verdict


@pytest.fixture(scope="module")
def demo(model_dirs):
    import app
    from specviz.store import ModelStore

    store = ModelStore({"tiny": (str(model_dirs["target"]), str(model_dirs["draft"]))}, device="cpu")
    return app.build(store, Limits(max_new_tokens=200),
                     RunSettings(pair="tiny", chat=False, max_new_tokens=8, dtype="float32"))


def test_a_float32_rerun_of_an_opened_trace_from_before_trees_is_not_refused(demo, tmp_path):
    """A trace from before trees has no nodes or branching in its settings (docs/trace-format.md);
    opened, the page's controls hold the run's settings and the page's defaults for those two, and
    "Re-run in float32" said "the page's settings changed since the last run" though the visitor
    changed nothing (and those two are for the token tree only)."""
    run = list(handler(demo, "run")(page_request("older"), None, *args(dtype="bfloat16")))[-1]
    saved = json.loads(demo.specviz.shelf.get(run[16]).to_json())
    for name in ("nodes", "branching"):
        del saved["settings"][name]
    path = tmp_path / "older.json"
    path.write_text(json.dumps(saved))
    request = page_request("older-open")
    opened = list(handler(demo, "open_trace")(str(path), request))[-1]
    key, controls = opened[16], [c["value"] if isinstance(c, dict) else c for c in opened[17:32]]
    shown = list(handler(demo, "rerun_float32")(request, None, key, *controls))[-1]
    assert shown[0].startswith("Done in float32"), shown[0]
    demo.specviz.shelf.drop(key)


def test_a_float32_rerun_ignores_what_the_run_never_read_and_names_what_changed(demo):
    """"Re-run in float32" refused a chain run whose tree branching slider moved, or a greedy run
    whose seed, top-k or top-p did, though the run never read them, and it said the settings
    changed without saying which."""
    import gradio as gr

    request = page_request("rerun-unread")
    rerun = handler(demo, "rerun_float32")

    def last_run() -> str:  # a greedy chain run in bfloat16: the page's last
        return list(handler(demo, "run")(request, None, *args(dtype="bfloat16")))[-1][16]

    unread = args(dtype="bfloat16", branching=3, nodes=6, seed=7, top_k=5, top_p=0.5)
    assert list(rerun(request, None, last_run(), *unread))[-1][0].startswith("Done in float32")
    with pytest.raises(gr.Error, match=r"changed since the last run \(k, prompt\): this button"):
        list(rerun(request, None, last_run(), *args(dtype="bfloat16", k=2, prompt="x = 1")))
    tree = list(handler(demo, "run")(request, None, *args(dtype="bfloat16", proposer="tree", nodes=6)))[-1]
    with pytest.raises(gr.Error, match=r"changed since the last run \(nodes\)"):  # a tree reads them
        list(handler(demo, "rerun_float32")(request, None, tree[16], *args(dtype="bfloat16", proposer="tree",
                                                                          nodes=8)))
    demo.specviz.shelf.drop(tree[16])


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
@pytest.mark.parametrize("baseline", [True, False])
def test_the_explorer_says_an_opened_trace_without_its_recording_holds_none(demo, tmp_path, proposer,
                                                                            baseline):
    """docs/trace-format.md tells a visitor to set "recording" to null to open a longer n-gram
    trace; the k explorer then gave a live run's reasons for the missing recording: "stopped at the
    job's time limit" (no baseline) or "the draft model cannot read every token" (draft). A trace
    with no baseline is one the time limit stopped (specviz keeps every finished run's), so that
    one still names the limit, as the live page did."""
    request = page_request(f"unrecorded-{proposer}-{baseline}")
    run = list(handler(demo, "run")(request, None, *args(proposer=proposer)))[-1]
    saved = json.loads(demo.specviz.shelf.get(run[16]).to_json())
    assert saved["recording"] is not None
    saved["recording"] = None
    if not baseline:
        saved["baseline"] = []
    path = tmp_path / "unrecorded.json"
    path.write_text(json.dumps(saved))
    key = list(handler(demo, "open_trace")(str(path), request))[-1][16]
    numbers, _, fig = handler(demo, "explore")(3, False, "", key, request)
    said = "holds no recording" if baseline else "stopped at the job&#x27;s time limit"
    assert said in numbers and fig is None, numbers
    demo.specviz.shelf.drop(key)
