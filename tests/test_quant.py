"""Draft weight quantization: exact where the maths is exact, close where it rounds, and never
allowed where the kernels cannot run."""

import pytest
import torch
from torch import nn

from specviz import quant


def test_int4_groups_recover_weights_already_on_a_4bit_grid():
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 4, quant.GROUP), generator=gen).float()  # [out, in/G, G]
    codes[..., 0], codes[..., 1] = 0, 15  # every group spans its whole range
    scale = torch.rand(64, 4, generator=gen) + 0.1
    low = torch.randn(64, 4, generator=gen)
    w = (codes * scale[..., None] + low[..., None]).reshape(64, -1)  # [out, in]
    got_codes, got_scale, got_low = quant.int4_groups(w)
    assert torch.equal(got_codes, codes)
    torch.testing.assert_close(got_scale, scale)
    torch.testing.assert_close(got_low, low)


@pytest.mark.parametrize("cls, bound", [(quant.Int4Linear, 0.1), (quant.Int8Linear, 0.01)])
def test_quantized_linear_is_close_to_the_float_one(cls, bound):
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=True)
    x = torch.randn(5, 3, 256)
    with torch.no_grad():
        want, got = linear(x), cls(linear)(x)
    assert got.shape == want.shape
    assert float((got - want).norm() / want.norm()) < bound


def test_int4_kernel_computes_the_dequantized_weights_exactly():
    torch.manual_seed(1)
    linear = nn.Linear(64, 32, bias=False)
    codes, scale, low = quant.int4_groups(linear.weight.detach())
    dequantized = (codes * scale[..., None] + low[..., None]).reshape(32, 64)
    x = torch.randn(4, 64)
    torch.testing.assert_close(quant.Int4Linear(linear)(x), x @ dequantized.T, rtol=1e-5, atol=1e-5)


def test_shapes_the_int4_kernel_cannot_take_fall_back_to_int8():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 7))  # 48 inputs: not a multiple of 32
    model.device, model.dtype = torch.device("cpu"), torch.float32
    assert quant.apply(model, "auto") == "int4 weights"
    assert isinstance(model[0], quant.Int4Linear) and isinstance(model[1], quant.Int8Linear)


def test_modes_and_their_errors():
    model = nn.Linear(64, 32)
    model.device, model.dtype = torch.device("cpu"), torch.float32
    assert quant.wanted(model, "none") is None and quant.wanted(model, "int8") == 8
    assert quant.wanted(model, "auto") == 4
    with pytest.raises(ValueError, match="one of auto, none, int8, int4"):
        quant.wanted(model, "int3")
    model.dtype = torch.float16
    assert quant.wanted(model, "auto") is None  # auto quietly keeps what cannot be quantized
    with pytest.raises(ValueError, match="draft_quant='none'"):
        quant.wanted(model, "int4")


def test_the_shared_pair_runs_an_int4_draft(pair):
    """The engine's exactness tests use this pair, so they cover the quantized draft."""
    assert "int4 weights" in pair.draft_name
    assert any(isinstance(m, quant.Int4Linear) for m in pair.draft.modules())
