import pytest
import torch

from specviz.sampling import SamplingParams, process


def test_greedy_is_one_hot_argmax():
    probs = process(torch.tensor([[0.1, 3.0, -1.0]]), SamplingParams())
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_temperature_top_k_top_p_exact():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(process(logits, SamplingParams(1.0)), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(process(logits, SamplingParams(1.0, top_k=2)),
                          torch.tensor([0.625, 0.375, 0, 0]))
    # top_p=0.8: 0.5 + 0.3 reaches it, so the rest is dropped.
    assert torch.allclose(process(logits, SamplingParams(1.0, top_p=0.8)),
                          torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(process(logits, SamplingParams(1.0, top_p=0.81)),
                          torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    half = process(logits, SamplingParams(0.5))
    assert torch.allclose(half, torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"temperature": float("nan")}, "temperature"),
])
def test_bad_settings_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
