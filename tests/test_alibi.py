"""ALiBi models (Bloom, MPT, Falcon with alibi) as a custom pair: chains keep the target's greedy
output on every fast path, and what cannot be exact (a token tree, Falcon's static cache) is
refused or avoided, never a traceback from inside transformers or a silently different output."""

import pytest
import torch
from conftest import EOS, hf_greedy, make_tokenizer, perturbed

import specviz
from specviz.fastpath import resolve_fast
from specviz.lm import CachedLM
from specviz.loading import Pair

PROMPT = "def fibonacci(n):\n    if n < 2:"


def alibi_config(kind: str, vocab: int, eos: int):
    from transformers import BloomConfig, FalconConfig, MptConfig

    ids = dict(vocab_size=vocab, eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    if kind == "bloom":
        return BloomConfig(hidden_size=32, n_layer=2, n_head=4, **ids)
    if kind == "mpt":
        return MptConfig(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=256, **ids)
    return FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                        max_position_embeddings=256, **ids)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("alibi"))


def alibi_pair(kind: str, tokenizer, fast: str = "eager") -> Pair:
    """A tiny random ALiBi target and a draft (its copy with noise), float32 on the CPU."""
    from transformers import AutoModelForCausalLM

    eos = tokenizer.convert_tokens_to_ids(EOS)
    torch.manual_seed(0)
    config = alibi_config(kind, len(tokenizer), eos)
    config.initializer_range = 0.2
    target = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    target.generation_config.eos_token_id = None  # both run the whole budget
    pair = Pair(target, tokenizer, perturbed(target, 1, 0.05), fast=fast)
    pair.__dict__["eos_ids"] = frozenset()
    return pair


@pytest.mark.parametrize("kind", ["bloom", "mpt", "falcon"])
def test_a_token_tree_on_an_alibi_model_is_refused_with_a_message_naming_a_chain(kind, tokenizer):
    """A tree pass places each node through position_ids and a 4-D mask, which ALiBi models never
    read: the tree drafter is refused before any pass, and a tree pass (a caller's own tree
    drafter's) raises the same, where Bloom and Falcon raised "too many values to unpack" from
    inside transformers and MPT verified nodes at their cache slots' positions (its greedy output
    then differed from the target's own)."""
    pair = alibi_pair(kind, tokenizer)
    with pytest.raises(ValueError, match=r"ALiBi.*cannot verify a token tree exactly: draft a chain"):
        specviz.generate(pair, PROMPT, proposer="tree", k=4, max_new_tokens=40)
    lm = CachedLM(pair.target, pair.vocab_size)
    with pytest.raises(ValueError, match=f"{pair.target.config.model_type}.*ALiBi"):
        lm.forward_tree(pair.encode(PROMPT), [5, 6, 7], [-1, 0, -1])


def test_a_tree_on_another_model_without_position_ids_is_refused_without_naming_alibi():
    """arch.alibi also holds for decoders whose forward takes no position_ids and that count positions
    from the cache's length (Bart's, Marian's): refused as they should be, but the message said
    they placed tokens by ALiBi biases, which they do not."""
    from transformers import BartConfig, BartForCausalLM

    from specviz.arch import check_tree_model

    model = BartForCausalLM(BartConfig(vocab_size=64, d_model=16, decoder_layers=1, encoder_layers=1,
                                       decoder_attention_heads=2, encoder_attention_heads=2,
                                       decoder_ffn_dim=16, encoder_ffn_dim=16))
    with pytest.raises(ValueError, match=r"\(bart\) places tokens by its cache slots.*: draft a chain") as no:
        check_tree_model(model)
    assert "ALiBi" not in str(no.value)


@pytest.mark.parametrize(("kind", "fast"), [("bloom", "eager"), ("bloom", "static"), ("mpt", "eager"),
                                            ("mpt", "static"), ("mpt", "compiled"), ("falcon", "eager"),
                                            ("falcon", "static"), ("falcon", "compiled")])
def test_chains_on_alibi_models_keep_the_targets_greedy_output(kind, fast, tokenizer, monkeypatch):
    """A drafted chain and the n-gram's on an ALiBi pair give the target's own greedy tokens on
    every fast path. (Falcon's ALiBi on a static cache crashed at its first pass: "The size of
    tensor a (77) must match the size of tensor b (11)"; MPT's on the compiled path's 1,024-slot
    cache: "The size of tensor a (1024) must match the size of tensor b (256)".)"""
    from specviz import fastpath

    monkeypatch.setattr(fastpath, "COMPILE", {"backend": "aot_eager", "dynamic": False})  # as compiled_pair
    pair = alibi_pair(kind, tokenizer, fast)
    expected = hf_greedy(pair, PROMPT, 48)
    for proposer in ("draft", "ngram"):
        for k in (1, 4):
            events = list(specviz.generate(pair, PROMPT, proposer=proposer, k=k, max_new_tokens=48))
            assert [t for e in events for t in e.new_tokens] == expected, (proposer, k)


@pytest.mark.parametrize("kind", ["falcon", "mpt"])
def test_falcon_and_mpt_alibi_stay_on_a_dynamic_cache_on_every_fast_path(kind, tokenizer):
    """Falcon's ALiBi biases span the tokens cached and MPT's its max_seq_len keys, where a static
    cache makes every slot a key: both stay eager on a dynamic cache
    (on CUDA "auto" picks the compiled path, which crashed for both); Bloom keeps its static cache
    from transformers 5.24 (test_bloom_stays_on_a_dynamic_cache_where_...)."""
    model = alibi_pair(kind, tokenizer).target
    for mode in ("auto", "static", "compiled", "graphed"):
        assert resolve_fast(mode, model) == ("dynamic", None), mode


def test_bloom_stays_on_a_dynamic_cache_where_transformers_sizes_its_biases_by_the_tokens_cached(
        tokenizer, monkeypatch):
    """transformers before 5.24 (5.17, the GPU machine's) builds Bloom's ALiBi biases from a mask
    over the tokens cached, not a static cache's every slot: its first static pass failed ("The
    expanded size of the tensor (64) must match the existing size (11)"), on CUDA's "auto" path too.
    There Bloom stays eager on a dynamic cache; from 5.24 it keeps its static cache."""
    import transformers

    model = alibi_pair("bloom", tokenizer).target
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    for mode in ("auto", "static", "compiled", "graphed"):
        assert resolve_fast(mode, model) == ("dynamic", None), mode
    monkeypatch.setattr(transformers, "__version__", "5.24.0")
    assert resolve_fast("static", model) == ("static", None)
    assert resolve_fast("compiled", model) == ("static", "compiled")


def test_an_mpt_run_is_bounded_by_its_max_seq_len(tokenizer):
    """MPT names its positions max_seq_len (no max_position_embeddings): a run past them is refused
    when called, naming the limit, where it failed inside MPT's forward at position 257; a run to
    its very end, drafts reaching past it asked on the static path, keeps the greedy output."""
    pair = alibi_pair("mpt", tokenizer, "static")
    n = pair.encode(PROMPT)
    with pytest.raises(ValueError, match=r"past .*256: shorten one of them"):
        specviz.generate(pair, PROMPT, max_new_tokens=257 - len(n) + 1)
    events = list(specviz.generate(pair, PROMPT, k=4, max_new_tokens=257 - len(n)))
    assert [t for e in events for t in e.new_tokens] == hf_greedy(pair, PROMPT, 257 - len(n))


def test_a_falcon_without_alibi_keeps_its_static_cache_and_verifies_token_trees(tokenizer):
    """Only Falcon's ALiBi (config.alibi) sizes its biases by the tokens cached: a rotary Falcon
    takes the static and compiled paths as other models do, and its token trees on the static
    cache keep the target's own greedy output."""
    from transformers import AutoModelForCausalLM, FalconConfig

    eos = tokenizer.convert_tokens_to_ids(EOS)
    torch.manual_seed(0)
    config = FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=False,
                          max_position_embeddings=256, vocab_size=len(tokenizer), eos_token_id=eos,
                          bos_token_id=eos, pad_token_id=eos, initializer_range=0.2)
    target = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    target.generation_config.eos_token_id = None
    assert resolve_fast("static", target) == ("static", None)
    assert resolve_fast("compiled", target) == ("static", "compiled")
    pair = Pair(target, tokenizer, perturbed(target, 1, 0.05), fast="static")
    pair.__dict__["eos_ids"] = frozenset()
    events = list(specviz.generate(pair, PROMPT, proposer="tree", k=3, max_new_tokens=24))
    assert [t for e in events for t in e.new_tokens] == hf_greedy(pair, PROMPT, 24)


def test_a_tree_is_refused_where_either_forward_on_the_way_to_the_layers_takes_no_position_ids(tokenizer):
    """A tree pass calls the model, and a refined pass its base_model: a node's depth reaches the
    layers only where both forwards take position_ids. A model whose own forward, or whose base
    model's, takes none places nodes by their cache slots, and is refused; the model as it is
    verifies trees."""
    from conftest import make_model

    from specviz.arch import check_tree_model

    def without_position_ids(cls):
        class Slots(cls):
            def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **kwargs):
                return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                       past_key_values=past_key_values, **kwargs)

        return Slots

    eos = tokenizer.convert_tokens_to_ids(EOS)
    check_tree_model(make_model("qwen2", len(tokenizer), 0, eos))
    outer = make_model("qwen2", len(tokenizer), 0, eos)
    outer.__class__ = without_position_ids(type(outer))
    base = make_model("qwen2", len(tokenizer), 0, eos)
    base.base_model.__class__ = without_position_ids(type(base.base_model))
    for model in (outer, base):
        with pytest.raises(ValueError, match=r"\(qwen2\) places tokens by its cache slots .*: draft a chain"):
            check_tree_model(model)


@pytest.mark.parametrize("alibi_side", ["target", "draft"])
def test_a_tree_run_names_whichever_model_of_the_pair_cannot_verify_a_tree(alibi_side, tokenizer):
    """The tree drafter checks the target and the draft before any cache is made: an ALiBi model on
    either side of the pair is refused by its own name, whatever the other model is."""
    from conftest import make_model

    eos = tokenizer.convert_tokens_to_ids(EOS)
    bloom = alibi_pair("bloom", tokenizer).target
    rotary = make_model("qwen2", len(tokenizer), 0, eos)
    models = (bloom, rotary) if alibi_side == "target" else (rotary, bloom)
    pair = Pair(models[0], tokenizer, models[1], target_name="T-model", draft_name="D-model")
    pair.__dict__["eos_ids"] = frozenset()
    name = "T-model" if alibi_side == "target" else "D-model"
    with pytest.raises(ValueError, match=rf"^{name} \(bloom\) places tokens by ALiBi biases"):
        specviz.generate(pair, PROMPT, proposer="tree", k=4, max_new_tokens=8)
