"""Sliding-window models (Mistral, Phi-3, Starcoder2: every layer slides; Gemma 2 and 3, Cohere 2:
full and sliding layers side by side) as a custom pair, run far past their window: chains and token
trees keep the target's own greedy output on every fast path, and sampled runs its distribution.

Their caches keep every position (kvcache.full_layers), which transformers masks by position, so a
rollback past the window is exact; a tree pass's own 4-D mask gives each layer type its window
(arch.tree_windows). Before, every such run was refused once it reached the window."""

import pytest
import torch
from conftest import EOS, make_tokenizer, perturbed

import specviz
from specviz import arch, fastpath, lm
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
        request.getfixturevalue("compiled_pair")  # sets fastpath.COMPILE to the CPU tests' backend
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
    assert arch.tree_windows(model) == (how, WINDOW)
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
    monkeypatch.setattr(arch, "tree_windows", lambda model: ("full", None))
    assert worst(cached()) > 0.05  # the window is what the mask adds


def test_a_model_whose_tree_masks_cannot_apply_its_window_refuses_trees_past_it(tokenizer, monkeypatch):
    """Where a tree mask cannot give each layer its window (windows of several sizes, chunked
    attention, one mask taken for full and sliding layers: arch.tree_windows "below"), a tree run
    that reaches the window is refused up front naming the fix, a tree pass past it raises rather
    than verify with keys past the window, and chains run on past it unchanged."""
    monkeypatch.setattr(arch, "tree_windows", lambda model: ("below", 24))
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


class _Layers:
    """A cache of the given layers (a window each, None: a full layer), whatever the config says."""

    def __init__(self, windows):
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

        self.layers = [DynamicLayer() if w is None else DynamicSlidingWindowLayer(sliding_window=w)
                       for w in windows]


def test_a_tree_mask_a_layer_type_needs_a_forward_that_takes_one_and_the_configs_layer_types(
        tokenizer, monkeypatch):
    """"split" (a mask for the full layers, another for the sliding ones, passed as a dict keyed
    by layer type) holds only where the model's forward reads such a dict and its config names
    each layer's type: a Gemma 2 whose forward takes one mask, or a Qwen2 (whose forward reads
    the dict) without layer_types, mixing full and sliding layers, verifies trees only below
    its window ("below"), where a dict would reach layers that read no dict or name no key."""
    model = sliding_pair("gemma2", tokenizer).target
    assert arch.tree_windows(model) == ("split", WINDOW)
    base = type(model.base_model)

    class OneMask(base):
        def forward(self, *args, **kwargs):  # a forward that never looks for a dict of masks
            return super().forward(*args, **kwargs)

    model.base_model.__class__ = OneMask
    assert arch.tree_windows(model) == ("below", WINDOW)

    from transformers import AutoModelForCausalLM, Qwen2Config

    untyped = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1))
    assert arch.tree_windows(untyped) == ("split", WINDOW)  # its layer_types: full, sliding
    untyped.config.layer_types = None
    monkeypatch.setattr(arch, "DynamicCache", lambda config: _Layers([None, WINDOW]))
    assert arch.tree_windows(untyped) == ("below", WINDOW)


def test_sliding_layers_of_several_windows_or_another_window_than_the_configs_verify_trees_below_it(
        tokenizer, monkeypatch):
    """One windowed tree mask ("all") is exact only where every layer slides the window the config
    names, the one the model's own mask applies: layers sliding 8 and 16 tokens, or every layer 16
    where the config says 8, verify trees only below the smallest window ("below")."""
    model = sliding_pair("mistral", tokenizer).target
    assert arch.tree_windows(model) == ("all", WINDOW)
    for windows, smallest in (([WINDOW, 2 * WINDOW], WINDOW), ([2 * WINDOW, 2 * WINDOW], 2 * WINDOW)):
        monkeypatch.setattr(arch, "DynamicCache", lambda config, windows=windows: _Layers(windows))
        assert arch.tree_windows(model) == ("below", smallest), windows
        assert arch.tree_window(model) == smallest


def test_a_split_models_tree_passes_share_one_compiled_graph_and_give_the_eager_rows(tokenizer, monkeypatch):
    """A tree pass on a model of full and sliding layers carries a second mask (sliding_mask), whose
    width the shared compiled step marks dynamic as the first's: tree passes of 2, 4 and 8 nodes
    past the window run through the compiled step, one graph for every width, each row the eager
    static pass's (a mask the step did not know failed the compiled step: every later pass eager)."""
    from test_graphed import compiling, tree_passes_agree

    made = []  # graphs dynamo compiled in this test
    monkeypatch.setattr(fastpath, "COMPILE", {"backend": compiling(made), "dynamic": False})
    monkeypatch.setattr(fastpath, "SHARED", True)
    monkeypatch.setattr(fastpath, "_SLOTS", type(fastpath._SLOTS)())
    model = sliding_pair("gemma2", tokenizer).target
    assert arch.tree_windows(model) == ("split", WINDOW)
    fast = lm.CachedLM(model, 300, cache="static", steps="compiled", max_len=128)
    eager = lm.CachedLM(model, 300, cache="static", max_len=128)
    ids = list(range(5, 5 + 3 * WINDOW))
    for m in (fast, eager):
        m.forward(ids[:-1])
    before, graphs = fast.compiled_passes, len(made)
    tree_passes_agree(fast, eager, ids, [7, 3, 5, 11, 13])
    assert fast.compiled_passes - before == 3 and len(made) - graphs == 1


def test_a_split_tree_pass_gives_the_model_its_masks_as_one_dict_keyed_by_layer_type():
    """step turns a tree pass's attention_mask and sliding_mask into the one attention_mask the
    model's forward reads a layer type at a time, {"full_attention": ..., "sliding_attention": ...},
    and passes no sliding_mask (an argument no forward names) on."""
    seen = {}

    class Model:
        def __call__(self, **kwargs):
            seen.update(kwargs)
            return type("Out", (), {"logits": torch.zeros(1, 2, 5)})()

    full, sliding, where = torch.zeros(1, 1, 2, 4), torch.ones(1, 1, 2, 4), torch.tensor([[3, 4]])
    tree = {"attention_mask": full, "sliding_mask": sliding, "position_ids": where}
    fastpath.step(Model(), None, torch.tensor([[1, 2]]), 0, False, **tree)
    assert "sliding_mask" not in seen
    assert seen["attention_mask"].keys() == {"full_attention", "sliding_attention"}
    assert seen["attention_mask"]["full_attention"] is full
    assert seen["attention_mask"]["sliding_attention"] is sliding
    assert seen["position_ids"] is where


def test_a_tree_run_is_bounded_by_the_smaller_window_of_the_pair_to_the_position_and_a_chain_is_not(
        tokenizer, monkeypatch):
    """Pair.tree_window: the smaller of the two models' "below" windows (the draft verifies its own
    tree passes too), None where neither has one. check_length refuses a token tree (room past
    MAX_K) once prompt + output + its nodes reach that window, not one position sooner, and
    never a chain, even one of MAX_K drafts far past the window."""
    from specviz.bounds import MAX_K

    pair = sliding_pair("gemma2", tokenizer)
    windows = {id(pair.target): ("below", 40), id(pair.draft): ("below", 24)}
    monkeypatch.setattr(arch, "tree_windows", lambda model: windows[id(model)])
    assert pair.tree_window == 24
    pair.__dict__.pop("tree_window")
    windows[id(pair.draft)] = ("split", 24)
    assert pair.tree_window == 40
    pair.__dict__.pop("tree_window")
    windows[id(pair.target)] = ("all", 40)
    assert pair.tree_window is None
    pair.__dict__["tree_window"] = 100
    pair.check_length(10, 100 - 10 - 65, 64)  # 99 positions: below the window
    with pytest.raises(ValueError, match="tree nodes must stay below the 100-token sliding window"):
        pair.check_length(10, 100 - 10 - 64, 64)
    pair.check_length(10, 200, MAX_K)  # a chain: its cache crops past the window


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_nodes_added_after_nodes_cached_earlier_see_their_ancestors_within_the_window(kind, tokenizer):
    """The tree drafter adds a tree a level at a time, each pass after the nodes cached before it:
    a pass's rows sit at their own depths, not the first nodes'. Two levels past an 8-token window
    (3 nodes, then 3 children of them) give each node's row the full forward of its branch."""
    model = sliding_pair(kind, tokenizer).target
    seq = torch.randint(0, 300, (25,), generator=torch.Generator().manual_seed(0)).tolist()
    cached = lm.CachedLM(model, 300)
    tokens_, parents = [7, 8, 9, 10, 11, 12], [-1, -1, 0, 2, 3, 1]  # slot i after slot parents[i]
    rows = torch.cat([cached.forward_tree(seq, tokens_[:3], parents[:3])[1:],
                      cached.forward_tree(seq, tokens_[3:], parents[3:])])
    for i in range(len(tokens_)):
        branch, j = [], i
        while j >= 0:
            branch.insert(0, tokens_[j])
            j = parents[j]
        with torch.no_grad():
            full = model(input_ids=torch.tensor([seq + branch]), use_cache=False).logits[0, -1, :300]
        assert float((rows[i] - full).abs().max()) < 1e-4, i
