"""Sliding-window models (Mistral, Phi-3, Starcoder2: every layer slides; Gemma 2 and 3, Cohere 2:
full and sliding layers side by side) as a custom pair, run far past their window: chains and token
trees keep the target's own greedy output on every fast path, and sampled runs its distribution.

Their caches keep every position (lm.full_layers), which transformers masks by position, so a
rollback past the window is exact; a tree pass's own 4-D mask gives each layer type its window
(lm.tree_windows). Before, every such run was refused once it reached the window."""

import pytest
import torch
from conftest import EOS, make_tokenizer, perturbed

import specviz
from specviz import lm
from specviz.loading import Pair
from specviz.sampling import SamplingParams

PROMPT = "def fibonacci(n):\n    if n < 2:"
WINDOW = 8


def sliding_config(kind: str, vocab: int, eos: int, window: int):
    from transformers import Gemma2Config, MistralConfig

    ids = dict(vocab_size=vocab, eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, sliding_window=window,
                 tie_word_embeddings=False, initializer_range=0.2)
    if kind == "mistral":  # one mask for every layer, each sliding
        return MistralConfig(**sizes, **ids)
    # a sliding layer beside a full one, soft-capped attention and logits
    return Gemma2Config(**sizes, head_dim=8, final_logit_softcapping=3.0, attn_logit_softcapping=5.0,
                        layer_types=["sliding_attention", "full_attention"], **ids)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("sliding"))


def sliding_pair(kind: str, tokenizer, fast: str = "eager", window: int = WINDOW) -> Pair:
    """A tiny random sliding-window target and a draft (its copy with noise), float32 on the CPU,
    that run their whole budget (no end of text)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = sliding_config(kind, len(tokenizer), tokenizer.convert_tokens_to_ids(EOS), window)
    target = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    pair = Pair(target, tokenizer, perturbed(target, 1, 0.05), target_name=f"{kind}-target",
                draft_name=f"{kind}-draft", fast=fast)
    pair.__dict__["eos_ids"] = frozenset()
    return pair


@torch.no_grad()
def argmax_loop(model, ids: list[int], n: int, vocab: int) -> list[int]:
    """The target's greedy output from full forwards, no cache: n tokens after ids."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1, :vocab].argmax()))
    return ids[-n:]


def tokens(events) -> list[int]:
    return [t for e in events for t in e.new_tokens]


@pytest.fixture
def fast_pair(request, tokenizer):
    """The pair of request.param (kind, fast), on the compiled path through the CPU tests' aot_eager
    backend, on the graphed path through conftest's stand-in graphs."""
    kind, fast = request.param
    if fast == "compiled":
        request.getfixturevalue("compiled_pair")  # sets lm.COMPILE to the CPU tests' backend
    if fast == "graphed":
        request.getfixturevalue("cpu_graphs")
    return sliding_pair(kind, tokenizer, fast)


PATHS = [(kind, fast) for kind in ("mistral", "gemma2")
         for fast in ("eager", "static", "compiled", "graphed")]


@pytest.mark.parametrize("fast_pair", PATHS, indirect=True, ids=["-".join(p) for p in PATHS])
def test_chains_past_the_window_keep_the_targets_greedy_output(fast_pair):
    """64 tokens after a 12-token prompt, 8 times the window: every chain drafter at k 1 and 4 gives
    the argmax of full forwards, on the path asked for (before: refused at the window)."""
    ids = fast_pair.encode(PROMPT)
    expected = argmax_loop(fast_pair.target, ids, 64, fast_pair.vocab_size)
    for proposer, k in (("draft", 1), ("draft", 4), ("ngram", 4), ("hybrid", 4), ("adaptive", 4)):
        assert tokens(specviz.generate(fast_pair, ids, proposer=proposer, k=k, max_new_tokens=64)) \
            == expected, (proposer, k)
    made = lm.CachedLM(fast_pair.target, fast_pair.vocab_size, **specviz.engine.cache_kwargs(
        fast_pair.target, fast_pair.fast, 200))
    assert made.static == (fast_pair.fast != "eager")  # the static paths are taken, not avoided


@pytest.mark.parametrize("fast_pair", PATHS, indirect=True, ids=["-".join(p) for p in PATHS])
def test_token_trees_past_the_window_keep_the_targets_greedy_output(fast_pair):
    """A tree's verify pass passes its own ancestors-only mask, which transformers gives every
    layer as it is: without the window in it, a sliding layer saw keys past its window. Trees of
    depth 1 and 4, 64 tokens past an 8-token window, give the argmax of full forwards."""
    ids = fast_pair.encode(PROMPT)
    expected = argmax_loop(fast_pair.target, ids, 64, fast_pair.vocab_size)
    for k in (1, 4):
        out = tokens(specviz.generate(fast_pair, ids, proposer="tree", k=k, max_new_tokens=64))
        assert out == expected, k


@pytest.mark.parametrize("kind, how", [("mistral", "all"), ("gemma2", "split")])
@pytest.mark.parametrize("fast", ["eager", "static"])
def test_each_tree_node_sees_its_ancestors_within_each_layers_window(kind, how, fast, tokenizer, monkeypatch):
    """Every row of a tree pass past the window equals the full forward of the node's branch (to
    float32 rounding): nodes at depths 1-3 after contexts of 10 to 40 tokens, a window of 8, rows
    of siblings too. Without the window in the tree mask the same rows are off by far more."""
    model = sliding_pair(kind, tokenizer, window=WINDOW).target
    assert lm.tree_windows(model) == (how, WINDOW)
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 300, (48,), generator=gen).tolist()
    tokens_, parents = [7, 8, 9, 10, 11, 12], [-1, -1, 0, 0, 2, 4]  # node i after parents[i]

    def worst(cached: lm.CachedLM) -> float:
        out = 0.0
        for context in (10, 25, 40):
            rows = cached.forward_tree(seq[:context], tokens_, parents)  # [1 + nodes, vocab]
            for i in range(-1, len(tokens_)):
                branch, j = [], i
                while j >= 0:
                    branch.insert(0, tokens_[j])
                    j = parents[j]
                with torch.no_grad():
                    full = model(input_ids=torch.tensor([seq[:context] + branch]), use_cache=False).logits
                out = max(out, float((rows[1 + i] - full[0, -1, :cached.vocab_size]).abs().max()))
            cached.keep([0, 2])
        return out

    def cached() -> lm.CachedLM:
        return lm.CachedLM(model, 300, **({"cache": "static", "max_len": 128} if fast == "static" else {}))

    assert worst(cached()) < 1e-4
    monkeypatch.setattr(lm, "tree_windows", lambda model: ("full", None))
    assert worst(cached()) > 0.05  # the window is what the mask adds


def test_a_model_whose_tree_masks_cannot_apply_its_window_refuses_trees_past_it(tokenizer, monkeypatch):
    """Where a tree mask cannot give each layer its window (windows of several sizes, chunked
    attention, one mask taken for full and sliding layers: lm.tree_windows "below"), a tree run
    that reaches the window is refused up front naming the fix, a tree pass past it raises rather
    than verify with keys past the window, and chains run on past it unchanged."""
    monkeypatch.setattr(lm, "tree_windows", lambda model: ("below", 24))
    pair = sliding_pair("gemma2", tokenizer)
    ids = pair.encode(PROMPT)
    assert pair.tree_window == 24
    with pytest.raises(ValueError, match=r"tree nodes must stay below the 24-token sliding window, past "
                                         r"which this model's token-tree masks are not exact: draft a chain"):
        specviz.generate(pair, ids, proposer="tree", k=4, max_new_tokens=8)
    cached = lm.CachedLM(pair.target, pair.vocab_size)
    context = ids + [5] * (22 - len(ids))  # the deepest node (depth 2) at position 23, then 24
    cached.forward_tree(context, [1, 2], [-1, 0])
    with pytest.raises(ValueError, match="exact only below its 24-token window: draft a chain"):
        cached.forward_tree(context + [5], [1, 2], [-1, 0])
    expected = argmax_loop(pair.target, ids, 40, pair.vocab_size)
    assert tokens(specviz.generate(pair, ids, proposer="draft", k=4, max_new_tokens=40)) == expected


@pytest.mark.parametrize("proposer, shape", [("draft", {}), ("tree", {"nodes": 6, "branching": 2})])
def test_sampled_runs_past_the_window_follow_the_targets_distribution(proposer, shape, tokenizer):
    """3 tokens at temperature 1 (top_k 3: 27 outcomes) after a prompt longer than a 4-token window,
    on the split model (a sliding and a full layer): 1200 seeded runs of a k=2 chain or tree against
    the target's exact joint distribution, chi-square p > 0.001 (before: refused)."""
    from test_tree import three_token_chi_square

    pair = sliding_pair("gemma2", tokenizer, window=4)
    assert len(pair.encode("The dog. The dog")) > 4
    stat = three_token_chi_square(pair, SamplingParams(1.0, 3), 1200, proposer=proposer, k=2, **shape)
    assert stat.pvalue > 0.001, stat
