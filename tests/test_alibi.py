"""ALiBi models (Bloom, MPT, Falcon with alibi) as a custom pair: chains keep the target's greedy
output on every fast path, and what cannot be exact (a token tree, Falcon's static cache) is
refused or avoided, never a traceback from inside transformers or a silently different output."""

import pytest
import torch
from conftest import EOS, hf_greedy, make_tokenizer, perturbed

import specviz
from specviz.lm import CachedLM, resolve_fast
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
    """lm.alibi also holds for decoders whose forward takes no position_ids and that count positions
    from the cache's length (Bart's, Marian's): refused as they should be, but the message said
    they placed tokens by ALiBi biases, which they do not."""
    from transformers import BartConfig, BartForCausalLM

    from specviz.lm import check_tree_model

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
    from specviz import lm

    monkeypatch.setattr(lm, "COMPILE", {"backend": "aot_eager", "dynamic": False})  # as compiled_pair
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
