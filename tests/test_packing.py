"""packing.pack: q/k/v and gate/up as one matrix product each, in place, on the compiled path."""

import copy
from dataclasses import replace

import pytest
import torch
from conftest import hf_greedy, make_model

import specviz
from specviz import fastpath, packing
from specviz.lm import CachedLM

PROMPT = "def fibonacci(n):\n    if n < 2:"


def tiny_llama(vocab: int = 97):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attention_bias=True)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_a_packed_model_gives_the_unpacked_logits_with_the_same_weight_bytes(kind):
    model = make_model("qwen2", 97, 0, 1) if kind == "qwen2" else tiny_llama()
    packed = copy.deepcopy(model)
    assert packing.pack(packed)
    layer = packed.base_model.layers[0]
    assert isinstance(layer.self_attn, packing.PackedAttention) and isinstance(layer.mlp, packing.PackedMLP)
    hidden, kv = model.config.hidden_size, model.config.num_key_value_heads * 8
    assert layer.self_attn.qkv.weight.shape == (hidden + 2 * kv, hidden)  # q, k, v side by side
    assert layer.mlp.gate_up.weight.shape == (2 * model.config.intermediate_size, hidden)
    assert weight_bytes(packed) == weight_bytes(model)  # moved, not copied
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(packed(ids).logits, model(ids).logits, atol=1e-5)
    assert not packing.pack(packed)  # once only: a packed model is left as it is



def test_an_mlp_whose_up_projection_alone_has_a_bias_is_left_unpacked():
    """gate/up pack with gate's bias (none): an up_proj bias would be dropped (logits 0.13 off)."""
    model = tiny_llama()
    mlp = model.base_model.layers[0].mlp
    up = torch.nn.Linear(mlp.up_proj.in_features, mlp.up_proj.out_features)  # with a bias
    up.weight = mlp.up_proj.weight
    mlp.up_proj = up
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        assert not packing.pack(model)
        assert torch.equal(model(ids).logits, want)

def test_a_packed_model_keeps_every_pass_the_engine_makes(pair):
    """Chain passes over a dynamic and a static cache, rolled back, and a tree pass: the packed
    target's rows are the unpacked one's."""
    packed = copy.deepcopy(pair.target)
    packing.pack(packed)
    ids = pair.encode(PROMPT)
    for cache in ("dynamic", "static"):
        a = CachedLM(pair.target, pair.vocab_size, cache=cache, max_len=64)
        b = CachedLM(packed, pair.vocab_size, cache=cache, max_len=64)
        for tail in ([5], [5, 9, 2], [7, 3]):
            got, want = b.forward(ids + tail, last=len(tail)), a.forward(ids + tail, last=len(tail))
            assert torch.allclose(got, want, atol=1e-5)
            a.rollback(ids + [0])
            b.rollback(ids + [0])
        tree = ([4, 8, 6], [-1, 0, -1])
        assert torch.allclose(b.forward_tree(ids, *tree), a.forward_tree(ids, *tree), atol=1e-5)


def test_models_packing_cannot_take_are_left_alone(gpt2_pair):
    gpt2 = copy.deepcopy(gpt2_pair.target)
    assert not packing.packable(gpt2) and not packing.pack(gpt2)
    odd = make_model("qwen2", 97, 0, 1)
    odd.base_model.layers[1].mlp.up_proj = torch.nn.Identity()  # e.g. a quantized or routed layer
    before = {n: p.clone() for n, p in odd.named_parameters()}
    assert not packing.pack(odd)
    assert {n: p for n, p in odd.named_parameters()}.keys() == before.keys()


def test_the_compiled_path_packs_on_graph_devices_only(pair, cpu_graphs, monkeypatch):
    assert not fastpath.PACK  # off by default until a GPU has timed it (docs/benchmarks.md)

    def packed(steps, graph_devices=("cuda", "cpu"), pack=True) -> bool:
        model = copy.deepcopy(pair.target)
        monkeypatch.setattr(fastpath, "GRAPH_DEVICES", set(graph_devices))
        monkeypatch.setattr(fastpath, "PACK", pack)
        CachedLM(model, pair.vocab_size, cache="static", steps=steps, max_len=64)
        return isinstance(model.base_model.layers[0].mlp, packing.PackedMLP)

    assert packed("compiled")  # cpu_graphs: this CPU stands for a GPU
    assert not packed("graphs")  # the graphed path (ZeroGPU's) keeps the weights placed at start-up
    assert not packed(None) and not packed("compiled", pack=False)
    assert not packed("compiled", graph_devices=("cuda",))  # compiled on a CPU: as it was


@pytest.mark.parametrize("proposer", ["draft", "tree"])
def test_the_packed_compiled_path_keeps_the_unpacked_targets_greedy_output(pair, compiled_pair, cpu_graphs,
                                                                         proposer, monkeypatch):
    monkeypatch.setattr(fastpath, "PACK", True)
    fast = replace(compiled_pair, target=copy.deepcopy(pair.target), draft=copy.deepcopy(pair.draft))
    pair.target.generation_config.eos_token_id = None
    fast.target.generation_config.eos_token_id = None
    try:
        events = list(specviz.generate(fast, PROMPT, proposer=proposer, k=3, max_new_tokens=14))
        assert isinstance(fast.target.base_model.layers[0].mlp, packing.PackedMLP)  # it ran packed
        assert [t for e in events for t in e.new_tokens] == hf_greedy(pair, PROMPT, 14)  # unpacked
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id


def test_nested_layers_are_one_compiled_region_called_once_a_layer_with_the_eager_logits(pair):
    """packing.nest: torch.compile traces the first layer as a nested region and calls the same
    subgraph for every layer; outside torch.compile nothing changes."""
    model = copy.deepcopy(pair.target)
    ids = pair.encode(PROMPT)
    eager = CachedLM(model, pair.vocab_size, cache="static", max_len=64).forward(ids + [5], last=2)
    assert packing.nest(model) and not packing.nest(model)  # once
    again = CachedLM(model, pair.vocab_size, cache="static", max_len=64).forward(ids + [5], last=2)
    assert torch.equal(again, eager)  # a no-op eagerly
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=64)
    with torch.inference_mode():
        fastpath.step(model, cache, torch.tensor([ids]), 1, False, fastpath.cache_argument(model))
        compiled = torch.compile(fastpath.step, backend=backend, dynamic=False)
        rows = compiled(model, cache, torch.tensor([[5]]), 2, False, fastpath.cache_argument(model))
    assert torch.allclose(rows[-1], eager[-1], atol=1e-5)
    calls = [n for n in graphs[0].graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == model.config.num_hidden_layers  # every layer through the region
    assert len({n.args[0].target for n in calls}) == 1  # one subgraph: traced once, reused


def test_the_compiled_path_nests_its_layers_when_asked(pair, monkeypatch):
    model = copy.deepcopy(pair.target)
    CachedLM(model, pair.vocab_size, cache="static", steps="compiled", max_len=64)
    assert not getattr(model.base_model.layers[0].forward, "_specviz_nested", False)  # off by default
    monkeypatch.setattr(fastpath, "NESTED", True)
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())
    CachedLM(model, pair.vocab_size, cache="static", steps="compiled", max_len=64)
    assert model.base_model.layers[0].forward._specviz_nested


@pytest.mark.parametrize("nested", [False, True])
def test_the_packed_compiled_path_in_bfloat16_gives_the_target_alones_output(pair, cpu_graphs, monkeypatch,
                                                                           nested):
    """Everything this path changes at once, in bf16 (the refined head): packed products, grouped
    attention under the chain's and the tree's masks, the captured compiled steps (the CPU
    stand-in graphs), with and without nested layers, the target drafting for itself (every
    verify row used) and a tree."""
    from specviz import enginecheck

    monkeypatch.setattr(fastpath, "PACK", True)
    monkeypatch.setattr(fastpath, "NESTED", nested)
    made = []  # graphs dynamo compiled in this test (its own backend: no earlier test's reused)

    def backend(gm, inputs):
        made.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    monkeypatch.setattr(fastpath, "COMPILE", {"backend": backend, "dynamic": False})
    models = {"target": copy.deepcopy(pair.target).bfloat16(), "draft": copy.deepcopy(pair.draft).bfloat16()}
    assert CachedLM(models["target"], pair.vocab_size).refine  # bf16: the float32-refined head
    for kind in ("self", "tree"):
        r = enginecheck.engine_run(models, "compiled", kind, 3, 16, 16)
        assert r["equals_target_alone"], kind
        assert r["accepted"] > 0 if kind == "self" else r["tree"]
    slots = fastpath._SLOTS[models["target"]]  # its passes ran through captured compiled steps
    assert slots and all(s.steps == "compiled" and s.step.graphs for s in slots)
    assert made  # dynamo compiled them (no silent fallback to eager)
    target, draft = models["target"].base_model, models["draft"].base_model
    assert isinstance(target.layers[0].self_attn, packing.PackedAttention)
    assert target.config._attn_implementation == packing.GROUPED
    assert getattr(target.layers[0].forward, "_specviz_nested", False) is nested
    # the tiny pair's draft has int4 layers (quant.py): packing leaves it as it is
    assert type(draft.layers[0].self_attn.q_proj).__name__ == "Int4Linear" and not packing.packable(draft)
