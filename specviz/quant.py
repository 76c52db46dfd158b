"""Weight-only int8 for the draft model on CPU: half the bytes read per draft pass.

The draft may be any model: the rule stays exact as long as the q that drew each token is the
q it is judged by, so a quantized draft changes only how often drafts are kept. The target is
never quantized. Per-output-channel symmetric scales, as in gpt-fast's int8 mode.
"""

from __future__ import annotations

import torch
from torch import nn


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # [out, in]
        scales = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [out]
        self.register_buffer("weight", (w / scales[:, None]).round().clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [tokens, in]
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)  # [tokens, out]
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def supported(model) -> bool:
    return model.device.type == "cpu" and model.dtype in (torch.bfloat16, torch.float32)


@torch.no_grad()
def quantize_int8_(model) -> int:
    """Replace the model's nn.Linear layers (lm_head included) in place; returns how many."""
    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, Int8Linear(child))
                count += 1
    return count


MODES = ("auto", "none", "int8")


def wanted(model, mode: str) -> bool:
    """Whether mode asks to quantize this draft ("auto": when supported); ValueError if it can't."""
    if mode not in MODES:
        raise ValueError(f"draft_quant must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none" or (mode == "auto" and not supported(model)):
        return False
    if not supported(model):
        raise ValueError("draft_quant='int8' needs the draft on CPU in bfloat16 or float32: "
                         "use draft_quant='none' on this device")
    return True


def apply(model, mode: str) -> bool:
    """Quantize the draft in place if mode asks for it; True if it was quantized."""
    if wanted(model, mode):
        quantize_int8_(model)
        return True
    return False
