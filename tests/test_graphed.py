"""fastpath.GraphedStep and the graphed path: fixed-shape steps captured once and replayed.

On this CPU conftest.RerunGraphs stands in for the CUDA graphs (a replay reruns the recorded call
into the output buffer made at capture), so these tests check everything around a graph: one
capture per shape, the inputs copied into the graph's own buffers, the warm-up before a capture
rolled back, outputs copied out before the next replay, the fallback when a capture fails, and
the engine's exactness through it all. That a real graph reads the cache where it stands now
(no position baked in) is checked on a GPU (graphprobe, gpucheck's identity: docs/benchmarks.md).
"""

import dataclasses
import logging

import pytest
import torch
from conftest import fails_once, hf_greedy

import specviz
from specviz import fastpath, zerogpu
from specviz import lm as lm_module
from specviz.fastpath import GraphedStep, resolve_fast
from specviz.lm import CachedLM

PROMPT = "def fibonacci(n):\n    if n < 2:"


def tokens(events):
    return [t for e in events for t in e.new_tokens]


def graphed_and_eager(pair):
    """The pair's target on the graphed path and eager: static caches of 64 positions each."""
    return (CachedLM(pair.target, pair.vocab_size, cache="static", steps="graphs", max_len=64),
            CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64))


def test_a_graphed_step_captures_each_shape_once_and_gives_the_eager_rows(graphed_pair):
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    graphed, eager = graphed_and_eager(pair)
    graphed.compiled_widths = {1, 3}
    assert isinstance(graphed._step, GraphedStep)
    for m in (graphed, eager):
        m.forward(ids)
    rows = []
    for tail in ([5], [5, 9, 2], [7], [4, 4, 8], [3, 1, 6]):  # widths 1 and 3, at moving positions
        got, want = graphed.forward(ids + tail, last=len(tail)), eager.forward(ids + tail, last=len(tail))
        assert torch.allclose(got, want, atol=1e-5)
        assert graphed.cache_length == eager.cache_length == len(ids) + len(tail)
        rows.append(got)
        graphed.rollback(ids + [0])
        eager.rollback(ids + [0])
    assert len(graphed._step.graphs) == 2  # one capture a width, replayed at every position after
    assert graphed.compiled_passes == 5
    # each pass's rows are its own: the graph's output buffer was copied out before the next replay
    assert not torch.equal(rows[0], rows[2]) and rows[0].data_ptr() != rows[2].data_ptr()


def test_a_drafters_one_and_two_token_steps_run_through_the_captured_step(graphed_pair):
    """A drafter feeds its pick from the device one token at a time, and reads 1 or 2 tokens a
    round before drafting: each of those through a captured graph, with the eager rows."""
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    graphed = lm_module.draft_lm(pair.draft, pair.vocab_size, cache="static", steps="graphs", max_len=64)
    eager = lm_module.draft_lm(pair.draft, pair.vocab_size, cache="static", max_len=64)
    for m in (graphed, eager):
        m.forward(ids)  # the prompt's width: eager
    assert graphed.compiled_passes == 0
    got, want = graphed.forward_next(torch.tensor([5])), eager.forward_next(torch.tensor([5]))
    assert torch.allclose(got, want, atol=1e-5) and graphed.compiled_passes == 1
    for m in (graphed, eager):
        m.settle([5])
    got, want = graphed.forward(ids + [5, 9, 2]), eager.forward(ids + [5, 9, 2])  # two tokens to feed
    assert torch.allclose(got, want, atol=1e-5) and graphed.compiled_passes == 2


def test_a_graphed_width_asked_for_fewer_rows_captures_its_own_graph(graphed_pair):
    """A pass of the same width that wants fewer rows (a round 1 feeding two uncached tokens and a
    budget-cut draft) is another graph: replaying the one captured for 4 rows gave other logits
    (a mutation that dropped `last` from the shape key survived every other test)."""
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    graphed, eager = graphed_and_eager(pair)
    rows = []
    for m in (graphed, eager):
        m.compiled_widths = {1, 4}
        m.forward(ids)
        m.forward(ids + [7, 3, 5], last=4)  # 4 fed, 4 rows: captured
        m.rollback(ids[:-1])  # the cache holds ids[:-2]
        rows.append(m.forward(ids + [7, 3], last=3))  # 4 fed again, 3 rows wanted
    assert rows[0].shape == rows[1].shape and torch.allclose(rows[0], rows[1], atol=1e-5)
    assert len(graphed._step.graphs) == 2 and graphed.compiled_passes == 2


def test_the_warm_up_before_a_capture_leaves_the_cache_as_a_plain_pass_would(graphed_pair):
    """The two warm-up calls before a capture write a pass each and roll it back: the cache then
    holds exactly what a plain pass leaves (its length, and its keys where both wrote)."""
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    graphed, eager = graphed_and_eager(pair)
    for m in (graphed, eager):
        m.forward(ids)
        m.forward(ids + [5])
    assert graphed.compiled_passes == 1 and graphed.cache_length == eager.cache_length == len(ids) + 1
    for a, b in zip(graphed.cache.layers, eager.cache.layers, strict=True):
        assert torch.allclose(a.keys[:, :, : len(ids) + 1], b.keys[:, :, : len(ids) + 1], atol=1e-6)
        assert int(a.get_seq_length()) == len(ids) + 1


@pytest.mark.parametrize(("proposer", "k"), [("draft", 3), ("ngram", 3), ("tree", 3)])
def test_the_graphed_path_keeps_the_targets_greedy_output(graphed_pair, proposer, k):
    pair = graphed_pair
    pair.target.generation_config.eos_token_id = None
    try:
        events = list(specviz.generate(pair, PROMPT, proposer=proposer, k=k, max_new_tokens=14))
        assert tokens(events) == hf_greedy(pair, PROMPT, 14)
        slots = [s for held in fastpath._SLOTS.values() for s in held]
        assert slots and all(isinstance(s.step, GraphedStep) and s.step.graphs for s in slots)
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id


def test_the_graphed_path_samples_what_the_static_path_samples_seed_for_seed(graphed_pair, static_pair):
    """At temperature > 0 the graphed steps give the static path's logits, so the same seeds draw
    the same tokens: the distribution tests of the static path hold for it."""
    for seed in range(3):
        kwargs = dict(proposer="draft", k=3, max_new_tokens=12, temperature=1.0, top_k=20, seed=seed)
        graphed = tokens(specviz.generate(graphed_pair, PROMPT, **kwargs))
        assert graphed == tokens(specviz.generate(static_pair, PROMPT, **kwargs)), seed
    slots = [s for held in fastpath._SLOTS.values() for s in held]  # the target's, the draft's
    assert len(slots) == 2 and all(s.step.graphs for s in slots)


@pytest.mark.parametrize("proposer", ["draft", "tree"])
def test_the_graphed_path_in_bfloat16_with_the_refined_head_gives_the_static_paths_tokens(
        model_dirs, cpu_graphs, proposer):
    """In bfloat16 the target's step returns hidden states and its head is refined in float32
    outside the graph (lm.refine_top): the graphed steps keep the static path's tokens."""
    from dataclasses import replace

    bf16 = specviz.load_pair(str(model_dirs["target"]), str(model_dirs["draft"]), device="cpu",
                             dtype="bfloat16")
    graphed, static = replace(bf16, fast="graphed"), replace(bf16, fast="static")
    kwargs = dict(proposer=proposer, k=3, max_new_tokens=12)
    want = tokens(specviz.generate(static, PROMPT, **kwargs))
    assert tokens(specviz.generate(graphed, PROMPT, **kwargs)) == want
    [target] = fastpath._SLOTS[bf16.target]
    assert target.step.graphs and lm_module.CachedLM(bf16.target, bf16.vocab_size).refine


def test_a_capture_that_fails_falls_back_to_eager_with_one_log_line(graphed_pair, monkeypatch, caplog):
    pair = graphed_pair
    ids = pair.encode(PROMPT)

    def refuse(self, run, like):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(GraphedStep, "record", refuse)
    lm, eager = graphed_and_eager(pair)
    for m in (lm, eager):
        m.forward(ids)
    with caplog.at_level(logging.WARNING, logger="specviz.lm"):
        rows = lm.forward(ids + [5])
        again = lm.forward(ids + [5, 6])
    assert torch.allclose(rows, eager.forward(ids + [5]), atol=1e-5)
    assert torch.allclose(again, eager.forward(ids + [5, 6]), atol=1e-5)
    assert lm._step is None and lm.compiled_passes == 0 and lm.cache_length == len(ids) + 2
    failures = [r for r in caplog.records if "running eager from now on" in r.getMessage()]
    assert len(failures) == 1 and "stream is capturing" in failures[0].getMessage()
    # the model's next run leases the same slot, and goes eager without trying (and logging) again
    del lm
    with caplog.at_level(logging.WARNING, logger="specviz.lm"):
        later = CachedLM(pair.target, pair.vocab_size, cache="static", steps="graphs", max_len=64)
        later.forward(ids)
        assert torch.allclose(later.forward(ids + [5]), rows, atol=1e-5)
    assert later._step is None and later.compiled_passes == 0
    assert len([r for r in caplog.records if "running eager from now on" in r.getMessage()]) == 1


@pytest.mark.parametrize("proposer", ["draft", "none", "tree"])
def test_a_rounds_captures_are_left_out_of_its_times_and_its_tokens_stay_the_targets(graphed_pair, cpu_graphs,
                                                                                  monkeypatch, proposer):
    """On ZeroGPU every call captures its steps anew (0.4-0.5 s a shape on the H200, against a 5 ms
    pass), mid-run: counted in the run's times they made a speculative run of 64 tokens, which pays
    three captures to the target alone's one, look half as fast as the target alone. A capture is
    a one-off, like a caller's pause: the rounds' times leave it out; the replay giving the pass's
    rows stays in."""
    import time

    def slow_record(self, run, like):
        time.sleep(1.0)
        return cpu_graphs.record(self, run, like)

    monkeypatch.setattr(GraphedStep, "record", slow_record)
    eager = dataclasses.replace(graphed_pair, fast="eager")
    expected = tokens(specviz.generate(eager, PROMPT, proposer=proposer, k=3, max_new_tokens=12))
    target = specviz.engine.target_lm(graphed_pair, 64)
    drafter = specviz.engine.make_proposer(graphed_pair, proposer, max_len=64)
    started = time.perf_counter()
    events = list(specviz.generate(graphed_pair, PROMPT, proposer=drafter, k=3, max_new_tokens=12,
                                   target=target))
    waited = time.perf_counter() - started
    assert tokens(events) == expected
    captured = target.capture_seconds + getattr(getattr(drafter, "lm", None), "capture_seconds", 0.0)
    assert captured >= 1.0  # the run captured its steps as it went
    assert all(max(e.round_seconds, e.draft_seconds, e.target_seconds) < 1.0 for e in events)
    assert waited - events[-1].elapsed >= 0.99 * captured


def test_the_graphed_path_never_marks_inductors_graph_tree_steps(graphed_pair, monkeypatch):
    """torch.compiler.cudagraph_mark_step_begin is for inductor's graph trees ("reduce-overhead").
    Its first call imports inductor: 3 s on this CPU, in the first round of a ZeroGPU worker's first
    run (a fork of a process that never compiled). GraphedStep's own graphs need no mark."""
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1), raising=False)
    target = specviz.engine.target_lm(graphed_pair, 64)
    events = list(specviz.generate(graphed_pair, PROMPT, proposer="draft", k=3, max_new_tokens=8,
                                   target=target))
    assert sum(len(e.new_tokens) for e in events) == 8 and target.compiled_passes > 0 and marks == []


def test_a_failed_capture_raises_its_own_error_not_the_timers(monkeypatch):
    """The capture timer syncs the device when a capture ends; after a failed one on CUDA that sync
    can raise an error of its own, which replaced the capture's (an out-of-memory capture is served
    eager with its graphs kept only if its own error is the one CachedLM sees)."""
    calls = []

    def synced(device):
        calls.append(device)
        if len(calls) > 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return 0.0

    def capture(self, *args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(GraphedStep, "_synced", staticmethod(synced))
    monkeypatch.setattr(GraphedStep, "_capture", capture)
    step = GraphedStep()
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        step(None, None, torch.zeros(1, 1, dtype=torch.long), 1, False)
    assert len(calls) == 2 and step.capture_seconds > 0 and step.graphs == {}


def test_steps_are_checked_and_graphs_need_a_device_that_captures_them(pair, monkeypatch):
    with pytest.raises(ValueError, match="steps must be None, 'compiled' or 'graphs', got 'graph'"):
        CachedLM(pair.target, pair.vocab_size, cache="static", steps="graph", max_len=64)
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())
    plain = CachedLM(pair.target, pair.vocab_size, cache="static", steps="graphs", max_len=64)
    assert plain._step is None and not fastpath._SLOTS  # this CPU captures nothing: eager static


def test_the_fast_paths_resolve_to_their_caches_and_steps(pair, cpu_graphs, monkeypatch):
    model = pair.target
    assert resolve_fast("graphed", model) == ("static", "graphs")  # cpu_graphs: CPU captures here
    assert resolve_fast("compiled", model) == ("static", "compiled")
    assert resolve_fast("static", model) == ("static", None)
    assert resolve_fast("eager", model) == resolve_fast("auto", model) == ("dynamic", None)
    monkeypatch.setattr(fastpath, "GRAPH_DEVICES", {"cuda"})
    assert resolve_fast("graphed", model) == ("static", None)  # no graphs on this device: static
    with pytest.raises(ValueError, match="fast path must be one of .*graphed"):
        resolve_fast("fastest", model)


@pytest.mark.parametrize("capture", ["direct", "trees", "graphs"])
def test_the_compiled_paths_capture_follows_fastpath_capture_on_graph_devices(capture, cpu_graphs,
                                                                              monkeypatch):
    monkeypatch.setattr(fastpath, "CAPTURE", capture)
    step = fastpath.fixed_step("cpu", "compiled")  # cpu_graphs: this CPU stands for a GPU
    if capture == "trees":
        assert not isinstance(step, GraphedStep)  # torch.compile's reduce-overhead graph trees
    else:  # the compiled step, or with "graphs" the plain one, captured by GraphedStep
        assert isinstance(step, GraphedStep) and (step.fn is fastpath.step) is (capture == "graphs")
    assert fastpath.fixed_step("cpu", "graphs").fn is fastpath.step  # the graphed path: no compiler
    monkeypatch.setattr(fastpath, "GRAPH_DEVICES", {"cuda"})
    assert not isinstance(fastpath.fixed_step("cpu", "compiled"), GraphedStep)  # no graphs: compiled


def test_on_zerogpu_each_gpu_call_starts_without_graphs_and_generators_stay_generators(monkeypatch):
    import spaces

    seen = []

    def fake_gpu(duration=None):
        def wrap(fn):
            seen.append(("generator" if __import__("inspect").isgeneratorfunction(fn) else "function",
                         duration))
            return fn
        return wrap

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(spaces, "GPU", fake_gpu)
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())

    class Model:
        pass

    held = Model()

    def job(n):
        assert not fastpath._SLOTS  # the earlier call's graphs are gone
        fastpath._SLOTS[held] = "a slot with graphs"
        yield from range(n)

    stream = zerogpu.gpu(30)(job)
    assert list(stream(2)) == [0, 1] and list(stream(3)) == [0, 1, 2]
    plain = zerogpu.gpu(12)(lambda: len(fastpath._SLOTS))
    assert plain() == 0
    assert seen == [("generator", 30), ("function", 12)]
    assert zerogpu.FAST == "graphed"


def test_a_warm_up_that_fails_part_way_leaves_the_cache_holding_its_committed_tokens(graphed_pair):
    """A warm-up call before a capture that fails after writing some layers (layer 0, not 1) is
    undone like any failed step: every layer cut back to the committed tokens, the pass eager."""
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", steps="graphs", max_len=64)
    lm.forward(ids)
    with fails_once(pair.target.model.layers[1], "warm-up failed") as failed:
        rows = lm.forward(ids + [5])
    assert failed and lm._step is None and lm.compiled_passes == 0
    assert {int(layer.get_seq_length()) for layer in lm.cache.layers} == {len(ids) + 1}
    fresh = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    fresh.forward(ids)
    assert torch.allclose(rows, fresh.forward(ids + [5]), atol=1e-5)


def test_a_tree_step_that_fails_part_way_keeps_the_nodes_cached_before_it(graphed_pair):
    """A drafter grows its tree a level a pass: a captured step failing on the second level is cut
    back to the committed tokens and the first level's nodes (not to the tokens alone), and the
    eager retry reads those nodes as a plain eager tree pass does."""
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    fast, eager = graphed_and_eager(pair)
    for m in (fast, eager):
        m.forward(ids)
    first = fast.forward_tree(ids, [5, 6], [-1, -1])
    assert fast.compiled_passes == 1
    assert torch.allclose(first, eager.forward_tree(ids, [5, 6], [-1, -1]), atol=1e-5)
    cached = len(ids) + len(fast.slots)  # the level's nodes and its pads
    with fails_once(pair.target.model.layers[1]) as failed:
        second = fast.forward_tree(ids, [7, 8], [0, 1])
    assert failed and fast._step is None
    assert torch.allclose(second, eager.forward_tree(ids, [7, 8], [0, 1]), atol=1e-5)
    assert {int(layer.get_seq_length()) for layer in fast.cache.layers} == {cached + 2}


def test_running_out_of_memory_in_a_captured_step_serves_the_pass_eager_and_keeps_the_graphs(graphed_pair):
    """Any failed step went eager for good: on a dedicated GPU, where a slot outlives its run, one
    capture short of memory left every later run 3-5x slower. Now that pass runs eager, the model's
    graphs stay on, and the shape is captured on its next use (an OOM raised while handling another
    error counts too)."""
    pair = graphed_pair
    ids = pair.encode(PROMPT)
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", steps="graphs", max_len=64)
    lm.forward(ids)
    lm.forward(ids + [5])  # captured
    before = lm.compiled_passes
    with fails_once(pair.target.model.layers[1], "CUDA out of memory", torch.OutOfMemoryError) as failed:
        rows = lm.forward(ids + [5, 6])
    assert failed and lm._step is not None and lm._slot.step is not None and lm.compiled_passes == before
    from specviz.gpumeasure import compiled_throughout  # gpucheck: this pass's time is not the step's

    assert lm.memory_fallbacks == 1 and not compiled_throughout(lm)
    assert {int(layer.get_seq_length()) for layer in lm.cache.layers} == {len(ids) + 2}
    fresh = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    fresh.forward(ids + [5])
    assert torch.allclose(rows, fresh.forward(ids + [5, 6]), atol=1e-5)
    lm.rollback(ids + [5, 0])
    assert torch.allclose(lm.forward(ids + [5, 6]), rows, atol=1e-5) and lm.compiled_passes == before + 1
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError:
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904
    except RuntimeError as e:
        assert lm_module.out_of_memory(e) and not lm_module.out_of_memory(RuntimeError("other"))


def test_a_static_crop_moves_every_layers_length_in_one_call(pair, monkeypatch):
    """On a GPU a loop over the layers launched a kernel a layer for each rollback."""
    ids = pair.encode(PROMPT)
    static = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    static.forward(ids + [5, 6, 7])
    calls = []
    foreach = torch._foreach_sub_
    monkeypatch.setattr(torch, "_foreach_sub_", lambda tensors, n: calls.append(n) or foreach(tensors, n))
    static.rollback(ids + [0])
    assert calls == [3] and static.cache_length == len(ids)
    assert [int(layer.get_seq_length()) for layer in static.cache.layers] == [len(ids)] * 2
    again = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    assert torch.allclose(static.forward(ids + [9]), again.forward(ids + [9]), atol=1e-5)


def test_a_model_drafting_for_itself_holds_two_slots_and_gets_both_back(pair, cpu_graphs):
    """The target drafting for itself (enginecheck's "self") leases two slots of one model at
    once; the next run gets the same two back, with their captured graphs, instead of new ones."""
    import copy

    model = copy.deepcopy(pair.target)
    first = [CachedLM(model, pair.vocab_size, cache="static", steps="graphs", max_len=64) for _ in range(2)]
    held = list(fastpath._SLOTS[model])
    assert len(held) == 2 and first[0]._slot is not first[1]._slot
    del first
    again = [CachedLM(model, pair.vocab_size, cache="static", steps="graphs", max_len=64) for _ in range(2)]
    assert {id(m._slot) for m in again} == {id(s) for s in held} and fastpath._SLOTS[model] == held
    del again
    wider = CachedLM(model, pair.vocab_size, cache="static", steps="graphs", max_len=2048)
    assert fastpath._SLOTS[model] == [wider._slot]  # too small: the free slots gave way


def compiling(made: list, refused: list | None = None):
    """A dynamo backend (aot_eager) of a test's own, so that no earlier test's graphs are reused:
    each graph it compiles goes into `made`; with `refused`, a graph dynamic in a size is refused
    instead (and goes there), as a compiler without dynamic shapes would."""

    def backend(gm, inputs):
        if refused is not None and any(isinstance(i, torch.SymInt) for i in inputs):
            refused.append(gm)
            raise RuntimeError("no dynamic shapes here")
        made.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    return backend


def compiled_and_eager(pair, monkeypatch, backend, shared: bool, max_len: int, widths: set[int]):
    """(model, compiled CachedLM, eager static CachedLM, prompt ids) on a fresh copy of the tiny
    target, both holding all of the prompt but its last token."""
    import copy

    monkeypatch.setattr(fastpath, "COMPILE", {"backend": backend, "dynamic": False})
    monkeypatch.setattr(fastpath, "SHARED", shared)
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())
    model = copy.deepcopy(pair.target)
    fast = CachedLM(model, pair.vocab_size, cache="static", steps="compiled", max_len=max_len)
    fast.compiled_widths = set(widths)
    eager = CachedLM(model, pair.vocab_size, cache="static", max_len=max_len)
    ids = pair.encode(PROMPT)
    for m in (fast, eager):
        m.forward(ids[:-1])
    return model, fast, eager, ids


@pytest.mark.parametrize("shared", [True, False])
def test_a_compiled_steps_wide_passes_share_one_graph_and_give_the_eager_rows(pair, monkeypatch, shared):
    """Chain passes of 2, 3, 5 and 9 tokens, some wanting fewer rows than they feed, and tree
    passes of 2, 4 and 8 nodes: with fastpath.SHARED dynamo compiles one graph for every chain width
    and one for every tree width (on the H200 a compile took 18-32 s, a new width's capture
    0.1-0.5 s), without it one a width; each row is the eager static pass's either way."""
    made = []  # graphs dynamo compiled in this test
    _, fast, eager, ids = compiled_and_eager(pair, monkeypatch, compiling(made), shared, 128, {1, 2, 3, 5, 9})
    drafts = [7, 3, 5, 11, 13, 2, 9, 4]
    for n, last in ((1, 2), (2, 1), (4, 5), (8, 3)):  # widths 2, 3, 5, 9
        rows = fast.forward(ids + drafts[:n], last=last)
        assert torch.allclose(rows, eager.forward(ids + drafts[:n], last=last), atol=1e-5), n
        assert rows.shape[0] == last
        for m in (fast, eager):
            m.rollback(ids)
    assert fast.compiled_passes == 4
    chain = len(made)
    tree_passes_agree(fast, eager, ids, drafts)
    assert fast.compiled_passes == 7
    assert (chain, len(made) - chain) == ((1, 1) if shared else (4, 3))


def tree_passes_agree(fast, eager, ids: list[int], drafts: list[int]) -> None:
    """Tree passes of 2, 3 and 5 chained nodes after ids (padded to 2, 4 and 8 nodes, after the one
    uncached token): each of fast's rows is eager's, and both caches are back at ids after each."""
    for n in (2, 3, 5):
        tokens, parents = drafts[:n], [-1] + list(range(n - 1))
        rows = fast.forward_tree(ids, tokens, parents)
        assert torch.allclose(rows, eager.forward_tree(ids, tokens, parents), atol=1e-5), n
        for m in (fast, eager):
            m.rollback(ids)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_shared_graph_the_compiler_refuses_gives_way_to_a_graph_a_width_not_to_eager(pair, monkeypatch,
                                                                                     caplog, request, graphs):
    """A compiler that refuses the width-dynamic graph (as some torch or transformers release
    might): that pass goes again through a graph of its own width, with one log line naming the
    compiler's error, the cache as a plain pass leaves it; the step stays compiled, and the
    model's later wide passes, on any of its slots, compile their own widths without trying to
    share again. With and without (CPU stand-in) graphs: without, the retry's ids are fresh
    tensors, not the ones the refused call marked dynamic."""
    if graphs:
        request.getfixturevalue("cpu_graphs")
    made, refused = [], []  # the shared graph's dynamic width refused
    backend = compiling(made, refused)
    model, fast, eager, ids = compiled_and_eager(pair, monkeypatch, backend, True, 64, {1, 3, 5})
    with caplog.at_level(logging.WARNING, logger="specviz.lm"):
        for drafts in ([7, 3], [7, 3, 5, 11]):  # widths 3 and 5
            rows = fast.forward(ids + drafts, last=len(drafts) + 1)
            assert torch.allclose(rows, eager.forward(ids + drafts, last=len(drafts) + 1), atol=1e-5)
            assert fast.cache_length == len(ids) + len(drafts) and fast.tokens == ids + drafts
            for m in (fast, eager):
                m.rollback(ids)
        assert len(refused) == 1 and len(made) == 2  # the shared graph once, then widths 3 and 5
        # a second slot of the same model's (the target drafting for itself holds two) does not
        # try to share either
        other = CachedLM(model, pair.vocab_size, cache="static", steps="compiled", max_len=64)
        assert other._slot is not fast._slot
        other.compiled_widths = {1, 3}
        other.forward(ids[:-1])
        rows = other.forward(ids + [7, 3], last=3)
    assert torch.allclose(rows, eager.forward(ids + [7, 3], last=3), atol=1e-5)
    assert len(refused) == 1  # not tried again
    assert fast._step is not None and fast.compiled_passes == 2 and other.compiled_passes == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "a graph a width from now on" in messages[0]
    assert "no dynamic shapes here" in messages[0]


def test_a_wide_pass_that_fails_other_than_in_the_compiler_goes_eager_without_a_retry(pair, cpu_graphs,
                                                                                    monkeypatch, caplog):
    """Only the compiler refusing the shared graph earns a graph a width: a capture that fails
    (here the stand-in recorder) goes eager at once, one log line, as before sharing."""
    def refuse(self, run, like):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(GraphedStep, "record", refuse)
    made = []
    model, fast, eager, ids = compiled_and_eager(pair, monkeypatch, compiling(made), True, 64, {1, 3})
    with caplog.at_level(logging.WARNING, logger="specviz.lm"):
        rows = fast.forward(ids + [7, 3], last=3)
    assert torch.allclose(rows, eager.forward(ids + [7, 3], last=3), atol=1e-5)
    assert fast._step is None and fast.compiled_passes == 0 and model not in fastpath.UNSHARED
    assert len(made) == 1  # the shared graph compiled (its warm-up calls ran); its capture failed
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "running eager from now on" in messages[0]


def test_a_one_token_step_the_compiler_refuses_goes_eager_and_is_not_tried_again(pair, monkeypatch, caplog):
    """A one-token pass has its own static graph, never the shared one: the compiler refusing it
    is a failed step (eager from now on, one log line), not a refused shared graph (which would
    mark the model UNSHARED and try the same one-token graph again, and again)."""
    made = []

    def refuse_all(gm, inputs):
        made.append(gm)
        raise RuntimeError("no graphs here")

    model, fast, eager, ids = compiled_and_eager(pair, monkeypatch, refuse_all, True, 64, {1, 3})
    with caplog.at_level(logging.WARNING, logger="specviz.lm"):
        rows = fast.forward(ids)  # the prompt's last token: width 1
        assert torch.allclose(rows, eager.forward(ids), atol=1e-5)
        assert fast._step is None and fast.compiled_passes == 0 and model not in fastpath.UNSHARED
        nxt = fast.forward_next(torch.tensor([5]))  # the next pass: eager, no compile tried
    assert torch.allclose(nxt, eager.forward_next(torch.tensor([5])), atol=1e-5)
    assert len(made) == 1 and fast.compiled_passes == 0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "running eager from now on" in messages[0]
    assert "no graphs here" in messages[0]


def opt_model(vocab: int):
    """A tiny random OPT: its forward reads the cache's length on the host (`torch.ones(past + n)`)."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=vocab, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32)
    return OPTForCausalLM(config).eval()


@pytest.mark.parametrize("model", ["qwen2", "opt"])
def test_a_step_compiled_again_at_every_position_goes_eager_after_a_few_with_one_log_line(
        pair, model, monkeypatch, caplog):
    """OPT's one-token step breaks its graph at a host read of the cache's length, and so compiled
    anew at every position, until dynamo's recompile limit (64: about 17 s of compiling a tiny OPT
    on this CPU with `--fast compiled`, minutes of a real one's on CUDA). A shape that compiled
    AGAIN more times goes eager from then on, with one log line; every pass keeps the eager rows.
    The tiny Qwen2 compiles its one-token step once and runs every pass through it."""
    made = []
    monkeypatch.setattr(fastpath, "COMPILE", {"backend": compiling(made), "dynamic": False})
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())
    target = opt_model(pair.vocab_size) if model == "opt" else pair.target
    fast = CachedLM(target, pair.vocab_size, cache="static", steps="compiled", max_len=64)
    eager = CachedLM(target, pair.vocab_size, cache="static", max_len=64)
    ids = pair.encode(PROMPT)
    for m in (fast, eager):
        m.forward(ids[:-1])
    with caplog.at_level(logging.WARNING, logger="specviz.lm"):
        assert torch.allclose(fast.forward(ids), eager.forward(ids), atol=1e-5)
        graphs = []  # graphs made after each pass
        for token in range(5, 17):
            token = torch.tensor([token])
            assert torch.allclose(fast.forward_next(token), eager.forward_next(token), atol=1e-5)
            graphs.append(len(made))
    messages = [r.getMessage() for r in caplog.records]
    if model == "qwen2":
        assert fast.compiled_passes == 13 and fast._step is not None and not messages
        return
    assert fast.compiled_passes == lm_module.AGAIN + 2 and fast._step is None, fast.compiled_passes
    assert fast._slot.step is None  # the slot's later runs too
    assert len(messages) == 1 and "compiled 5 times for one shape" in messages[0], messages
    # each compiled pass made graphs (32 in these 13 passes before), the eager ones none
    assert graphs[lm_module.AGAIN] == graphs[-1] > graphs[lm_module.AGAIN - 1], graphs


class FakeStreams:
    """torch.cuda's stream calls, recorded: which stream is current, and each wait_stream."""

    def __init__(self, monkeypatch):
        import contextlib

        self.current, self.waits = "default", []
        fakes = self

        class Stream:
            def __init__(self):
                self.name = "side"

            def wait_stream(self, other):
                fakes.waits.append((getattr(self, "name", self), getattr(other, "name", other)))

        default = Stream()
        default.name = "default"

        @contextlib.contextmanager
        def stream(s):  # as torch.cuda.StreamContext: restored on the way out, an exception too
            before, self.current = self.current, s.name
            try:
                yield
            finally:
                self.current = before

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: default if self.current == "default"
                            else Stream())
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "set_stream", lambda s: setattr(self, "current", s.name))


def test_the_default_stream_waits_for_a_warm_up_that_raised(monkeypatch):
    """A warm-up that raised part-way left the default stream not waiting for the side stream its
    layers were queued on, so the eager fallback's crop could race the writes still queued."""
    fakes = FakeStreams(monkeypatch)
    with pytest.raises(RuntimeError, match="part-way"), GraphedStep().warm_stream():
        assert fakes.current == "side"
        raise RuntimeError("failed part-way")
    assert fakes.waits == [("side", "default"), ("default", "side")] and fakes.current == "default"


def test_a_capture_whose_end_raises_gives_back_the_stream_it_found(monkeypatch):
    """torch.cuda.graph ends the capture before it restores the stream: an end that raises (an
    invalidated capture) left the capture's stream current for every later pass of the thread."""
    import contextlib

    fakes = FakeStreams(monkeypatch)

    @contextlib.contextmanager
    def graph(g, pool=None):
        fakes.current = "capture"
        yield
        raise RuntimeError("operation failed due to a previous error during capture")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "graph", graph)
    with pytest.raises(RuntimeError, match="during capture"):
        GraphedStep().record(lambda: torch.zeros(1), torch.zeros(1))
    assert fakes.current == "default"


def test_a_failure_names_the_error_it_was_raised_while_handling():
    """An invalidated capture raises "operation failed due to a previous error during capture"
    while handling the step's own error: the log line named only the first."""
    try:
        try:
            raise ValueError("the step's own error\nmore lines")
        except ValueError:
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904
    except RuntimeError as e:
        assert lm_module.failure(e) == ("RuntimeError: operation failed due to a previous error during "
                                        "capture; while handling ValueError: the step's own error")
    try:
        try:
            raise ValueError("hidden")
        except ValueError:
            raise RuntimeError("its own") from None  # context suppressed: not followed
    except RuntimeError as e:
        assert lm_module.failure(e) == "RuntimeError: its own"


def test_padded_passes_never_reach_past_a_models_learned_positions(gpt2_pair, cpu_graphs):
    """A narrow pass was padded up to its captured width as far as the cache had room, past
    GPT-2's 256 learned positions near the end of a run that fits (prompt + new - 1 = 256): an
    IndexError on this CPU, a device-side assert on a GPU. Pads stop at the position table."""
    from dataclasses import replace

    pair = replace(gpt2_pair, fast="graphed")
    ids = pair.encode(PROMPT)
    new = 257 - len(ids)  # prompt + new - 1 = 256 positions: exactly the model's
    gpt2_pair.target.generation_config.eos_token_id = None
    try:
        want = hf_greedy(gpt2_pair, PROMPT, new)
        for proposer, k in (("draft", 32), ("ngram", 16)):
            got = [t for e in specviz.generate(pair, ids, proposer=proposer, k=k, max_new_tokens=new)
                   for t in e.new_tokens]
            assert got == want, proposer
    finally:
        gpt2_pair.target.generation_config.eos_token_id = gpt2_pair.tokenizer.eos_token_id


def test_warm_steps_warms_the_slots_a_run_then_leases_where_the_target_drafts_for_itself(pair, cpu_graphs,
                                                                                         monkeypatch):
    """warm_steps leased the target's slot, freed it, then gave it to the draft: a run (which
    leases the draft first and holds both) then made its target a new slot and captured its steps
    again, inside the run. Warmed in the run's order, a run captures nothing."""
    from dataclasses import replace

    import specviz
    from specviz import engine, fastpath

    same = replace(pair, draft=pair.target, fast="graphed")
    captured = []
    record = fastpath.GraphedStep.record
    monkeypatch.setattr(fastpath.GraphedStep, "record",
                        lambda self, run, like: captured.append(like.shape) or record(self, run, like))
    engine.warm_steps(same, 3)
    assert len(captured) == 4  # the target's 1 and 4, the draft's 1 and 2
    captured.clear()
    out = list(specviz.generate(same, "def f(x):", k=3, max_new_tokens=8))
    assert sum(len(e.new_tokens) for e in out) == 8 and captured == []


def test_a_tree_pass_at_the_caches_end_is_padded_only_where_the_pads_fit(pair, monkeypatch):
    """A compiled tree pass is padded to a power of two of nodes: 3 nodes with 3 slots of the
    static cache left were padded to 4 and wrote past its end. Unpadded there, the rows are the
    eager pass's; a tree that does not fit at all is refused by name."""
    _, fast, eager, _ = compiled_and_eager(pair, monkeypatch, "aot_eager", True, 1024, {1, 2})
    assert fast.max_len == eager.max_len == 1024  # the slot's least, and as asked
    ids = [(7 * i + 3) % pair.vocab_size for i in range(1021)]
    for m in (fast, eager):
        m.rollback([])
        m.forward(ids[:-1])
    tokens, parents = [5, 6, 7], [-1, -1, 0]
    rows = fast.forward_tree(ids, tokens, parents)  # positions 1021..1023: the last three
    assert torch.allclose(rows, eager.forward_tree(ids, tokens, parents), atol=1e-5)
    for m in (fast, eager):
        m.rollback(ids)
        with pytest.raises(ValueError, match="the static cache holds 1024 positions, not 1025"):
            m.forward_tree(ids, [5, 6, 7, 8], [-1, -1, 0, 0])


def test_a_drafters_next_tree_level_at_the_caches_end_counts_the_nodes_cached_before_it(pair, monkeypatch):
    """A drafter grows its tree a level a pass after all of ids: the room a level's pads need
    starts after the nodes already cached. 1019 ids and 2 nodes cached, 3 more fill the 1024
    positions: padded to 4 they indexed position 1024 (IndexError); unpadded, the rows are the
    eager pass's. A level that does not fit at all is refused by name, not by an IndexError."""
    _, fast, eager, _ = compiled_and_eager(pair, monkeypatch, "aot_eager", True, 1024, {1, 2})
    ids = [(7 * i + 3) % pair.vocab_size for i in range(1019)]
    for m in (fast, eager):
        m.rollback([])
        m.forward(ids)  # all of ids cached, as the tree drafter's first pass leaves them
        m.forward_tree(ids, [5, 6], [-1, -1])  # the first level: slots 0 and 1
    rows = fast.forward_tree(ids, [7, 8, 9], [0, 1, 0])  # positions 1021..1023: the last three
    assert torch.allclose(rows, eager.forward_tree(ids, [7, 8, 9], [0, 1, 0]), atol=1e-5)
    for m in (fast, eager):
        m.rollback(ids + [0])
        m.forward(ids)
        m.forward_tree(ids, [5, 6], [-1, -1])
        with pytest.raises(ValueError, match="the static cache holds 1024 positions, not 1025"):
            m.forward_tree(ids, [7, 8, 9, 10], [0, 1, 0, 1])


def test_a_failures_causes_name_its_root_and_say_whether_memory_ran_out():
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError, GuardOnDataDependentSymNode

    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer\nmore") from inner
    except RuntimeError as e:
        assert lm_module.failure(e) == "RuntimeError from KeyError: 'inner'"
    assert lm_module.out_of_memory(MemoryError())
    assert lm_module.out_of_memory(RuntimeError("CUDA Out Of Memory"))
    try:
        try:
            raise MemoryError
        except MemoryError:
            raise ValueError("other") from None  # the memory error is not this one's cause
    except ValueError as e:
        assert not lm_module.out_of_memory(e)
    # the compiler refusing a graph, as opposed to a graph that failed as it ran
    assert lm_module.compile_error(ConstraintViolationError("width fixed"))
    assert lm_module.compile_error(GuardOnDataDependentSymNode(None, "data-dependent"))
    assert not lm_module.compile_error(RuntimeError("replay failed"))
