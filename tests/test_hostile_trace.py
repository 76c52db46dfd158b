"""Opened traces are hostile input: every field typed and bounded, refused at once with a message
naming the field, the largest accepted trace opens in bounded time, and no string reaches HTML
unescaped. Synthetic traces: no model needed."""

import gc
import json
import re
import time

import pytest

from specviz import explorer, labview, trace, tracecheck
from specviz.compare import Comparison
from specviz.render import Span, to_html
from specviz.service import replay_view
from specviz.views import verdict_html

XSS = '<img src=x onerror=alert(1)>'


def synthetic(rounds=6, k=3, prompt=5, kept=None, baseline=True, differ_at=None, text="ab"):
    """A valid trace as a dict: round i keeps kept(i) of k drafts (default i % (k + 1)); the
    baseline makes the same tokens, or another token at output position differ_at."""
    kept = kept or (lambda i: i % (k + 1))
    prompt_ids = [(7 * j) % 300 for j in range(prompt)]
    events, spans, pos = [], [], 0
    for i in range(1, rounds + 1):
        n, token = kept(i), (13 * i) % 300
        draft = [(token + 1 + j) % 300 for j in range(k)]
        new = draft[:n] + [token]
        events.append(_event(i, k, n, draft, token, new, pos, prompt))
        spans += [_span(text, "accepted", t, i, j + 1) for j, t in enumerate(draft[:n])]
        spans.append(_span(text, "target" if not k else "bonus" if n == k else "recovered", token, i, 0))
        spans += [_span(text, "rejected", t, i, j + 1) for j, t in enumerate(draft) if j >= n]
        pos += len(new)
    events[-1]["stop"] = "length"
    tokens = [t for e in events for t in e["new_tokens"]]
    base = []
    for i, t in enumerate(tokens if baseline else []):
        t = (t + 1) % 300 if i == differ_at else t
        base.append(_event(i + 1, 0, 0, [], t, [t], i, prompt))
    if base:
        base[-1]["stop"] = "length"
    m = len(tokens)
    recording = {"proposer": "draft", "prompt_ids": prompt_ids, "output": tokens,
                 "guesses": [(t + 1) % 300 for t in tokens], "draft_pass_seconds": 0.01,
                 "target_pass_seconds": 0.02, "max_new_tokens": m, "ngram_size": 3,
                 "output_pieces": [text] * m, "guess_pieces": [text] * m,
                 "token_text": {str(t): text for t in set(prompt_ids + tokens)}, "confidences": [0.5] * m}
    return {"format": "specviz-trace", "version": 1,
            "settings": {"k": min(max(k, 1), 16), "temperature": 0.0, "proposer": "draft",
                         "max_new_tokens": m, "prompt": "p", "chat": True, "dtype": "auto"},
            "models": {"target": "t", "draft": "d", "dtype": "float32", "device": "cpu"},
            "prompt_ids": prompt_ids, "events": events, "baseline": base, "spans": spans,
            "summary": {}, "recording": recording}


def _event(i, k, n, draft, token, new, pos, prompt):
    return {"round": i, "k": k, "draft_tokens": draft, "accepted": n, "token": token,
            "kind": "bonus" if n == k else "recovered", "new_tokens": new,
            "target_probs": [1.0] * n + [0.0] * (k - n), "draft_probs": [1.0] * k,
            "target_passes": i, "draft_passes": i * k, "draft_seconds": 0.01, "target_seconds": 0.02,
            "round_seconds": 0.035, "elapsed": 0.035 * i, "position": pos,
            "source": "draft" if k else "none", "target_cache_length": prompt + pos + len(new) - 1,
            "stop": None, "target_top2": [[[token, 12.5], [(token + 1) % 300, 11.25]]] * (k + 1)}


def _span(text, fate, token, round_, position):
    p = None if not position else 1.0 if fate == "accepted" else 0.0
    return {"text": text, "fate": fate, "token": token, "round": round_, "position": position,
            "p": p, "q": None if p is None else 1.0}


KEPT_FATES = {  # nodes 0..5 of a synthetic tree round that kept n drafts (a walk of the rule)
    0: "rejected rejected unreached unreached unreached unreached",
    1: "accepted unreached rejected rejected unreached unreached",
    2: "accepted unreached accepted unreached rejected unreached",
    3: "accepted unreached accepted unreached accepted unreached",
}


def tree_synthetic(rounds=6, extra=0, **kw):
    """synthetic() as a run of the tree drafter at k = 3. Each round verifies the tree
    root -> a (0), b (1); a -> c (2), d (3); c -> e (4); b -> f (5) and `extra` more leaves;
    a, c, e are its draft_tokens: the walked branch, whatever the round kept."""
    d = synthetic(rounds=rounds, k=3, baseline=False, **kw)
    d["settings"].update(proposer="tree", nodes=0, branching=3)
    d["recording"] = None  # the k explorer replays chain runs only
    for e in d["events"]:
        (a, c, x), n = e["draft_tokens"], e["accepted"]
        b, w = (a + 100) % 300, (c + 100) % 300
        shape = [(-1, a, 1, 1.0, 1.0), (-1, b, 1, 0.25, 0.25), (0, c, 2, 1.0, 1.0),
                 (0, w, 2, 0.25, 0.25), (2, x, 3, 1.0, 1.0)]
        shape += [(1, (b + 1 + j) % 300, 2, 0.5, 0.125) for j in range(1 + extra)]
        fates = KEPT_FATES[n].split() + ["unreached"] * extra
        kept = {0: n > 0, 2: n > 1, 4: n > 2}
        e["source"], e["tree"] = "tree", [
            {"parent": parent, "token": token, "depth": depth, "q": q, "score": score,
             "p": 1.0 if kept.get(i) else 0.0, "fate": fate}
            for i, ((parent, token, depth, q, score), fate) in enumerate(zip(shape, fates, strict=True))]
    return d


def refused(d_or_text, field: str, seconds: float = 1.0) -> str:
    """loads refuses it at once with a TraceError whose message names field."""
    text = d_or_text if isinstance(d_or_text, (str, bytes)) else json.dumps(d_or_text)
    start = time.process_time()
    with pytest.raises(trace.TraceError) as info:
        trace.loads(text)
    assert time.process_time() - start < seconds
    assert field in str(info.value), str(info.value)
    return str(info.value)


def test_the_synthetic_trace_is_valid_and_replays():
    t = trace.loads(json.dumps(synthetic()))
    assert len(t.events) == 6 and t.stats.new_tokens == len(t.recording.output)
    assert replay_view(t).verdict_html and explorer.replay(t.recording, 3).rounds


def test_spans_missing_q_or_p_still_show():
    d = synthetic()
    drafted = [s for s in d["spans"] if s["p"] is not None]
    drafted[0]["q"], drafted[1]["q"], drafted[2]["p"] = None, 0.0, None
    view = replay_view(trace.loads(json.dumps(d)))
    assert "p(x)=" in view.text_html and view.stats_html


def test_huge_k_in_an_event_is_refused_at_once():
    d = synthetic()
    d["events"][0]["k"] = 10**12
    refused(d, "events[0].k must be an integer in 0..32")


def test_the_synthetic_tree_trace_is_valid_and_shows():
    t = trace.loads(json.dumps(tree_synthetic()))
    assert [e.accepted for e in t.events] == [1, 2, 3, 0, 1, 2]
    assert [len(e.tree) for e in t.events] == [6] * 6 and t.stats.nodes_verified == 36
    assert t.settings["nodes"] == 0 and replay_view(t).text_html


def setter(path, value):
    def change(d):
        *parents, last = path
        for p in parents:
            d = d[p]
        d[last] = value(d) if callable(value) else value
    return change


MUTATIONS = [  # (path, bad value, field named in the message)
    (("events", 0, "k"), 33, "events[0].k"),
    (("events", 0, "k"), -1, "events[0].k"),
    (("events", 2, "accepted"), 4, "events[2].accepted"),
    (("events", 0, "draft_tokens"), [1, 2, 3, 4], "events[0].draft_tokens"),
    (("events", 0, "draft_tokens"), [-1, 2, 3], "events[0].draft_tokens"),
    (("events", 0, "draft_tokens"), [2**20, 2, 3], "events[0].draft_tokens"),
    (("events", 0, "draft_tokens"), [[1], [2], [3]], "events[0].draft_tokens"),
    (("events", 0, "token"), 2**40, "events[0].token"),
    (("events", 0, "kind"), "<script>", "events[0].kind"),
    (("events", 1, "kind"), "bonus", "events[1].kind"),
    (("events", 0, "new_tokens"), [], "events[0].new_tokens"),
    (("events", 0, "new_tokens"), list(range(10**5)), "events[0].new_tokens"),
    (("events", 1, "new_tokens"), [5, 5], "events[1].new_tokens"),
    # the kept drafts without the target's token, and no EOS: the budget never cuts there
    (("events", 1, "new_tokens"), lambda e: e["draft_tokens"][:2], "events[1].new_tokens may end"),
    (("events", 0, "target_probs"), [2.0, 0.0, 0.0], "events[0].target_probs"),
    (("events", 0, "target_probs"), [0.0], "events[0].target_probs"),
    (("events", 0, "draft_probs"), [-0.5, 1.0, 1.0], "events[0].draft_probs"),
    (("events", 0, "round"), 2, "events[0].round"),
    (("events", 1, "position"), 0, "events[1].position"),
    (("events", 0, "position"), False, "events[0].position"),
    (("events", 1, "draft_passes"), 0, "events[1].draft_passes"),  # cumulative: never falls
    (("events", 0, "target_passes"), 10**15, "events[0].target_passes"),
    (("events", 1, "target_passes"), 0, "events[1].target_passes"),
    (("events", 1, "target_passes"), 1, "events[1].target_passes"),  # 24 tokens in "1 pass"
    (("baseline", 2, "target_passes"), 2, "baseline[2].target_passes"),
    (("events", 0, "draft_seconds"), -1.0, "events[0].draft_seconds"),
    (("events", 0, "elapsed"), 1e300, "events[0].elapsed"),
    (("events", 0, "source"), "<script>", "events[0].source"),
    (("events", 0, "stop"), "exploded", "events[0].stop"),
    (("events", 0, "target_cache_length"), 2**40, "events[0].target_cache_length"),
    (("events", 0, "target_top2"), [[[1, 2.0]]], "events[0].target_top2"),
    (("events", 0, "target_top2"), [[[1, 2.0], [2, 1.0]]] * 3, "events[0].target_top2"),
    (("events", 0, "target_top2"), [[[1, 2.0], [2, 1.0], [3, 0.0]]] * 4, "events[0].target_top2"),
    (("events", 0, "target_top2"), [[["a", 2.0], [2, 1.0]]] * 4, "events[0].target_top2 ids"),
    (("events", 0, "target_top2"), [[[1, 1e300], [2, 1.0]]] * 4, "events[0].target_top2 logits"),
    (("events", 0, "target_top2"), [[[1, 2.0, 3], [2, 1.0]]] * 4, "events[0].target_top2"),
    (("events", 0, "target_top2"), ["ab", "cd", "ef", "gh"], "events[0].target_top2"),
    (("events", 0, "__class__"), "x", "events[0] fields differ"),
    (("events",), [[]] * 5, "events[0] must be an object"),
    (("events",), [], "events must be a list of 1..4096"),
    (("baseline", 0, "k"), 10**12, "baseline[0].k"),
    (("baseline",), {}, "baseline must be a list"),
    (("spans", 0, "text"), "x" * 5000, "spans[].text"),
    (("spans", 0, "text"), "\ud800", "spans[].text"),
    (("spans", 0, "fate"), "<script>", "spans[].fate"),
    (("spans", 0, "fate"), ["accepted"], "spans[].fate"),
    (("spans", 0, "token"), -5, "spans[].token"),
    (("spans", 0, "round"), 10**9, "spans[].round"),
    (("spans", 0, "position"), 9, "spans[].position"),
    (("spans", 0, "p"), 5.0, "spans[].p"),
    (("spans", 0, "q"), "0.5", "spans[].q"),
    (("spans", 0, "onclick"), "x", "spans[0] fields differ"),
    (("spans",), lambda d: d["spans"] * 10, "spans must be a list of 0.."),
    (("prompt_ids",), [], "prompt_ids"),
    (("prompt_ids",), ["a"], "prompt_ids"),
    (("prompt_ids",), [2**20], "prompt_ids"),
    (("settings",), [], "settings must be an object"),
    (("settings", "k"), 10**12, "settings.k"),
    (("settings", "k"), "4", "settings.k"),
    (("settings", "k"), 17, "settings.k must be an integer in 1..16"),
    (("settings", "top_k"), -1, "settings.top_k"),
    (("settings", "top_k"), 2**21, "settings.top_k"),
    (("settings", "target"), "x" * 1001, "settings.target"),
    (("settings", "prompt"), "p\udfff", "settings.prompt holds a lone surrogate"),
    (("models", "target"), "\ud800", "models.target holds a lone surrogate"),
    (("settings", "temperature"), -1, "settings.temperature"),
    (("settings", "top_p"), 0, "settings.top_p"),
    (("settings", "seed"), 2**70, "settings.seed"),
    (("settings", "max_new_tokens"), 10**9, "settings.max_new_tokens"),
    (("settings", "max_new_tokens"), 3, "events commit more tokens than settings.max_new_tokens"),
    (("settings", "prompt"), "x" * 200_000, "settings.prompt"),
    (("settings", "chat"), "yes", "settings.chat"),
    (("settings", "proposer"), "rm -rf", "settings.proposer"),
    (("settings", "dtype"), XSS, "settings.dtype"),
    (("settings", "__init__"), 1, "settings fields differ"),
    (("settings", "nodes"), 65, "settings.nodes must be an integer in 0..64"),
    (("settings", "nodes"), -1, "settings.nodes"),
    (("settings", "nodes"), "8", "settings.nodes"),
    (("settings", "branching"), -1, "settings.branching must be an integer in 0..8"),
    (("settings", "branching"), 9, "settings.branching"),
    (("settings", "branching"), True, "settings.branching"),
    (("models",), "x", "models must be an object"),
    (("models", "device"), 5, "models.device"),
    (("models", "device"), "x" * 1000, "models.device"),
    (("models", "dtype"), "_dynamo", "models.dtype"),
    (("models", "weights"), "x", "models fields differ"),
    (("recording", "proposer"), "rm -rf", "recording.proposer"),
    (("recording", "prompt_ids"), [1], "recording.prompt_ids"),
    (("recording", "output"), lambda r: r["output"][:-1], "recording.output"),
    (("recording", "guesses"), [1], "recording.guesses"),
    (("recording", "max_new_tokens"), 10**12, "recording.max_new_tokens"),
    (("recording", "max_new_tokens"), 1, "recording.max_new_tokens"),
    (("recording", "ngram_size"), 17, "recording.ngram_size"),
    (("recording", "draft_pass_seconds"), -1, "recording.draft_pass_seconds"),
    (("recording", "output_pieces"), ["x"], "recording.output_pieces"),
    (("recording", "guess_pieces"), lambda r: ["x" * 5000] * len(r["output"]), "recording.guess_pieces"),
    (("recording", "token_text"), {"abc": "x"}, "recording.token_text"),
    (("recording", "token_text"), {"1": 5}, "recording.token_text"),
    (("recording", "token_text"), {str(i): "x" for i in range(1000)}, "recording.token_text"),
    (("recording", "token_text"), {"9" * 5000: "x"}, "recording.token_text keys must be token ids"),
    (("recording", "token_text"), {"1048576": "x"}, "recording.token_text keys must be token ids"),
    (("recording", "token_text"), {"": "x", "5": "y"}, "recording.token_text keys must be token ids"),
    (("recording", "token_text"), {"\u0661": "x"}, "recording.token_text keys"),  # an Arabic-Indic 1
    (("recording", "token_text"), {"\u00b2": "x"}, "recording.token_text keys"),  # superscript 2
    (("recording", "output"), lambda r: [float(t) for t in r["output"]], "recording.output"),
    (("recording", "confidences"), lambda r: [2.0] * len(r["output"]), "recording.confidences"),
    (("recording", "verify_line"), [0.1, 0.05, 1.0], "recording.verify_line"),
    (("recording", "verify_line"), [0.1, -0.05], "recording.verify_line"),
    (("recording", "verify_line"), [0.0, 0.05], "recording.verify_line"),
    (("recording", "verify_line"), "0.1,0.05", "recording.verify_line"),
    (("recording", "ngram_slope"), -0.5, "recording.ngram_slope"),
    (("recording", "ngram_slope"), "0.5", "recording.ngram_slope"),
    (("recording", "ngram_slope"), 1e9, "recording.ngram_slope"),
    (("recording", "ngram_step"), -0.5, "recording.ngram_step"),
    (("recording", "ngram_step"), "0.7", "recording.ngram_step"),
    (("recording", "ngram_step"), 1e9, "recording.ngram_step"),
    (("recording", "callback"), "x", "recording fields differ"),
    (("version",), True, "version True is not supported"),
    (("version",), "1", "version '1' is not supported"),
    (("format",), "other", '"format" must be'),
    (("extra",), 1, "the top level fields differ"),
    (("summary",), 5, "summary must be an object"),
    # dropped once read, yet charged on the shelf by its text: 1.4 million [] were 100 MiB
    (("summary",), {"x": [[]] * 1000}, "summary must hold at most 1,000 values"),
]


@pytest.mark.parametrize("path, value, field", MUTATIONS, ids=[f"{'.'.join(map(str, p))}={f}"[:60]
                                                                 for p, _, f in MUTATIONS])
def test_each_hostile_field_is_refused_at_once_naming_it(path, value, field):
    d = synthetic()
    setter(path, value)(d)
    refused(d, field)


def node(r, i):
    """A change to node i of round r's tree: node(0, 1)(token=5), or a function of the node."""
    def change(**values):
        def apply(d):
            n = d["events"][r]["tree"][i]
            n.update({k: v(n) if callable(v) else v for k, v in values.items()})
        return apply
    return change


def tree_of(r, fn):
    def apply(d):
        d["events"][r]["tree"] = fn(d["events"][r]["tree"])
    return apply


def leaf(parent, token, depth, fate="unreached"):
    return {"parent": parent, "token": token, "depth": depth, "q": 1.0, "score": 1.0, "p": 0.0,
            "fate": fate}


# Round 0 kept 1 draft (its path ends at node 0), round 1 kept 2 (ends at node 2, recovered),
# round 2 kept all 3 (ends at the leaf 4, bonus), round 3 none.
TREE_MUTATIONS = [  # (change, field named in the message)
    # shape and types
    (tree_of(0, lambda t: {}), "events[0].tree must be a list of 0..64 tree nodes"),
    (tree_of(0, lambda t: t + [leaf(1, 200 + j, 2) for j in range(59)]),
     "events[0].tree must be a list of 0..64"),
    (tree_of(0, lambda t: [[]] + t[1:]), "events[0].tree[0] must be an object"),
    (node(0, 1)(onload="x"), "events[0].tree[1] fields differ"),
    (tree_of(0, lambda t: [{k: v for k, v in n.items() if k != "fate"} for n in t]),
     "events[0].tree[0] fields differ from parent, token, depth, q, score, p, fate: missing fate"),
    # the tree: parents first, depths follow them, siblings distinct
    (node(0, 0)(parent=0), "events[0].tree[0].parent must be an integer in -1..-1"),
    (node(0, 2)(parent=5), "events[0].tree[2].parent must be an integer in -1..1"),
    (node(0, 1)(parent=-2), "events[0].tree[1].parent"),
    (node(0, 2)(parent=1.0), "events[0].tree[2].parent"),
    (node(0, 2)(depth=3), "events[0].tree[2].depth must be 2"),
    (node(0, 0)(depth=0), "events[0].tree[0].depth"),
    (node(0, 0)(depth=True), "events[0].tree[0].depth"),
    (tree_of(0, lambda t: t + [leaf(4 if j == 0 else 5 + j, 7, 4 + j) for j in range(30)]),
     "events[0].tree[35].depth must be an integer in 1..32"),  # 33 deep: past MAX_K
    (node(0, 1)(token=lambda n: 2**20), "events[0].tree[].token"),
    (node(0, 1)(token=-1), "events[0].tree[].token"),
    (node(0, 1)(token="7"), "events[0].tree[].token"),
    (tree_of(0, lambda t: t[:2] + [dict(t[2], token=t[3]["token"])] + t[3:]),
     "events[0].tree[3].token must differ from its siblings"),
    # the numbers: probabilities, and score the product of q from the root
    (node(0, 1)(p=1.5), "events[0].tree[].p"),
    (node(0, 1)(q=-0.1), "events[0].tree[].q"),
    (node(0, 1)(score="0.25"), "events[0].tree[].score"),
    (node(0, 5)(score=0.25), "events[0].tree[5].score must be its parent's score × its q"),
    (node(0, 1)(q=0.5), "events[0].tree[1].score"),
    # the fates: the rule's walk
    (node(0, 1)(fate="<script>"), "events[0].tree[].fate must be one of accepted, rejected, unreached"),
    (node(0, 1)(fate=""), "events[0].tree[].fate"),
    (node(0, 1)(fate=["accepted"]), "events[0].tree[].fate"),
    (node(0, 1)(fate="accepted"), "events[0].tree[].fate must mark 1 nodes accepted"),
    (node(1, 2)(fate="rejected"), "events[1].tree[].fate must mark 2 nodes accepted"),
    (tree_of(2, lambda t: [dict(n, fate={3: "accepted", 4: "unreached"}.get(i, n["fate"]))
                           for i, n in enumerate(t)]), "events[2].tree[].fate must mark accepted a chain"),
    (node(0, 0)(token=lambda n: n["token"] + 50),
     "events[0].tree[].token of the accepted nodes must be draft_tokens"),
    (node(0, 3)(fate="unreached"),
     "events[0].tree[3].fate must be 'rejected': the round ended at its parent"),
    (node(0, 5)(fate="rejected"), "events[0].tree[5].fate must be 'unreached'"),
    (node(3, 2)(fate="rejected"), "events[3].tree[2].fate must be 'unreached'"),
    (tree_of(0, lambda t: t + [leaf(-1, 250, 1, "rejected")]),
     "events[0].tree[6].fate cannot follow an unreached sibling"),
    # the chain-shaped fields describe the walked branch
    (tree_of(2, lambda t: t + [leaf(4, 250, 4, "rejected")]), "events[2].kind must be 'bonus' exactly when"),
    (tree_of(1, lambda t: t[:4] + [dict(t[5], parent=1)]), "events[1].kind must be 'bonus' exactly when"),
    (tree_of(0, lambda t: t[:4] + [t[5]]), "events[0].draft_tokens must be the tree's walked branch"),
    (node(0, 4)(token=lambda n: n["token"] + 50), "events[0].draft_tokens must be the tree's walked branch"),
    (tree_of(0, lambda t: [t[0], t[1], t[3], t[2], dict(t[4], parent=3), t[5]]),  # c, d swapped
     "events[0].draft_tokens must be the tree's walked branch"),  # the branch follows first children
    (node(0, 0)(p=0.5), "events[0].target_probs must be the walked branch's p"),
    (node(0, 4)(q=0.5, score=0.5), "events[0].draft_probs must be the walked branch's q"),
    # trees belong to the tree drafter's rounds, and its rounds that drafted have one
    (lambda d: d["events"][0].update(source="draft"), "events[0].tree must be empty: only the tree drafter"),
    (tree_of(0, lambda t: []), "events[0].tree must hold the verified nodes"),
    (lambda d: d["events"][0].pop("tree"), "events[0].tree must hold the verified nodes"),
]


@pytest.mark.parametrize("change, field", TREE_MUTATIONS, ids=[f[:60] for _, f in TREE_MUTATIONS])
def test_each_hostile_tree_field_is_refused_at_once_naming_it(change, field):
    d = tree_synthetic()
    change(d)
    refused(d, field)


@pytest.mark.parametrize("name", ["parent", "token", "depth", "q", "score", "p", "fate"])
def test_wrong_types_in_every_tree_node_field_are_refused_naming_it(name):
    for i in range(6):
        for value in WRONG:
            d = tree_synthetic()
            d["events"][1]["tree"][i][name] = value
            refused(d, "events[1].tree")


def test_model_checks_count_every_tree_node():
    """A node the walk never reached is still fed to the target, so its id must fit the model,
    and the target's cache held every node of a round, not only the walked branch."""
    d = tree_synthetic()
    d["events"][0]["tree"][5]["token"] = 250  # an unreached leaf; every other id is below 200
    text = json.dumps(d)
    with pytest.raises(trace.TraceError, match=r"events\[0\]\.tree\[\]\.token"):
        trace.loads(text, vocab_size=250)
    t = trace.loads(text, vocab_size=251)
    with pytest.raises(trace.TraceError, match="id 250, outside the model.s vocabulary of 200"):
        trace.check_model(t, 200)
    # the last round: 5 prompt tokens + 12 generated before it + 6 nodes (the target's token
    # after them is never fed: prompt + new - 1 positions, as the engine asks)
    with pytest.raises(trace.TraceError, match="needs up to 23 positions; the model has 22: read it with "
                                                 "the model that made it"):
        trace.check_model(t, 300, 22)
    trace.check_model(t, 300, 23)


WRONG = [None, True, 1.5, -7, 10**30, "x", [], [1, "x"], {}, {"a": 1}]
VALID = {  # (part, field, value) among WRONG that a valid trace may hold there
    ("events", "target_top2", "[]"), ("events", "stop", "None"),
    *{("events", name, "1.5") for name in ("draft_seconds", "target_seconds", "round_seconds")},
    *{("baseline", name, "1.5") for name in ("draft_seconds", "target_seconds", "round_seconds")},
    ("baseline", "target_top2", "[]"), ("baseline", "stop", "None"),
    *{("baseline", name, "[]") for name in ("draft_tokens", "target_probs", "draft_probs")},
    ("settings", "temperature", "1.5"), ("models", "target", "None"), ("models", "draft", "None"),
    ("models", "dtype", "None"), ("models", "device", "None"),
    ("recording", "draft_pass_seconds", "1.5"), ("recording", "target_pass_seconds", "1.5"),
    ("recording", "output_pieces", "[]"), ("recording", "guess_pieces", "[]"),
    ("recording", "token_text", "None"), ("recording", "token_text", "{}"),
    ("recording", "confidences", "[]"), ("spans", "text", "'x'"), ("spans", "p", "None"),
    ("spans", "q", "None"), ("settings", "chat", "True"),
    *{("settings", name, "'x'") for name in ("pair", "target", "draft", "prompt")},
    *{("models", name, "'x'") for name in ("target", "draft", "device")},
}


@pytest.mark.parametrize("part", ["events", "baseline", "spans", "settings", "models", "recording"])
def test_wrong_types_in_every_field_are_refused_naming_it(part):
    base, listed = synthetic(), part in ("events", "baseline", "spans")
    where = {"events": "events[0]", "baseline": "baseline[0]", "spans": "spans"}.get(part, part)
    for name in (base[part][0] if listed else base[part]):
        for value in WRONG:
            d = json.loads(json.dumps(base))
            (d[part][0] if listed else d[part])[name] = value
            try:
                trace.loads(json.dumps(d))
            except trace.TraceError as e:
                # 1.5 s at round 1 is past round 2's elapsed: refused there, as a clock running back
                named = f"{where[:-2]}1].elapsed" if (name, value) == ("elapsed", 1.5) else where
                assert (part, name, repr(value)) not in VALID and named in str(e), (name, value, e)
            else:
                assert (part, name, repr(value)) in VALID, (name, value)


def test_deep_nesting_is_refused_before_parsing():
    refused("[" * 100_000 + "]" * 100_000, "nested deeper than 16")
    # a string ending in an escaped backslash ends there: the brackets after it count
    refused(b'["\\\\",' + b"[" * 40 + b"]" * 41, "nested deeper than 16")
    d = synthetic()
    d["summary"] = {"x": json.loads("[" * 20 + "]" * 20)}
    refused(d, "nested deeper than 16")
    d["summary"] = {"x": "[" * 50}  # brackets inside strings do not count
    assert trace.loads(json.dumps(d))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(constant):
    text = json.dumps(synthetic()).replace('"elapsed": 0.035,', f'"elapsed": {constant},', 1)
    refused(text, constant)


def test_overflowing_floats_are_refused_naming_the_field():
    text = json.dumps(synthetic()).replace('"draft_probs": [1.0, 1.0, 1.0]', '"draft_probs": [1e400, 1, 1]')
    refused(text, "events[0].draft_probs")


def test_huge_integers_are_refused():
    text = json.dumps(synthetic()).replace('"round": 1, "k": 3,', f'"round": 1, "k": {"9" * 5000},')
    message = refused(text, "not a valid specviz trace")
    assert "digits" in message or "events[0].k" in message
    text = json.dumps(synthetic()).replace('"round": 1, "k": 3,', f'"round": 1, "k": {"9" * 4000},')
    refused(text, "events[0].k")


@pytest.mark.parametrize("text", ["[]", '"trace"', "5", "null", "{nope", b"\xff\xfe{", "{}"])
def test_non_objects_and_broken_json_are_refused(text):
    refused(text, "not a valid specviz trace")


def test_a_refusal_quotes_at_most_a_clip_of_the_value():
    d = synthetic()
    d["settings"]["k"] = "A" * 3_000_000
    assert len(refused(d, "settings.k")) < 300


def test_only_text_is_accepted():
    with pytest.raises(trace.TraceError, match="expected JSON text"):
        trace.loads({"format": "specviz-trace"})


def test_over_the_size_cap_is_refused_at_once():
    # one byte over reads 4.1 MiB (rounded up), never "4.0 MiB; the limit is 4 MiB"
    refused(" " * (trace.MAX_TRACE_BYTES + 1), "trace is 4.1 MiB; the limit is 4 MiB")


def test_a_trace_of_exactly_the_size_cap_opens():
    """Save hands out a trace of up to MAX_TRACE_BYTES (app: one byte more is not saved), so one of
    exactly that size opens; the cap is on what is over it, not on what reaches it."""
    text = json.dumps(synthetic())
    at_cap = text + " " * (trace.MAX_TRACE_BYTES - len(text.encode()))  # JSON's trailing whitespace
    assert len(at_cap.encode()) == trace.MAX_TRACE_BYTES == 4 * 2**20
    assert trace.loads(at_cap) == trace.loads(text)
    refused(at_cap + " ", "trace is 4.1 MiB; the limit is 4 MiB")


def test_too_many_rounds_and_tokens_are_refused():
    d = synthetic(rounds=tracecheck.MAX_ROUNDS + 1, k=0, baseline=False)
    d["recording"] = None
    d["settings"].pop("max_new_tokens")
    refused(d, "events must be a list of 1..4096", seconds=5)
    d = synthetic(rounds=2000, k=2, kept=lambda i: 2, baseline=False)
    d["recording"] = None
    d["settings"].pop("max_new_tokens")
    refused(d, "events generate more than 4096 tokens", seconds=5)


def test_long_ngram_recordings_are_refused_with_a_way_out():
    d = synthetic(rounds=1500, k=1, kept=lambda i: 1, prompt=10, baseline=False)  # 3000 tokens
    rec = d["recording"]
    rec.update(proposer="ngram", guesses=[], guess_pieces=[], confidences=[])
    message = refused(d, "recording is an n-gram recording too long to replay", seconds=5)
    assert "set recording to null" in message
    d["recording"] = None
    assert trace.loads(json.dumps(d)).recording is None
    # a short output after a long prompt passes the first bound; the n-gram index bounds it too
    d = synthetic(rounds=10, k=1, kept=lambda i: 1, prompt=10_000, baseline=False)
    d["recording"].update(proposer="ngram", guesses=[], guess_pieces=[], confidences=[], ngram_size=9)
    assert 20 * (10_000 + 20) <= tracecheck.MAX_NGRAM_REPLAY
    refused(d, "(prompt + output tokens) × ngram_size must be at most 81920", seconds=5)
    d["recording"]["ngram_size"] = 8
    assert trace.loads(json.dumps(d)).recording.ngram_size == 8


def test_ids_are_checked_against_a_given_vocabulary_and_positions():
    text = json.dumps(synthetic())
    with pytest.raises(trace.TraceError, match=r"events\[1\]\.draft_tokens"):
        trace.loads(text, vocab_size=29)  # the prompt's ids are below 29, round 2 drafts 29
    # the last round: 5 prompt tokens + 12 generated before it + 3 drafts (its own token unfed)
    with pytest.raises(trace.TraceError, match="needs up to 20 positions; the model has 19"):
        trace.loads(text, vocab_size=300, max_positions=19)
    t = trace.loads(text, vocab_size=300, max_positions=20)
    with pytest.raises(trace.TraceError, match="id 81, outside the model.s vocabulary of 50"):
        trace.check_model(t, 50)
    with pytest.raises(trace.TraceError, match="id 81, outside the model.s vocabulary of 81"):
        trace.check_model(t, 81)  # the largest id is 81: a vocabulary of 82 holds it, one of 81 not
    trace.check_model(t, 82)


def test_html_from_a_hostile_trace_is_escaped():
    d = synthetic(differ_at=4, text=XSS)
    d["models"].update(target=XSS, draft=XSS, device=XSS)
    d["settings"]["prompt"] = XSS
    d["recording"]["token_text"] = {k: XSS for k in d["recording"]["token_text"]}
    view = replay_view(trace.loads(json.dumps(d)))
    assert "differ from output token 5 on" in view.verdict_html  # position 4, counted from 1
    assert "on &lt;img src=x" in view.verdict_html
    for name in ("text_html", "timeline_html", "stats_html", "verdict_html"):
        html = getattr(view, name)
        assert html and "<img" not in html, name
    rec = view.trace.recording
    for adaptive in (False, True):
        text_html, numbers, _ = labview.explorer_views(rec, 2, adaptive, 3, [1] * len(rec.output))
        assert "<img" not in text_html + numbers


def test_verdict_escapes_dtype_and_device():
    c = Comparison(False, 3, [(1, 2.0), (2, 1.0)], [(2, 2.0), (1, 1.0)], XSS, XSS, 0.1, numerics=XSS)

    class Tok:
        def decode(self, ids):
            return XSS

    html = verdict_html(c, Tok(), greedy=True)
    assert "<img" not in html and html.count("&lt;img") == 8  # dtype twice, device, 4 tokens, numerics
    c = Comparison(False, 3, [(1, 2.0), (2, 1.0)], [(2, 2.0), (1, 1.0)], XSS, XSS, 0.1)
    html = verdict_html(c, Tok(), greedy=True)  # no numerics: "target in <dtype> on <device>"
    assert "<img" not in html and html.count("&lt;img") == 9
    # an opened trace's device and numerics cannot reorder the app's words after them
    c = Comparison(False, 3, [(1, 2.0), (2, 1.0)], [(2, 2.0), (1, 1.0)], "torch.float32", "\u202ecpu", 0.1,
                   numerics="\u2067x\u202e y")
    html = verdict_html(c, Tok(), greedy=True)
    assert not {"\u202e", "\u2067"} & set(html) and "U+202E" in html and "U+2067" in html


def test_token_html_escapes_text_and_attributes():
    span = Span('"><img src=x onerror=alert(1)>', "accepted", 1, 1, 1, 0.5, 0.5)
    html = to_html([span])
    assert "<img" not in html and re.search(r'title="[^"<>]*"', html)


def opened_within(seconds: float, d: dict):
    """A trace of d, filling 80-100% of the size cap, loaded and shown, each in under `seconds`
    of this process's CPU time: (the trace, its view)."""
    text = json.dumps(d, separators=(",", ":"))
    assert 0.8 * trace.MAX_TRACE_BYTES < len(text) <= trace.MAX_TRACE_BYTES
    start = time.process_time()
    t = trace.loads(text)
    loaded = time.process_time()
    view = replay_view(t)
    assert loaded - start < seconds and time.process_time() - loaded < seconds
    return t, view


def test_the_largest_trace_opens_in_bounded_time():
    """4096 rounds (the most) filling the size cap, views and k explorer included. A hang guard,
    not a benchmark: about 2 s here (docs/trace-format.md). CPU time, so the other worker's load
    does not count."""
    t, view = opened_within(10, synthetic(rounds=tracecheck.MAX_ROUNDS, k=3, kept=lambda i: 0, prompt=500,
                                          baseline=False))
    start = time.process_time()
    labview.explorer_views(t.recording, 3, False, 3, [len(e.new_tokens) for e in t.events])
    assert time.process_time() - start < 10
    assert len(t.events) == tracecheck.MAX_ROUNDS and view.text_html


@pytest.mark.parametrize("rounds, kept, note", [
    (554, 0, r"17728 refused drafts not shown, to keep this view within 512 KiB"),  # 554 x 32 refused
    (124, 32, r"&#8230; \d+ more output tokens not shown: this view shows at most 512 KiB"),  # all kept
])
def test_an_opened_trace_shows_a_bounded_amount_of_html(rounds, kept, note):
    """Gradio keeps each view's last value in the page's state: 554 rounds of 32 refused drafts,
    each 100 quotes (six characters escaped), made 12.6 MiB of token HTML and 4.5 MiB of
    timeline a page, and one client opened it under made-up sessions (12 opens held 205 MiB)."""
    from specviz.render import HTML_BUDGET

    d = synthetic(rounds=rounds, k=32, kept=lambda i: kept, prompt=5, baseline=False, text="'" * 100)
    d["settings"]["k"], d["recording"] = 16, None
    text = json.dumps(d, separators=(",", ":"))
    assert len(text) <= trace.MAX_TRACE_BYTES
    view = replay_view(trace.loads(text))
    assert len(view.text_html) < HTML_BUDGET + 1000 and re.search(note, view.text_html)
    assert HTML_BUDGET / 2 < len(view.timeline_html) < HTML_BUDGET + 1000
    assert re.search(r"&#8230; \d+ earlier rounds not shown: the timeline shows the newest 200",
                     view.timeline_html)


def test_the_largest_tree_trace_opens_in_bounded_time():
    """64-node rounds (the most) filling the size cap, views included: the cap, not the round
    count, bounds a tree trace. A hang guard, not a benchmark (docs/trace-format.md); CPU time."""
    t, view = opened_within(10, tree_synthetic(rounds=670, extra=58, kept=lambda i: 0))
    assert t.stats.nodes_verified == 670 * 64 and view.text_html


def test_the_shelf_charges_a_trace_about_the_memory_its_parse_holds():
    """The shelf charged an opened trace its JSON size, while one of tiny top-2 rows holds 9.8x
    that (36 MiB from 3.7 MiB): 64 MiB of budget held 640. held_bytes estimates the parse's
    memory from the JSON itself; tracemalloc measures what loads() keeps."""
    import tracemalloc

    from specviz.untrusted import held_bytes

    def measured(data: bytes) -> int:
        gc.collect()
        tracemalloc.start()
        kept = trace.loads(data)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert kept.events
        return held

    rows = synthetic(rounds=40, k=32)
    for e in rows["events"]:
        e["target_top2"] = [[[0, 0], [1, 0]]] * (e["k"] + 1)
    for d in (synthetic(rounds=64, k=4), rows):
        data = json.dumps(d, separators=(",", ":")).encode()
        ratio = held_bytes(data) / measured(data)
        assert 0.7 < ratio < 2.0, ratio  # measured 0.87-1.0 for these, 1.9 for a long prompt
    compact = json.dumps(rows, separators=(",", ":")).encode()
    assert measured(compact) > 3 * len(compact)  # what the JSON size missed (3.9x)


def test_a_tree_traces_chain_comparison_opens_checked_and_shows():
    """A tree run's trace may carry the chain drafter's run at the same k ("chain"): it is
    checked like the runs, is refused on a chain run's trace or holding tree rounds, and shows
    as the chain column and the tree-vs-chain figure: tokens per target pass 10/4 beside 9/3."""
    d = tree_synthetic(rounds=4)  # kept 1, 2, 3, 0: 10 tokens in 4 passes
    d["chain"] = [dict(e, round=i + 1) for i, e in enumerate(synthetic(rounds=3, k=3)["events"][:3])]
    d["chain"][-1]["stop"] = "length"  # kept 1, 2, 3: 9 tokens in 3 passes
    t = trace.loads(json.dumps(d))
    assert [e.accepted for e in t.chain] == [1, 2, 3] and not any(e.tree for e in t.chain)
    view = replay_view(t)
    assert view.chain is not None and view.chain.tokens_per_pass == pytest.approx(9 / 3)
    assert list(view.figures["tree_chain"].data[0].y) == pytest.approx([10 / 4, 9 / 3])
    assert f"<td>{10 / 4:.2f}</td><td></td><td>{9 / 3:.2f}</td>" in view.stats_html  # no baseline
    chain_run = synthetic()
    chain_run["chain"] = d["chain"]
    refused(chain_run, "chain is for a tree run's comparison only")
    treed = json.loads(json.dumps(d))
    treed["chain"][0] = d["events"][0]  # a valid tree round, in the chain
    refused(treed, "chain must be a chain run: its rounds have no tree")
    bad = json.loads(json.dumps(d))
    bad["chain"][1]["k"] = 10**12
    refused(bad, "chain[1].k must be an integer in 0..32")
    wide = json.loads(json.dumps(d))
    wide["chain"][0]["new_tokens"][-1] = wide["chain"][0]["token"] = 299
    wide["chain"][0]["draft_tokens"][0] = wide["chain"][0]["new_tokens"][0] = 280
    # The app checks an opened trace's ids against the loaded pair: the chain's ids count too.
    refused_by_model = trace.loads(json.dumps(wide))
    with pytest.raises(trace.TraceError, match="token id 299, outside the model's vocabulary of 290"):
        trace.check_model(refused_by_model, 290)


def test_a_tree_traces_node_texts_are_checked_and_name_the_nodes_opened():
    """"node_text" names the tree-node tokens no span shows: keys are node tokens of the events,
    values short strings; anything else is refused, and an opened trace shows the text, not ⟨id⟩."""
    from specviz.service import tree_round

    d = tree_synthetic(rounds=4)
    t = trace.loads(json.dumps(d))
    hidden = sorted({n.token for e in t.events for n in e.tree} - {s.token for s in t.spans})
    assert hidden and f"⟨{hidden[0]}⟩" in "".join(tree_round(t, r)[0] for r in range(1, 5))
    d["node_text"] = {str(i): f"<b>n{i}</b>" for i in hidden}
    t = trace.loads(json.dumps(d))
    shown = "".join(tree_round(t, r)[0] for r in range(1, 5))
    assert "⟨" not in shown and f"&lt;b&gt;n{hidden[0]}&lt;/b&gt;" in shown and "<b>n" not in shown
    refused(dict(d, node_text=["x"]), "node_text must be an object keyed by the ids of the events' tree")
    refused(dict(d, node_text={"999999": "x"}), "node_text must be an object keyed by the ids")
    refused(dict(d, node_text={str(hidden[0]): "x" * 1001}), "node_text must hold strings of at most 1000")
    refused(dict(d, node_text={str(hidden[0]): 7}), "node_text must hold strings")
    refused(dict(synthetic(), node_text={"5": "x"}), "node_text must be an object keyed by the ids")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_trace_in_another_json_encoding_is_refused_before_its_parse(encoding):
    """json.loads reads UTF-16/32 bytes, where the depth and memory scans, which look for quote
    bytes, misread them: a 4 MiB UTF-16 trace holding 19.7 MiB was charged 4 MiB on the shelf."""
    text = json.dumps(synthetic(), ensure_ascii=False)
    refused(text.encode(encoding), "not UTF-8 JSON")
    assert trace.loads(text.encode("utf-8")).events and trace.loads(b"\xef\xbb\xbf" + text.encode())


def test_a_trace_whose_runs_or_spans_contradict_their_events_is_refused():
    """Found by a review: each of these opened and showed false figures beside true ones."""
    # a "target alone" that drafted: 15 tokens in 4 passes beside "1.00 per pass" in the table
    d = synthetic(rounds=3, k=3)
    d["baseline"] = [dict(e, round=i + 1, target_passes=i + 1, elapsed=0.035 * (i + 1))
                     for i, e in enumerate(d["events"])]
    refused(d, "baseline[0] must be a round of the target alone")
    # a tree run's chain at another k than the figure's label says, or by another drafter
    for k, change in ((4, {}), (3, {"source": "ngram"})):
        d = tree_synthetic(rounds=4)  # at k = 3
        d["chain"] = [dict(synthetic(rounds=1, k=k)["events"][0], **change)]
        refused(d, "chain[0] must be a round of the chain drafter at the run's k")
    # a clock that runs backwards zig-zagged the time plot
    d = synthetic(rounds=3, k=3)
    d["events"][1]["elapsed"] = 0.01
    refused(d, "events[1].elapsed must be at least the round before's (0.035 s)")
    # the token view said every draft was kept while the stats said half were refused
    d = synthetic(rounds=4, k=3)
    at = next(i for i, s in enumerate(d["spans"]) if s["fate"] == "rejected")
    d["spans"][at]["fate"] = "accepted"
    refused(d, f"spans[{at}] must be what its round's event shows there: fate 'rejected'")
    for name, value in (("token", 299), ("round", 2), ("position", 3)):
        d = synthetic(rounds=4, k=3)
        d["spans"][0][name] = value  # round 1's first kept draft
        refused(d, "spans[0] must be what its round's event shows there")
    d = synthetic(rounds=4, k=3)
    d["spans"].pop()
    refused(d, f"spans must be the {len(d['spans']) + 1} tokens the events show")
    for change in ({"source": "draft"}, {"draft_passes": 1}):
        d = synthetic(rounds=3, k=3)
        d["baseline"][0].update(change)
        if "draft_passes" in change:
            for e in d["baseline"]:
                e["draft_passes"] = 1  # cumulative: never decreasing
        refused(d, "baseline[0] must be a round of the target alone")


def test_an_opened_traces_spans_take_their_numbers_from_the_events_and_keep_their_texts():
    d = synthetic(rounds=4, k=3)
    for s in d["spans"]:
        s["p"], s["q"], s["text"] = 0.123, 0.5, f"<{s['token']}>"
    t = trace.loads(json.dumps(d))
    assert all(s.text == f"<{s.token}>" for s in t.spans)
    first = t.events[0]  # kept n of k one-hot drafts: p = 1 for the kept, 0 for the first refused
    shown = [s for s in t.spans if s.round == 1 and s.position]
    assert [s.p for s in shown] == [1.0] * first.accepted + [0.0] * (first.k > first.accepted) \
        + [None] * max(0, first.k - first.accepted - 1)
    assert all(s.q == 1.0 for s in shown)


def test_a_trace_from_before_the_eos_cut_layout_still_opens():
    """Before 2026-12-02 a round whose output ended among its kept drafts (an EOS) also showed its
    refused drafts; such traces open, shown as the events give them."""
    d = synthetic(rounds=3, k=3, baseline=False)
    last = d["events"][-1]
    x, y, z = last["draft_tokens"]
    last.update(accepted=2, kind="recovered", new_tokens=[x], stop="eos",
                target_probs=[1.0, 1.0, 0.0], target_cache_length=last["target_cache_length"] - 3)
    d["settings"]["max_new_tokens"] = sum(len(e["new_tokens"]) for e in d["events"])
    d["recording"] = None
    d["spans"] = [s for s in d["spans"] if s["round"] < 3] + [
        _span("x", "accepted", x, 3, 1), _span("z", "rejected", z, 3, 3)]  # the old layout
    t = trace.loads(json.dumps(d))
    assert [(s.fate, s.token) for s in t.spans if s.round == 3] == [("accepted", x)]
    d["spans"][-1]["round"] = 2  # a refused draft elsewhere is still held to its event
    refused(d, "spans")
