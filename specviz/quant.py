"""Weight-only int4 / int8 for the draft model on CPU: a quarter / half the bytes per draft pass.

The draft may be any model: the rule stays exact as long as the q that drew each token is the
q it is judged by, so a quantized draft changes only how often drafts are kept. The target is
never quantized. int8: per-output-channel symmetric scales, as in gpt-fast's int8 mode. int4:
asymmetric groups of 32 input channels with a clipping search per group (gpt-fast's int4 layout
on torch's CPU kernel); layers whose shape the int4 kernel cannot take fall back to int8.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # int4 group size along the input dimension (the finest torch's kernel takes)
CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8)  # int4: each group keeps the range that fits it best


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


def int4_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] -> codes [out, in/G, G] in 0..15, scale and low [out, in/G]: w ~ codes*scale + low."""
    groups = w.reshape(w.shape[0], -1, GROUP)  # [out, in/G, G]
    best = None
    for clip in CLIPS:
        low, high = groups.amin(-1) * clip, groups.amax(-1) * clip  # [out, in/G]
        scale = ((high - low) / 15).clamp_min(1e-8)
        codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
        error = (codes * scale[..., None] + low[..., None] - groups).square().sum(-1)
        if best is None:
            best = [error, codes, scale, low]
            continue
        better = error < best[0]
        best = [torch.where(better, error, best[0]), torch.where(better[..., None], codes, best[1]),
                torch.where(better, scale, best[2]), torch.where(better, low, best[3])]
    return best[1], best[2], best[3]


class Int4Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # [out, in]
        codes, scale, low = int4_groups(w)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.reshape(w.shape).to(torch.int32), 8)
        # The kernel computes (code - 8) * scale + zero, so zero = low + 8 * scale.
        scales_and_zeros = torch.stack([scale, low + 8 * scale], dim=-1)  # [out, in/G, 2]
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros",
                             scales_and_zeros.transpose(0, 1).contiguous().to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % GROUP == 0 and linear.out_features % 16 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [tokens, in]
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, GROUP,
                                                         self.scales_and_zeros)  # [tokens, out]
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def supported(model) -> bool:
    return model.device.type == "cpu" and model.dtype in (torch.bfloat16, torch.float32)


@torch.no_grad()
def quantize_(model, bits: int = 4) -> int:
    """Replace the model's nn.Linear layers (lm_head included) in place; returns how many."""
    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                int4 = bits == 4 and Int4Linear.fits(child)
                setattr(module, child_name, Int4Linear(child) if int4 else Int8Linear(child))
                count += 1
    return count


MODES = ("auto", "none", "int8", "int4")
BITS = {"int8": 8, "int4": 4, "auto": 4}


def wanted(model, mode: str) -> int | None:
    """The weight bits mode asks for this draft ("auto": int4 when supported), or None.

    ValueError if the mode is unknown or cannot run on this draft's device/dtype."""
    if mode not in MODES:
        raise ValueError(f"draft_quant must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none" or (mode == "auto" and not supported(model)):
        return None
    if not supported(model):
        raise ValueError(f"draft_quant={mode!r} needs the draft on CPU in bfloat16 or float32: "
                         "use draft_quant='none' on this device")
    return BITS[mode]


def apply(model, mode: str) -> str | None:
    """Quantize the draft in place if mode asks for it; a label ("int4 weights") if it was."""
    bits = wanted(model, mode)
    if bits is None:
        return None
    quantize_(model, bits)
    return f"int{bits} weights"
