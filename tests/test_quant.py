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


def test_int8_keeps_each_rows_largest_weight_at_127_and_rounds_the_rest():
    """Per-row scale amax / 127, codes rounded to the nearest step; a row of zeros stays zeros."""
    linear = nn.Linear(16, 2, bias=False)
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[0, :3] = torch.tensor([127.0, -3.4, 2.6])  # scale 127 / 127 = 1
    layer = quant.Int8Linear(linear)
    assert layer.weight[0, :3].tolist() == [127, -3, 3] and not layer.weight[0, 3:].any()
    assert not layer.weight[1].any() and float(layer.scales[0]) == 1.0
    assert torch.equal(layer(torch.ones(1, 16)), torch.tensor([[127.0, 0.0]]))  # 127 - 3 + 3


def test_int4_groups_of_one_value_keep_it_exactly():
    """A constant group has no range: its scale is floored, not 0 (0 / 0 made its codes NaN)."""
    w = torch.cat([torch.full((16, 32), 0.25), torch.zeros(16, 32)], dim=1)  # [out, in]: two groups a row
    codes, scale, low = quant.int4_groups(w)
    assert not codes.any() and bool((scale > 0).all())
    assert torch.equal(low, torch.tensor([[0.25, 0.0]]).expand(16, 2))
    layer = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    assert torch.equal(quant.Int4Linear(layer)(torch.ones(1, 64)), torch.full((1, 16), 8.0))  # 32 * 0.25


def test_each_int4_group_keeps_the_first_clip_with_the_least_squared_error():
    """By hand per group: every clip c of CLIPS scales both ends of the range (lo = c * min,
    hi = c * max, 15 steps between), codes round and clamp to 0..15; the group keeps the first
    clip whose reconstruction has the least squared error."""
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(4)) ** 3  # [out, in]: heavy tails
    codes, scale, low = quant.int4_groups(w)
    chosen = []
    for row in range(8):
        for g in range(2):
            group = w[row, g * quant.GROUP:(g + 1) * quant.GROUP]
            best = None
            for clip in quant.CLIPS:
                lo, hi = float(group.min()) * clip, float(group.max()) * clip
                s = max((hi - lo) / 15, 1e-8)
                c = ((group - lo) / s).round().clamp(0, 15)
                error = float((c * s + lo - group).square().sum())
                if best is None or error < best[0]:
                    best = (error, clip, lo, s, c)
            _, clip, lo, s, c = best
            chosen.append(clip)
            assert low[row, g].item() == pytest.approx(lo, rel=1e-6, abs=1e-7), (row, g)
            assert scale[row, g].item() == pytest.approx(s, rel=1e-6), (row, g)
            assert torch.equal(codes[row, g], c), (row, g)
    assert set(chosen) == {1.0, 0.95}, chosen  # the clipped range fits some groups best


def test_int4_groups_are_the_same_whatever_the_row_chunks():
    w = torch.randn(37, 96, generator=torch.Generator().manual_seed(2)) * 0.02  # [out, in]
    whole = quant.int4_groups(w, rows=37)
    for rows in (1, 7, 256):
        assert all(torch.equal(a, b) for a, b in zip(quant.int4_groups(w, rows=rows), whole, strict=True))


def test_int4_kernel_computes_the_dequantized_weights_on_bfloat16_activations():
    """The kernel's layout (zero = low + 8 * scale) reproduces the dequantized weights, with the
    activations and the scales rounded to bfloat16 (KERNEL_DTYPE) and the output rounded once."""
    torch.manual_seed(1)
    linear = nn.Linear(64, 32, bias=False)
    codes, scale, low = quant.int4_groups(linear.weight.detach())
    bf = lambda t: t.bfloat16().float()  # noqa: E731
    dequantized = ((codes - 8) * bf(scale)[..., None] + bf(low + 8 * scale)[..., None]).reshape(32, 64)
    x = torch.randn(4, 64)
    got = quant.Int4Linear(linear)(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, bf(bf(x) @ dequantized.T), rtol=0, atol=1e-6)


@pytest.mark.parametrize("cls", [quant.Int4Linear, quant.Int8Linear])
def test_a_float32_drafts_quantized_layers_run_on_bfloat16_activations(cls):
    """On float32 activations torch's CPU kernels take a slow path (docs/benchmarks.md): the
    layer casts to bfloat16 around the kernel, so a float32 input gives the bfloat16 input's
    output, in float32."""
    torch.manual_seed(3)
    layer = cls(nn.Linear(64, 48, bias=False))
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        got, via_bf16 = layer(x), layer(x.bfloat16())
    assert got.dtype == torch.float32 and via_bf16.dtype == torch.bfloat16
    assert torch.equal(got, via_bf16.float())



@pytest.mark.parametrize("cls", [quant.Int4Linear, quant.Int8Linear])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_quantized_layer_takes_non_contiguous_inputs_as_nn_linear_does(cls, dtype):
    """torch's int4 / int8 kernels refuse a non-contiguous input ("expect A to be contiguous"),
    which nn.Linear takes: a transposed view, rows a stride apart, one row broadcast."""
    torch.manual_seed(5)
    layer = cls(nn.Linear(64, 48))
    views = {"transposed": torch.randn(1, 64, 4).to(dtype).transpose(1, 2),  # [1, 4, 64]
             "every other row": torch.randn(8, 64).to(dtype)[::2],  # [4, 64]
             "broadcast": torch.randn(1, 1, 64).to(dtype).expand(1, 4, 64)}  # [1, 4, 64]
    with torch.no_grad():
        for name, x in views.items():
            assert not x.is_contiguous()
            assert torch.equal(layer(x), layer(x.contiguous())), name

def test_shapes_the_int4_kernel_cannot_take_fall_back_to_int8():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 7))  # 48 inputs: not a multiple of 32
    model.device, model.dtype = torch.device("cpu"), torch.float32
    assert quant.apply(model, "auto") == "int4 weights in 1 of 2 layers, int8 in 1"  # not all int4
    assert isinstance(model[0], quant.Int4Linear) and isinstance(model[1], quant.Int8Linear)


def test_a_gpt2_drafts_label_counts_its_conv1d_layers_as_dense():
    """GPT-2's attention and MLP matmuls are transformers' Conv1D, not nn.Linear: only lm_head is
    quantized, and the name says so rather than "(int4 weights)"."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=128,
                                       n_positions=32, tie_word_embeddings=False)).eval()
    assert quant.apply(model, "int4") == "int4 weights in 1 of 5 layers, dense in 4"
    assert isinstance(model.lm_head, quant.Int4Linear)


def test_widths_the_int8_kernel_cannot_take_stay_dense():
    """torch's int8 kernel on 24 inputs returned 3.5e37 for one row and crashed the process for
    two: a custom draft of hidden size 24 segfaulted the app in its warm-up run."""
    model = nn.Sequential(nn.Linear(64, 24), nn.Linear(24, 16))  # 24 inputs: no int4, no int8
    model.device, model.dtype = torch.device("cpu"), torch.float32
    x = torch.randn(2, 64)
    want = model(x)
    assert quant.apply(model, "int4") == "int8 weights in 1 of 2 layers, dense in 1"
    assert isinstance(model[0], quant.Int8Linear) and type(model[1]) is nn.Linear  # 24 outputs: int8
    assert torch.isfinite(model(x)).all() and torch.allclose(model(x), want, atol=0.1)


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


def test_only_a_cpu_draft_in_bfloat16_or_float32_is_quantized():
    model = nn.Linear(64, 32)
    model.device, model.dtype = torch.device("cpu"), torch.bfloat16
    assert quant.wanted(model, "auto") == 4 and quant.wanted(model, "int8") == 8
    model.device, model.dtype = torch.device("cuda"), torch.float32  # (only read: nothing runs there)
    assert quant.wanted(model, "auto") is None
    with pytest.raises(ValueError, match="needs the draft on CPU"):
        quant.wanted(model, "int8")


def test_a_draft_no_kernel_could_take_has_no_weights_label():
    model = nn.Sequential(nn.Linear(24, 8), nn.Linear(8, 24))  # 24 and 8 inputs: neither kernel
    model.device, model.dtype = torch.device("cpu"), torch.float32
    assert quant.apply(model, "int4") is None and type(model[0]) is nn.Linear
    assert quant.label({"dense": 3}) is None and quant.label({}) is None
    assert quant.label({"int8": 2}) == "int8 weights"


def test_the_shared_pair_runs_an_int4_draft(pair):
    """The engine's exactness tests use this pair, so they cover the quantized draft."""
    assert "int4 weights" in pair.draft_name
    assert any(isinstance(m, quant.Int4Linear) for m in pair.draft.modules())


def small_model():
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.Linear(32, 16))
    model.device, model.dtype = torch.device("cpu"), torch.float32
    return model


def layers(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_int4_codes_are_kept_and_read_back_into_the_same_layers(tmp_path, monkeypatch):
    """The clipping search runs once per draft: a later load reads its codes file and builds the
    same layers bit for bit; int8 fallbacks (48 inputs) are not in it."""
    import copy

    base = small_model()
    path = quant.codes_file(tmp_path)
    first = copy.deepcopy(base)
    assert quant.apply(first, "int4", path) == "int4 weights in 2 of 3 layers, int8 in 1"
    assert path.is_file()
    from safetensors.torch import load_file

    assert sorted(load_file(path)) == ["0.codes", "0.low", "0.scale", "3.codes", "3.low", "3.scale"]

    def no_search(w):
        raise AssertionError("the codes file holds these groups")

    monkeypatch.setattr(quant, "int4_groups", no_search)
    second = copy.deepcopy(base)
    quant.apply(second, "int4", path)
    want, got = layers(first), layers(second)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    x = torch.randn(3, 64)
    assert torch.equal(first(x), second(x))


@pytest.mark.parametrize("damage", ["garbage", "other_shapes", "other_dtype", "missing_layer"])
def test_a_damaged_or_foreign_codes_file_is_recomputed_and_rewritten(tmp_path, damage, caplog):
    import copy

    from safetensors.torch import load_file, save_file

    base = small_model()
    path = quant.codes_file(tmp_path)
    fresh = copy.deepcopy(base)
    quant.apply(fresh, "int4")  # no file: the reference
    if damage == "garbage":
        path.write_bytes(b"not a safetensors file")
    else:
        quant.apply(copy.deepcopy(base), "int4", path)
        tensors = load_file(path)
        if damage == "other_shapes":
            tensors["0.codes"] = tensors["0.codes"][:, :8].contiguous()
        elif damage == "other_dtype":  # int8 codes: >> 4 keeps the sign of a code of 8 or more
            tensors["0.codes"] = tensors["0.codes"].view(torch.int8)
        else:
            tensors = {k: v for k, v in tensors.items() if not k.startswith("3.")}
        save_file(tensors, path)
    model = copy.deepcopy(base)
    quant.apply(model, "int4", path)
    want, got = layers(fresh), layers(model)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert sorted(load_file(path)) == ["0.codes", "0.low", "0.scale", "3.codes", "3.low", "3.scale"]
    assert load_file(path)["0.codes"].dtype == torch.uint8
    assert (damage == "garbage") == ("ignoring the int4 codes" in caplog.text)


def test_an_unwritable_codes_folder_only_costs_the_next_load(tmp_path, caplog):
    model = small_model()
    quant.apply(model, "int4", quant.codes_file(tmp_path / "missing-folder"))
    assert isinstance(model[0], quant.Int4Linear) and "could not keep the int4 codes" in caplog.text
    assert not list(tmp_path.iterdir())


def test_a_new_methods_codes_file_replaces_the_old_one(tmp_path):
    old = tmp_path / "int4-000000000000.safetensors"
    old.write_bytes(b"an earlier method's codes")
    quant.apply(small_model(), "int4", quant.codes_file(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == [quant.codes_file(tmp_path).name]


def test_the_int4_codes_are_as_readable_as_the_models_own_files(tmp_path):
    """safetensors writes owner-only (0600): the codes file kept beside a cache another user reads
    (a Docker image's build) could not be read there, and each load quantized again."""
    import os

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "config.json").chmod(0o644)
    old = os.umask(0o022)
    try:
        quant.apply(small_model(), "int4", quant.codes_file(tmp_path))
    finally:
        os.umask(old)
    assert quant.codes_file(tmp_path).stat().st_mode & 0o777 == 0o644
