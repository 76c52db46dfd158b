"""Exactness holes: a draft that knows fewer ids, caches that cannot roll back, low-precision ties."""

import copy

import pytest
import torch
from conftest import fails_once, make_model
from scipy.stats import chisquare

import specviz
from specviz.arch import check_rollback, tree_window
from specviz.lm import CachedLM, refine_top
from specviz.loading import Pair
from specviz.proposers import ModelProposer
from specviz.sampling import SamplingParams, process

PREFIX = list(range(5, 12))  # ids every model here can read


@pytest.fixture(scope="module")
def short_pair(pair):
    """The tiny target, made to favour its last id, with a draft that has 16 fewer rows."""
    vocab = pair.vocab_size
    target = copy.deepcopy(pair.target)
    with torch.no_grad():  # id vocab-1 becomes the favourite after PREFIX
        h = target.base_model(torch.tensor([PREFIX])).last_hidden_state[0, -1]  # [d]
        head = target.get_output_embeddings().weight  # [vocab, d]
        head[vocab - 1] = h / h.dot(h) * (float((head @ h).max()) + 0.5)
    draft = make_model("qwen2", vocab - 16, 4, pair.tokenizer.eos_token_id)
    return Pair(target, pair.tokenizer, draft, "target", "short draft")


def test_p_stays_over_the_targets_whole_vocabulary_with_a_short_draft(short_pair):
    assert short_pair.vocab_size == len(short_pair.tokenizer)
    drafter = ModelProposer(short_pair.draft, short_pair.vocab_size)
    ids = list(range(5, 15))  # ids the short draft can read
    draft = drafter.propose(ids, 3, SamplingParams(1.0), torch.Generator().manual_seed(0))
    assert draft.q.shape == (3, short_pair.vocab_size)  # [k, vocab]
    assert draft.q[:, -16:].sum() == 0 and torch.allclose(draft.q.sum(-1), torch.ones(3))
    # a prompt holding ids the draft cannot read is valid: the target goes alone meanwhile
    tail = [short_pair.vocab_size - 1, short_pair.vocab_size - 2]
    events = list(specviz.generate(short_pair, ids + tail, k=3, max_new_tokens=6))
    assert [t for e in events for t in e.new_tokens] == \
        [t for e in specviz.generate(short_pair, ids + tail, proposer="none", max_new_tokens=6)
         for t in e.new_tokens]
    assert all(e.k == 0 for e in events)
    for proposer in ("draft", "tree"):  # the first id past the draft's rows is one it cannot read
        edge = list(specviz.generate(short_pair, ids + [short_pair.vocab_size - 16], proposer=proposer,
                                     k=3, max_new_tokens=4))
        assert all(e.k == 0 and not e.tree for e in edge)


def test_short_draft_sampling_follows_the_targets_distribution(short_pair):
    # 1000 runs of 2 tokens at temperature 1, top_k=3 (9 outcomes), where the target's favourite
    # id is one the draft cannot produce: only the residual can emit it. chi-square p > 0.001.
    pair, params = short_pair, SamplingParams(1.0, top_k=3)
    ids = PREFIX
    with torch.no_grad():
        p1 = process(pair.target(torch.tensor([ids])).logits[0, -1, : pair.vocab_size], params)
        first = p1.nonzero().flatten().tolist()
        p2 = process(pair.target(torch.tensor([ids + [a] for a in first])).logits[:, -1, : pair.vocab_size],
                     params)  # [3, vocab]
    assert pair.vocab_size - 1 in first
    joint = {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(first)
             for b in p2[i].nonzero().flatten().tolist()}
    counts = dict.fromkeys(joint, 0)
    for seed in range(1000):
        events = specviz.generate(pair, ids, k=2, max_new_tokens=2, temperature=1.0, top_k=3, seed=seed)
        counts[tuple(t for e in events for t in e.new_tokens)] += 1  # KeyError: a forbidden outcome
    cells = list(joint)
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64)
    stat = chisquare([counts[c] for c in cells], (expected / expected.sum() * 1000).numpy())
    assert counts[next(c for c in cells if c[0] == pair.vocab_size - 1)] > 0
    assert stat.pvalue > 0.001, stat


def tiny(config_name: str, **extra):
    import transformers

    config = getattr(transformers, config_name)(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2} | extra)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def test_caches_that_cannot_roll_back_are_refused_at_load():
    model = tiny("Qwen3NextConfig", layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ValueError, match=r"Qwen3-Next uses .* cannot be rolled back.*attention models, "
                                         r"full or sliding-window \(pick another pair\)"):
        check_rollback(model, "Qwen3-Next")
    with pytest.raises(ValueError, match="cannot be rolled back"):
        Pair(tiny("Qwen2Config"), None, model).tree_window  # noqa: B018


def test_a_pair_made_directly_with_a_cache_that_cannot_roll_back_refuses_every_run_when_called(pair):
    """A Pair made without load_pair is checked when a run is called: since token trees alone read
    the pair's tree_window, a chain on a linear-attention target or draft went on to fail at its
    first rollback inside transformers ("`crop` was called, but the current layer does not track
    past states"). Every run on such a pair is refused up front, naming the fix."""
    linear = tiny("Qwen3NextConfig", vocab_size=pair.vocab_size,
                  layer_types=["linear_attention", "full_attention"])
    for target, draft in ((pair.target, linear), (linear, pair.draft)):
        for proposer in ("draft", "ngram", "tree"):
            with pytest.raises(ValueError, match=r"cannot be rolled back.*\(pick another pair\)"):
                specviz.generate(Pair(target, pair.tokenizer, draft), "def f(x):", proposer=proposer, k=4,
                                 max_new_tokens=8)


def test_a_folder_whose_cache_cannot_roll_back_is_refused_when_it_loads(pair, tmp_path):
    """load_pair refuses a model whose cache cannot roll back as it loads, not at its first run."""
    linear = tiny("Qwen3NextConfig", vocab_size=pair.vocab_size,
                  layer_types=["linear_attention", "full_attention"])
    linear.save_pretrained(tmp_path)
    pair.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot be rolled back"):
        specviz.load_pair(str(tmp_path), device="cpu", dtype="float32")


def sliding_pair(pair) -> Pair:
    """A tiny pair whose every layer slides a 64-token window, on pair's tokenizer."""
    sliding = tiny("Qwen2Config", vocab_size=pair.vocab_size, use_sliding_window=True,
                   sliding_window=64, max_window_layers=0, max_position_embeddings=256)
    return Pair(sliding, pair.tokenizer, copy.deepcopy(sliding))


def test_sliding_window_models_run_past_their_window(pair):
    """A sliding-window cache layer cannot be cropped back past its window, and such pairs were
    refused once prompt + output + a round's drafts reached it. Their caches now keep every
    position (kvcache.full_layers; transformers applies the window in the mask): a chain, a chain of
    the most drafts (MAX_K) and a token tree run far past the 64-token window and keep the
    target's own greedy output."""
    slide_pair = sliding_pair(pair)
    assert slide_pair.tree_window is None  # every layer slides one window: tree masks apply it
    ids = pair.encode("for i in range(10):")
    alone = [t for e in specviz.generate(slide_pair, ids, proposer="none", max_new_tokens=150)
             for t in e.new_tokens]
    assert len(alone) == 150  # past the window, the output not cut short by an end of text
    for proposer, k in (("draft", 4), ("draft", 32), ("tree", 4)):
        out = specviz.generate(slide_pair, ids, proposer=proposer, k=k, max_new_tokens=150)
        assert [t for e in out for t in e.new_tokens] == alone, (proposer, k)


def test_a_sliding_window_model_takes_every_fast_path_with_full_cache_layers(pair):
    """Sliding-window models stayed on the dynamic cache whatever the fast path: a static sliding
    layer cannot roll back past its window either. With every layer a full one they take the
    static, compiled and graphed paths as other models do."""
    from transformers.cache_utils import DynamicLayer, StaticLayer

    from specviz.fastpath import resolve_fast

    model = sliding_pair(pair).target
    assert resolve_fast("static", model) == ("static", None)
    assert resolve_fast("compiled", model) == ("static", "compiled")
    assert {type(layer) for layer in CachedLM(model, 64).cache.layers} == {DynamicLayer}
    static = CachedLM(model, 64, cache="static", max_len=300)
    assert {(type(layer), layer.max_cache_len) for layer in static.cache.layers} == {(StaticLayer, 300)}


def test_the_sampling_check_prices_a_tree_round_as_the_engine_does(pair, monkeypatch):
    """The exactness lab's continuations check refuses, before its first sample, a tree run the
    engine would refuse: it once reserved a chain's MAX_K (32) positions for a tree's 64 nodes.
    (A model whose tree masks cannot apply its window, arch.tree_windows "below", refuses trees
    that reach it.)"""
    from specviz import arch, service
    from specviz.settings import RunSettings

    monkeypatch.setattr(arch, "tree_windows", lambda model: ("below", 64))
    slide_pair = sliding_pair(pair)
    s = RunSettings(pair="tiny", chat=False, prompt="for i in range(10):", temperature=1.0, k=4,
                    proposer="tree", dtype="float32")
    tokens = 64 - 33 - len(pair.encode(s.prompt)) - 1  # fits 32 drafted positions, not 64
    monkeypatch.setattr(service, "generate", lambda *a, **kw: pytest.fail("sampled before the check"))
    with pytest.raises(ValueError, match="token-tree masks are not exact: draft a chain"):
        next(service.continuations(slide_pair, s, 10, tokens=tokens))


def test_refined_head_equals_the_float32_head_on_the_candidates():
    torch.manual_seed(0)
    hidden = torch.randn(5, 32).bfloat16()  # [n, d]
    weight = torch.randn(300, 32).bfloat16()  # [vocab, d]
    weight[7] = weight[3]  # an exact tie in any precision
    low = hidden @ weight.T  # [n, vocab], rounded to bf16
    refined = refine_top(hidden, weight, low)
    exact = hidden.float() @ weight.float().T
    assert torch.equal(refined.argmax(-1), exact.argmax(-1))
    top = exact.amax(-1, keepdim=True)
    ulp = torch.exp2(torch.floor(torch.log2(top)) - 7)  # bf16's spacing at each row's maximum
    near = (exact >= top - ulp).nonzero().tolist()  # every logit rounding could have put first
    assert all(abs(refined[i, j] - exact[i, j]) < 1e-4 for i, j in near)
    assert torch.equal(refined[low.float() < top - 2], low.float()[low.float() < top - 2])


def test_a_refined_rows_logits_do_not_depend_on_the_rows_beside_it():
    """The target alone refines one row a pass; a verify pass refines k+1 (a tree's, up to 65).
    Each row must get what it gets alone, or sampling from a verify row is not sampling from the
    target alone's p: refining every row's top m (the widest row's count) moved p of the other
    rows by up to 1.4% in total variation on random bf16 heads."""
    from specviz.sampling import SamplingParams, process

    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(300):
        weight = (torch.randn(32, 16, generator=g) * 1.5).bfloat16()  # [vocab, d]
        hidden = (torch.randn(2, 16, generator=g) * 1.5).bfloat16()  # [2, d]
        hidden[1] = 0.01 * hidden[1]  # a flat row: many near-ties, so it has the most candidates
        low = torch.nn.functional.linear(hidden, weight)  # [2, vocab] in bf16
        for row in (0, 1):
            alone = refine_top(hidden[row:row + 1], weight, low[row:row + 1])[0]
            beside = refine_top(hidden, weight, low)[row]
            assert torch.allclose(alone, beside, rtol=0, atol=1e-6)
            worst = max(worst, 0.5 * float((process(alone, SamplingParams(1.0))
                                            - process(beside, SamplingParams(1.0))).abs().sum()))
    assert worst < 1e-6


def test_refined_path_gives_the_models_own_logits_in_float32(pair):
    ids = pair.encode("def fibonacci(n):")
    plain, refined = CachedLM(pair.target, pair.vocab_size), CachedLM(pair.target, pair.vocab_size)
    assert not refined.refine  # float32: nothing to refine
    refined.refine = True  # force the base-model + head path
    a, b = plain.forward(ids, last=3), refined.forward(ids, last=3)
    assert torch.allclose(a, b, atol=1e-5) and torch.equal(a.argmax(-1), b.argmax(-1))
    a, b = plain.forward(ids + [5, 6], last=2), refined.forward(ids + [5, 6], last=2)
    assert torch.allclose(a, b, atol=1e-5)


def test_bfloat16_target_refines_and_keeps_the_greedy_promise(pair):
    target = copy.deepcopy(pair.target).to(torch.bfloat16)
    bf = Pair(target, pair.tokenizer, copy.deepcopy(pair.draft).to(torch.bfloat16))
    assert CachedLM(target, bf.vocab_size).refine and "float32" in bf.numerics
    for prompt in ("def fibonacci(n):", "for i in range(10):", "The quick brown fox"):
        spec = [t for e in specviz.generate(bf, prompt, k=4, max_new_tokens=30) for t in e.new_tokens]
        alone = [t for e in specviz.generate(bf, prompt, proposer="none", max_new_tokens=30)
                 for t in e.new_tokens]
        assert spec == alone, prompt


def test_models_that_take_past_key_values_get_the_cache_there(pair):
    """transformers before 5.24 (e.g. 5.17, on the GPU check's machine) name the forward
    argument past_key_values and silently ignore cache=: the cache must go by the right name."""
    from specviz.fastpath import cache_argument

    class OldStyle(type(pair.target)):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kw):
            return super().forward(input_ids=input_ids, cache=past_key_values, use_cache=use_cache,
                                   logits_to_keep=logits_to_keep)

    old = copy.deepcopy(pair.target)
    old.__class__ = OldStyle
    assert cache_argument(old) == "past_key_values" and cache_argument(pair.target) == "cache"
    ids = pair.encode("def fibonacci(n):")
    for cache in ("dynamic", "static"):
        lm = CachedLM(old, pair.vocab_size, cache=cache, max_len=64)
        ref = CachedLM(pair.target, pair.vocab_size)
        lm.forward(ids)
        assert lm.cache_length == len(ids)  # the cache was filled, not ignored
        assert torch.allclose(lm.forward(ids + [5, 6], last=2), ref.forward(ids + [5, 6], last=2), atol=1e-5)


def test_static_layers_without_crop_roll_back_by_their_length(static_pair, monkeypatch):
    """transformers 5.17's StaticLayer has no crop: the rollback moves its length by hand."""
    from transformers.cache_utils import StaticLayer

    monkeypatch.delattr(StaticLayer, "crop")
    ids = static_pair.encode("def fibonacci(n):")
    lm = CachedLM(static_pair.target, static_pair.vocab_size, cache="static", max_len=64)
    ref = CachedLM(static_pair.target, static_pair.vocab_size)
    lm.forward(ids + [5, 6, 7], last=4)
    lm.rollback(ids + [5, 9])
    assert lm.cache_length == len(ids) + 1
    assert torch.allclose(lm.forward(ids + [5, 9], last=2), ref.forward(ids + [5, 9], last=2), atol=1e-5)


def test_a_step_that_fails_part_way_leaves_every_layer_at_the_committed_length(pair):
    """A compiled step that fails falls back to eager. It may have written some layers' caches
    and not others, so each layer is cut back by what it holds beyond the committed tokens (one
    length for all, layer 0's, left the unwritten layers short of their committed tokens)."""
    from specviz import fastpath

    ids = pair.encode("def fibonacci(n):")
    lm = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    lm.forward(ids)
    lm._step, lm.compiled_widths = fastpath.step, {3}  # stands in for the compiled step
    with fails_once(pair.target.model.layers[0]) as failed:  # layer 0 written, not 1
        logits = lm.forward(ids + [5, 6, 7], last=3)
    assert failed and lm._step is None  # eager from now on
    fresh = CachedLM(pair.target, pair.vocab_size, cache="static", max_len=64)
    fresh.forward(ids)
    assert torch.allclose(logits, fresh.forward(ids + [5, 6, 7], last=3), atol=1e-5)
    assert {int(layer.get_seq_length()) for layer in lm.cache.layers} == {len(ids) + 3}


def test_a_row_with_more_candidates_than_the_fixed_count_has_all_of_them_refined():
    """refine_top recomputes each row's top CANDIDATES logits before it reads anything back; a
    flatter row (more logits within 4 ulp of its maximum) gets all of its candidates recomputed."""
    from specviz import lm

    torch.manual_seed(1)
    weight = torch.randn(300, 32)  # [vocab, d]
    weight[:40] = 3 * weight[0] + 0.01 * torch.randn(40, 32)  # 40 tokens alike
    weight = weight.bfloat16()
    hidden = torch.randn(3, 32).bfloat16()  # [n, d]
    hidden[1] = weight[0]  # a flat row: its top 40 logits within a few ulp of each other
    low = hidden @ weight.T  # [n, vocab] in bf16
    exact = hidden.float() @ weight.float().T
    out = low.float()
    top = out.amax(-1, keepdim=True)
    near = out >= top - 4 * torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(top.abs())))
    assert near.sum(-1)[1] > lm.CANDIDATES >= near.sum(-1)[[0, 2]].max()
    refined = refine_top(hidden, weight, low)
    assert torch.allclose(refined[near], exact[near], rtol=1e-6, atol=1e-5)  # every candidate, every row
    assert torch.equal(refined[~near], out[~near])  # the rest as given
    assert torch.equal(refined.argmax(-1), exact.argmax(-1))
    assert torch.allclose(lm.refine_top(hidden, weight, low, 300), refined, rtol=0, atol=1e-6)  # any count
    for row in range(3):  # each row what it gets alone: only the wide row was refined again
        assert torch.allclose(refine_top(hidden[row:row + 1], weight, low[row:row + 1])[0], refined[row],
                              rtol=0, atol=1e-6)


def written(cache, *lengths):
    """cache with layer i written lengths[i] positions (None or absent: never written, as a layer
    whose keys and values another layer shares)."""
    for layer, n in zip(cache.layers, lengths, strict=False):
        if n is not None:
            layer.update(torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8))
    return cache


@pytest.mark.parametrize("has_crop", [True, False])
def test_a_static_rollback_moves_only_the_layers_written_so_far(pair, has_crop, monkeypatch):
    """A layer never written holds nothing: cropping the cache leaves it at 0 (at -2 it would
    write its first keys two places before the start), each written layer moves by the count.
    Without StaticLayer.crop (transformers 5.17) crop_layer moves the length by hand."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    from specviz.kvcache import crop, crop_layer

    if not has_crop:
        monkeypatch.delattr(StaticLayer, "crop")
    cache = written(StaticCache(config=pair.target.config, max_cache_len=16), 5)
    crop(cache, -2)
    assert [int(layer.get_seq_length()) for layer in cache.layers] == [3, 0]
    assert int(cache.layers[1].cumulative_length) == 0
    if not has_crop:  # crop_layer's own move, as truncate and a cache of mixed layers use it
        for layer in cache.layers:
            crop_layer(layer, -1)
        assert [int(layer.cumulative_length) for layer in cache.layers] == [2, 0]


def test_a_failed_step_is_cut_back_layer_by_layer_without_static_crop(pair, monkeypatch):
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    from specviz.kvcache import truncate

    monkeypatch.delattr(StaticLayer, "crop")
    cache = written(StaticCache(config=pair.target.config, max_cache_len=16), 7, 4)
    truncate(cache, 5)
    assert [int(layer.get_seq_length()) for layer in cache.layers] == [5, 4]


def test_layers_that_cannot_crop_name_the_transformers_that_can(pair, monkeypatch):
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from specviz.kvcache import crop

    monkeypatch.delattr(DynamicLayer, "crop")
    cache = written(DynamicCache(config=pair.target.config), 3, 3)
    with pytest.raises(ValueError, match="DynamicLayer cache layers cannot roll back in this transformers: "
                                         "upgrade to 5.24 or later"):
        crop(cache, -1)


def test_the_tree_window_is_the_smallest_where_sliding_windows_differ(pair, monkeypatch):
    """Layers of several windows take no one windowed tree mask: a token tree is exact only below
    the smallest window (arch.tree_windows "below"), which bounds a tree run and no chain."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from specviz import arch

    class Mixed:  # the layers a config with per-layer windows gives, a full-attention one among them
        def __init__(self, config):
            self.layers = [DynamicSlidingWindowLayer(sliding_window=w) for w in (64, 32, 48)]
            self.layers.insert(1, DynamicLayer())

    monkeypatch.setattr(arch, "DynamicCache", Mixed)
    assert arch.tree_windows(pair.target) == ("below", 32)
    assert tree_window(pair.target) == 32


def test_only_plain_low_precision_heads_are_refined(pair):
    """refinable: a bfloat16 or float16 model whose logits are exactly a bias-free linear head over
    the last hidden state; float32 needs no refining, and neither a biased head nor an architecture
    that soft-caps its logits (gemma2) gives its own logits from base_model and the head's weight."""
    from torch import nn

    from specviz.arch import refinable

    assert refinable(copy.deepcopy(pair.target).to(torch.bfloat16))
    assert refinable(copy.deepcopy(pair.target).to(torch.float16))
    assert not refinable(pair.target)  # float32
    biased = copy.deepcopy(pair.target)
    head = biased.get_output_embeddings()
    biased.set_output_embeddings(nn.Linear(head.in_features, head.out_features, bias=True))
    assert not refinable(biased.to(torch.bfloat16))
    assert not refinable(tiny("Gemma2Config", head_dim=8).to(torch.bfloat16))


def test_a_refined_head_with_padded_rows_gives_the_vocabularys_logits_and_a_drafter_never_refines(pair):
    from specviz.lm import draft_lm

    padded = make_model("qwen2", pair.vocab_size + 16, 4, pair.tokenizer.eos_token_id).to(torch.bfloat16)
    ids = pair.encode("def fibonacci(n):")
    target = CachedLM(padded, pair.vocab_size)
    logits = target.forward(ids, last=2)
    assert target.refine and logits.shape == (2, pair.vocab_size)
    assert not draft_lm(padded, pair.vocab_size).refine  # the float32 head is for the target's p only


def test_a_refined_row_recomputes_the_logits_within_4_ulp_of_its_maximum_and_no_others():
    """Row maximum 1.5 (bf16's spacing there 2^-7): a logit 3 or 4 spacings below it is a
    candidate, made exact in float32; one 5 below, or far below, is left as bf16 gave it."""
    hidden = torch.tensor([[1.0, 2.0 ** -10]]).bfloat16()  # [1, d]
    weight = torch.tensor([[1.5, 0.0], [1.5 - 3 / 128, 1.0], [1.5 - 4 / 128, 1.0], [1.5 - 5 / 128, 1.0],
                           [0.5, 1.0]]).bfloat16()
    low = hidden @ weight.T  # [1, 5]: the 2^-10 is lost to bf16's rounding
    exact = hidden.float() @ weight.float().T
    assert torch.equal(low.float(), weight.float()[:, 0][None])
    refined = refine_top(hidden, weight, low)
    assert refined.tolist() == [[1.5, 1.5 - 3 / 128 + 2 ** -10, 1.5 - 4 / 128 + 2 ** -10, 1.5 - 5 / 128, 0.5]]
    assert torch.equal(refined[0, :3], exact[0, :3])


def test_the_refined_path_gives_the_cache_by_the_base_models_own_argument(pair):
    """A refined pass calls base_model, not the model: the cache goes by the name base_model's
    forward takes, whatever the model's own class names it."""

    class OldStyle(type(pair.target)):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kw):
            return super().forward(input_ids=input_ids, cache=past_key_values, use_cache=use_cache,
                                   logits_to_keep=logits_to_keep)

    target = copy.deepcopy(pair.target).to(torch.bfloat16)
    old = copy.deepcopy(target)
    old.__class__ = OldStyle
    ids = pair.encode("def fibonacci(n):")
    lm, ref = CachedLM(old, pair.vocab_size), CachedLM(target, pair.vocab_size)
    assert lm.refine and lm.kv == "cache"
    lm.forward(ids)
    assert lm.cache_length == len(ids)  # the cache was filled, not ignored
    assert torch.equal(lm.forward(ids + [5, 6], last=2), ref.forward(ids + [5, 6], last=2))
