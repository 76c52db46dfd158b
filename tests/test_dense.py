"""CPU layers through oneDNN: float32 layers give the same outputs (to float32 rounding) and the same
greedy output as on torch's own kernels; bf16 layers use it only to read a prompt, which is read
apart from round 1's drafts; only the layers meant for it are routed. (The bf16 tests pretend a
CPU without bf16 instructions, as this machine is.)"""

import copy

import pytest
import torch
from conftest import hf_greedy
from torch import nn

import specviz
from specviz import dense, lm, quant

pytestmark = pytest.mark.skipif(not dense.available(), reason="this torch has no oneDNN on the CPU")

PROMPT = "def fibonacci(n):\n    if n < 2:"


@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (1, 17, 48), (2, 3, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_a_routed_layer_computes_the_same_product_in_float32(shape, bias, monkeypatch):
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    torch.manual_seed(0)
    layer = nn.Linear(48, 40, bias=bias)
    plain = copy.deepcopy(layer)
    assert dense.route(layer) == 1 and type(layer) is dense.OneDNNLinear
    x = torch.randn(shape)
    with torch.no_grad():
        got, torch_out = layer(x), plain(x)
    exact = x.double() @ layer.weight.double().T + (layer.bias.double() if bias else 0)
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 40)
    # float32 rounding of a 48-term dot product, as torch's own kernel has
    assert (got.double() - exact).abs().max() < 1e-5
    assert (torch_out.double() - exact).abs().max() < 1e-5



def test_a_routed_layer_reads_a_bias_that_is_a_strided_view(monkeypatch):
    """oneDNN's inner product reads the bias as if contiguous: a bias a view with a stride (an
    expanded or every-other-element one) gave values 1e28 off, where nn.Linear reads it as it is."""
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    torch.manual_seed(0)
    x = torch.randn(3, 48)  # [tokens, in]
    for bias in (torch.randn(80)[::2], torch.randn(1).expand(40)):  # [40], not contiguous
        layer = nn.Linear(48, 40)
        layer.bias = nn.Parameter(bias, requires_grad=False)
        dense.route(layer)
        exact = x.double() @ layer.weight.double().T + bias.double()
        with torch.no_grad():
            assert (layer(x).double() - exact).abs().max() < 1e-5

def test_only_large_float32_and_bfloat16_cpu_linears_are_routed_and_parameters_stay_shared(monkeypatch):
    monkeypatch.setattr(dense, "native_bf16", lambda: False)
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1024, 512)
            self.up = nn.Linear(512, 1024)  # 524,288 weights: MIN_WEIGHTS
            self.head = nn.Linear(512, 1024, bias=False)
            self.head.weight = self.embed.weight  # tied, as small models' heads are
            self.small = nn.Linear(64, 64)
            self.bf16 = nn.Linear(512, 1024).to(torch.bfloat16)
            self.fp16 = nn.Linear(512, 1024).to(torch.float16)

    model = Tied()
    keys = list(model.state_dict())
    assert dense.MIN_WEIGHTS == 1 << 19
    assert dense.route(model) == 3
    assert type(model.up) is type(model.head) is type(model.bf16) is dense.OneDNNLinear
    assert type(model.small) is type(model.fp16) is nn.Linear
    assert list(model.state_dict()) == keys and model.head.weight is model.embed.weight
    assert dense.route(model) == 0  # already routed


def test_a_routed_layer_moved_to_bfloat16_takes_torchs_path(monkeypatch):
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    layer = nn.Linear(16, 8)
    dense.route(layer)
    layer.to(torch.bfloat16)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))


def test_quantizing_a_routed_draft_still_quantizes_every_layer(monkeypatch):
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    dense.route(model)
    assert quant.quantize_(model, 8) == {"int8": 2}
    assert [type(m).__name__ for m in model] == ["Int8Linear", "Int8Linear"]


@pytest.fixture(scope="module")
def routed_pair(model_dirs):
    """The tiny pair in float32, every Linear routed (the tiny layers sit under MIN_WEIGHTS)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dense, "MIN_WEIGHTS", 0)
        return specviz.load_pair(str(model_dirs["target"]), str(model_dirs["draft"]), device="cpu",
                                 dtype="float32", draft_quant="none")


def test_load_pair_routes_the_layers_of_both_models(routed_pair, pair):
    for model in (routed_pair.target, routed_pair.draft):
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        assert linears and all(type(m) is dense.OneDNNLinear for m in linears)
    # the tests' tiny models (32 wide) sit under MIN_WEIGHTS: the suite runs them on torch's kernels
    assert not any(type(m) is dense.OneDNNLinear for m in pair.target.modules())


@pytest.mark.parametrize("proposer", ["draft", "tree"])
def test_a_routed_pair_gives_the_greedy_output_of_the_model_on_torchs_kernels(routed_pair, pair,
                                                                            proposer):
    """Speculation on the routed pair against the tiny target on torch's own kernels (the session
    `pair` loads the same weights, unrouted: its layers are under MIN_WEIGHTS)."""
    ids = pair.encode(PROMPT)
    pair.target.generation_config.eos_token_id = None
    try:
        expected = hf_greedy(pair, PROMPT, 40)
    finally:
        pair.target.generation_config.eos_token_id = pair.tokenizer.eos_token_id
    with torch.no_grad():
        logits = routed_pair.target(torch.tensor([ids + expected])).logits
        plain = pair.target(torch.tensor([ids + expected])).logits
    assert (logits - plain).abs().max() < 1e-4  # the same model, to float32 rounding
    routed_pair.target.generation_config.eos_token_id = None  # the full budget, as above
    try:
        for k in (1, 2, 4, 8):
            events = specviz.generate(routed_pair, PROMPT, proposer=proposer, k=k, max_new_tokens=40)
            assert [t for e in events for t in e.new_tokens] == expected, f"k={k}"
    finally:
        routed_pair.target.generation_config.eos_token_id = routed_pair.tokenizer.eos_token_id


def test_a_routed_bfloat16_layer_uses_the_float32_kernel_only_while_reading_a_prompt(monkeypatch):
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    monkeypatch.setattr(dense, "native_bf16", lambda: False)
    torch.manual_seed(0)
    layer = nn.Linear(256, 96).to(torch.bfloat16)
    plain = copy.deepcopy(layer)
    assert dense.route(layer) == 1
    x = torch.randn(1, 100, 256).to(torch.bfloat16)  # [batch, tokens, in]: wider than any verify pass
    calls = []  # the dtypes the float32 kernel was called with
    inner = dense._inner_product
    monkeypatch.setattr(dense, "_inner_product", lambda x, w, b: calls.append(x.dtype) or inner(x, w, b))
    with torch.no_grad():
        assert torch.equal(layer(x), plain(x))  # outside a prompt read: torch's own kernel
        assert calls == []
        with dense.reading_prompt():
            prompt = layer(x)
        assert calls == [torch.float32]  # inside it: the float32 kernel, on float32 copies
        assert torch.equal(layer(x), plain(x))  # and again after it
        assert calls == [torch.float32]
        torch_out = plain(x)
    # bf16 products are exact in float64 too: the exact sum, rounded once to bfloat16
    exact = (x.double() @ layer.weight.double().T + layer.bias.double()).to(torch.bfloat16)
    assert prompt.dtype == torch.bfloat16
    ulp = exact.float().abs().clamp_min(1e-3) * 2.0 ** -7  # one unit in the last place, about
    assert ((prompt.float() - exact.float()).abs() <= ulp).all()
    assert ((torch_out.float() - exact.float()).abs() <= ulp).all()
    # the same sums, maybe in another order: equal on some CPUs, a few last places apart on others
    assert (prompt != torch_out).float().mean() < 0.01


def test_a_routed_bfloat16_pair_reads_the_prompt_apart_and_keeps_the_targets_greedy_output(
        model_dirs, monkeypatch):
    """A prompt of PROMPT_ROWS tokens or more is read by the float32 kernel, in a pass of its own
    (all but its last token): round 1's drafts are then read on torch's kernel, as the target
    alone reads those positions, and the output is the target alone's, chain and tree."""
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    monkeypatch.setattr(dense, "native_bf16", lambda: False)
    monkeypatch.setattr(dense, "PROMPT_ROWS", 24)
    wide = []
    monkeypatch.setattr(dense, "_inner_product", lambda x, w, b: wide.append(x.shape[-2]) or
                        torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""))
    pair = specviz.load_pair(str(model_dirs["target"]), str(model_dirs["draft"]), device="cpu",
                             dtype="bfloat16", draft_quant="none")
    assert all(type(m) is dense.OneDNNLinear for m in pair.target.modules() if isinstance(m, nn.Linear))
    # the routed head is still refined in float32 (it once silently was not: a 1-token and a
    # 5-token pass then broke the head's bf16 ties differently)
    assert lm.CachedLM(pair.target, pair.vocab_size, refine=pair.refine).refine
    refined = []
    monkeypatch.setattr(lm, "refine_top",
                        lambda h, w, x, top=lm.refine_top: refined.append(1) or top(h, w, x))
    prompt = PROMPT * 3
    n = len(pair.encode(prompt))
    assert n > 24
    pair.target.generation_config.eos_token_id = None
    base = [t for e in specviz.generate(pair, prompt, proposer="none", max_new_tokens=32)
            for t in e.new_tokens]
    assert len(base) == 32 and wide and set(wide) == {n - 1} and len(refined) >= 32
    for proposer, k in (("draft", 2), ("draft", 4), ("tree", 3)):
        wide.clear()
        events = list(specviz.generate(pair, prompt, proposer=proposer, k=k, max_new_tokens=32))
        assert [t for e in events for t in e.new_tokens] == base, (proposer, k)
        assert set(wide) == {n - 1}  # the prompt but its last token: round 1's drafts are not in it
        assert [e.target_passes for e in events] == list(range(1, len(events) + 1))
    wide.clear()
    assert len(pair.encode(PROMPT)) <= 24
    list(specviz.generate(pair, PROMPT, proposer="draft", k=4, max_new_tokens=8))
    assert wide == []  # a short prompt is read with round 1's drafts, on torch's kernel


def test_a_cpu_with_bf16_instructions_keeps_torchs_bfloat16_kernel(monkeypatch):
    monkeypatch.setattr(dense, "MIN_WEIGHTS", 0)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.bfloat16))
    assert dense.native_bf16() and dense.route(model) == 1
    assert type(model[0]) is dense.OneDNNLinear and type(model[1]) is nn.Linear


def test_a_prompt_is_read_apart_from_prompt_rows_tokens_and_prefilled_in_wider_passes(pair, monkeypatch):
    """Where prompts are read on another kernel, a head of PROMPT_ROWS tokens or more (all of the
    ids but the last) is read in a pass of its own, and a long prompt WIDE_CHUNKS chunks a pass."""
    monkeypatch.setattr(dense, "PROMPT_ROWS", 8)
    reads, read = [], lm.CachedLM._read
    monkeypatch.setattr(lm.CachedLM, "_read", lambda self, ids: reads.append(len(ids)) or read(self, ids))

    def apart(*args, **kwargs):
        cached = lm.CachedLM(*args, **kwargs)
        cached.wide_prompts = True  # as a routed bfloat16 model's: the kernel does not matter here
        return cached

    ids = [5 + i % 30 for i in range(40)]
    for n, expected in ((9, [8]), (8, [])):
        reads.clear()
        logits = apart(pair.target, pair.vocab_size).forward(ids[:n])
        assert reads == expected, n
        assert torch.allclose(logits, lm.CachedLM(pair.target, pair.vocab_size).forward(ids[:n]), atol=1e-5)
    reads.clear()
    assert list(apart(pair.target, pair.vocab_size).prefill(ids, 4)) == [16, 32, 39]
    assert reads == [16, 16, 7]
