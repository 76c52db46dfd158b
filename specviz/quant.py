"""Weight-only int4 / int8 for the draft model on CPU: a quarter / half the bytes per draft pass.

The draft may be any model: the rule stays exact as long as the q that drew each token is the
q it is judged by, so a quantized draft changes only how often drafts are kept. The target is
never quantized. int8: per-output-channel symmetric scales, as in gpt-fast's int8 mode. int4:
asymmetric groups of 32 input channels with a clipping search per group (gpt-fast's int4 layout
on torch's CPU kernel); layers whose shape the int4 kernel cannot take fall back to int8. The
int4 groups can be kept in a codes file (codes_file), so the clipping search runs once per draft.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

GROUP = 32  # int4 group size along the input dimension (the finest torch's kernel takes)
CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8)  # int4: each group keeps the range that fits it best
# Both kernels run on bfloat16 activations whatever the draft's dtype: on float32 ones torch's CPU
# kernels take a slow path (a 896x4864 layer, 1 / 5 tokens: int4 5.4 / 41 ms on float32, 0.4 /
# 1.6 ms on bfloat16; dense float32 1.2 / 3.4 ms). The draft's q is still the q it is judged by.
KERNEL_DTYPE = torch.bfloat16


def _kernel_input(x: torch.Tensor, in_features: int) -> torch.Tensor:
    # the kernels refuse a non-contiguous input (a view nn.Linear takes); .to keeps a view's strides
    return x.reshape(-1, in_features).to(KERNEL_DTYPE).contiguous()  # [tokens, in]


def _output(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)  # [..., out]
    return out if bias is None else out + bias


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # [out, in]
        scales = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [out]
        self.register_buffer("weight", (w / scales[:, None]).round().clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(KERNEL_DTYPE))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _kernel_input(x, self.in_features)
        return _output(torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales), x, self.bias)


def int4_groups(w: torch.Tensor, rows: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] -> codes [out, in/G, G] in 0..15, scale and low [out, in/G]: w ~ codes*scale + low.

    Each group keeps the first clip of CLIPS with the least squared error. Done `rows` output
    rows at a time, so each clip's work stays in cache: the 0.5B draft's int4 load went from
    27-32 s to 10-15 s here (docs/benchmarks.md)."""
    codes = torch.empty(w.shape[0], w.shape[1] // GROUP, GROUP)  # [out, in/G, G]
    scale, low = torch.empty(codes.shape[:2]), torch.empty(codes.shape[:2])  # [out, in/G]
    for start in range(0, w.shape[0], rows):
        part = slice(start, start + rows)
        groups = w[part].reshape(-1, w.shape[1] // GROUP, GROUP)  # [r, in/G, G]
        lows, scales, errors = [], [], []
        for clip in CLIPS:
            lo, hi = groups.amin(-1) * clip, groups.amax(-1) * clip  # [r, in/G]
            s = ((hi - lo) / 15).clamp_min(1e-8)
            c = ((groups - lo[..., None]) / s[..., None]).round().clamp(0, 15)
            errors.append((c * s[..., None] + lo[..., None] - groups).square().sum(-1))
            lows.append(lo)
            scales.append(s)
        best = torch.stack(errors).argmin(0, keepdim=True)  # [1, r, in/G]: the first least error
        low[part], scale[part] = torch.stack(lows).gather(0, best)[0], torch.stack(scales).gather(0, best)[0]
        codes[part] = ((groups - low[part, :, None]) / scale[part, :, None]).round().clamp(0, 15)
    return codes, scale, low


class Int4Linear(nn.Module):
    def __init__(self, linear: nn.Linear, groups: tuple[torch.Tensor, ...] | None = None):
        """groups: int4_groups of this layer's weight, when already known (a codes file)."""
        super().__init__()
        codes, scale, low = groups or int4_groups(linear.weight.detach().float())  # w [out, in]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.reshape(linear.weight.shape).to(torch.int32), 8)
        # The kernel computes (code - 8) * scale + zero, so zero = low + 8 * scale.
        scales_and_zeros = torch.stack([scale, low + 8 * scale], dim=-1)  # [out, in/G, 2]
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros",
                             scales_and_zeros.transpose(0, 1).contiguous().to(KERNEL_DTYPE))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % GROUP == 0 and linear.out_features % 16 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _kernel_input(x, self.in_features)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, GROUP, self.scales_and_zeros)
        return _output(out, x, self.bias)


def supported(model) -> bool:
    return model.device.type == "cpu" and model.dtype in (torch.bfloat16, torch.float32)


def codes_file(folder: Path) -> Path:
    """Where a draft's int4 groups are kept in its (content-addressed) cache folder: the name
    changes with the method (GROUP, CLIPS, the code layout), so an older file is never read."""
    method = hashlib.sha256(repr((GROUP, CLIPS, "nibbles-v1")).encode()).hexdigest()[:12]
    return folder / f"int4-{method}.safetensors"


def _read_codes(path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors, or {} when it is missing or unreadable (then it is computed again)."""
    from safetensors.torch import load_file

    try:
        return load_file(path) if path.is_file() else {}
    except Exception as e:  # a truncated or foreign file: recompute rather than fail the load
        log.warning("ignoring the int4 codes in %s (%s); quantizing again", path, e)
        return {}


def _stored(name: str, linear: nn.Linear, stored: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
    """name's (codes [out, in/G, G] float, scale, low) from a codes file's tensors, if it holds
    them in this layer's shape."""
    out, groups = linear.out_features, linear.in_features // GROUP
    want = {"codes": ((out, linear.in_features // 2), torch.uint8),
            "scale": ((out, groups), torch.float32), "low": ((out, groups), torch.float32)}
    found = {part: stored.get(key) for part, key in zip(want, _packed_names(name), strict=True)}
    if any(t is None or (tuple(t.shape), t.dtype) != want[part] for part, t in found.items()):
        return None
    packed = found["codes"]  # [out, in/2] uint8: two 4-bit codes a byte
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(out, groups, GROUP)
    return codes.float(), found["scale"], found["low"]


def _packed_names(name: str) -> tuple[str, str, str]:
    return f"{name}.codes", f"{name}.scale", f"{name}.low"


def _packed(name: str, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> dict:
    """int4_groups output as a codes file's tensors: two 4-bit codes a byte."""
    pairs = codes.to(torch.uint8).reshape(codes.shape[0], -1, 2)  # [out, in/2, 2]
    packed = (pairs[..., 0] | pairs[..., 1] << 4).contiguous()  # [out, in/2]
    return dict(zip(_packed_names(name), (packed, scale.contiguous(), low.contiguous()), strict=True))


def _save_codes(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write a temp file, then rename; a failure only costs the next load its clipping search."""
    from safetensors.torch import save_file

    from .embedded import readable_as

    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, temp)
        if (config := path.parent / "config.json").exists():  # as readable as the model's own files
            readable_as(temp, config)
        os.replace(temp, path)
        for old in path.parent.glob("int4-*.safetensors"):  # an earlier method's file
            if old != path:
                old.unlink(missing_ok=True)
    except Exception as e:  # a full disk, a read-only or missing folder: load on without it
        temp.unlink(missing_ok=True)
        log.warning("could not keep the int4 codes in %s (%s); the next load quantizes again", path, e)


@torch.no_grad()
def quantize_(model, bits: int = 4, codes: Path | None = None) -> dict[str, int]:
    """Replace the model's nn.Linear layers (lm_head included) in place. Returns how many matmul
    layers are now of each kind: {"int4": .., "int8": .., "dense": ..} (kinds with none left out;
    dense: the widths no kernel takes, and GPT-2's Conv1D layers, which stay as they are).

    codes: a codes_file for this model's weights. The int4 groups are read from it when it holds
    them (the clipping search is most of a load), else computed and written there."""
    stored = _read_codes(codes) if codes is not None and bits == 4 else {}
    kept: dict[str, torch.Tensor] = {}  # every int4 layer's groups, packed for the codes file
    computed = False
    counts: dict[str, int] = {}
    for module_name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child).__name__ == "Conv1D":  # transformers' GPT-2 layers: not nn.Linear
                counts["dense"] = counts.get("dense", 0) + 1
            if isinstance(child, nn.Linear):  # dense.OneDNNLinear too
                name = f"{module_name}.{child_name}".lstrip(".")
                if bits == 4 and Int4Linear.fits(child):
                    groups = _stored(name, child, stored)
                    if groups is None:
                        groups, computed = int4_groups(child.weight.detach().float()), True
                        kept.update(_packed(name, *groups))
                    else:
                        kept.update({key: stored[key] for key in _packed_names(name)})
                    layer, kind = Int4Linear(child, groups), "int4"
                elif child.in_features % 16 == 0:  # the int8 kernel's rows: other widths corrupt
                    layer, kind = Int8Linear(child), "int8"  # its output or crash the process
                else:
                    layer, kind = child, "dense"
                setattr(module, child_name, layer)
                counts[kind] = counts.get(kind, 0) + 1
    if codes is not None and computed:
        _save_codes(codes, kept)
    return {kind: counts[kind] for kind in ("int4", "int8", "dense") if kind in counts}


def label(counts: dict[str, int]) -> str | None:
    """What a draft's name says of its weights: "int4 weights" when every matmul layer is int4,
    else each kind's share ("int4 weights in 120 of 169 layers, int8 in 48, dense in 1")."""
    kinds = [kind for kind in ("int4", "int8", "dense") if counts.get(kind)]
    if kinds in ([], ["dense"]):  # no layer took a quantized kernel
        return None
    if len(kinds) == 1:
        return f"{kinds[0]} weights"
    first, *rest = kinds
    return ", ".join([f"{first} weights in {counts[first]} of {sum(counts.values())} layers",
                      *(f"{kind} in {counts[kind]}" for kind in rest)])


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
                         "use draft_quant='none' (--draft-quant none) on this device")
    return BITS[mode]


def apply(model, mode: str, codes: Path | None = None) -> str | None:
    """Quantize the draft in place if mode asks for it; its label (see label) if any layer was.
    codes: see quantize_."""
    bits = wanted(model, mode)
    if bits is None:
        return None
    return label(quantize_(model, bits, codes))
