"""Dense layers on CPU through oneDNN's float32 inner product where torch's default is slow.

torch sends a float32 CPU matmul to MKL's sgemm. On the AMD EPYC (AVX2) this project runs on,
that takes a slow path for a few rows: on the target's 8960x1536 layer, 1 / 2 / 5 / 17 / 65 rows
took 6.0 / 12.1 / 20.8 / 24.0 / 45.3 ms, against 3.0 / 7.8 / 7.4 / 9.5 / 18.9 ms through oneDNN
(docs/benchmarks.md, "Dense layers through oneDNN"). The weights, the float32 arithmetic and
the outputs (to float32 rounding, as for any other kernel or width) are the same: the model is
still the model, and greedy identity is checked against it (tests/test_dense.py).

bfloat16 on a CPU without bf16 instructions (AVX2) is compute-bound from a few rows: a prompt
costs about 0.15 s a token on the embedded target. A routed bfloat16 layer therefore reads a
prompt's head (all but its last token, PROMPT_ROWS tokens or more) with the float32 kernel on
float32 copies of its weights, made for that call; every other pass keeps torch's bfloat16
kernel. Only plain nn.Linear layers on the CPU, in float32 or bfloat16 and of at least MIN_WEIGHTS
weights, are routed.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn

# A oneDNN call costs about 75 us more than torch's on a tiny layer. Here they broke even near
# 256x1536 (393K weights: 0.16 ms for 5 rows either way); oneDNN took 0.78x the time at 896x896
# and half from 4864x896 up. So the embedded pair's MLPs, heads and q/o projections are routed,
# their k/v projections and the tests' tiny models are not.
MIN_WEIGHTS = 1 << 19
# A bfloat16 layer takes the float32 kernel only inside reading_prompt(), where specviz.lm's
# CachedLM reads a prompt's head (all but its last token) of PROMPT_ROWS tokens or more, in a pass
# of its own: a prompt of PROMPT_ROWS + 1 tokens or more. Every other pass, whatever its width
# (the engine's rounds, the target alone's steps), stays on torch's bfloat16 kernel, so both read
# the generated positions alike. Reading a prompt of 16 / 32 / 48 / 64 / 128 tokens on the
# embedded target took 2.4 / 4.9 / 7.0 / 9.1 / 18.7 s on torch's kernel, 3.8 / 4.5 / 5.0 / 5.4 /
# 6.8 s so (the weights' float32 copies cost about 3 s a pass). CPUs with bf16 instructions keep
# torch's kernel throughout.
PROMPT_ROWS = 40
_reading = threading.local()


@contextlib.contextmanager
def reading_prompt():
    """Routed bfloat16 layers use the float32 kernel within (specviz.lm.CachedLM's prompt reads)."""
    _reading.prompt = True
    try:
        yield
    finally:
        _reading.prompt = False


def available() -> bool:
    """Whether this torch has oneDNN on the CPU, switched on, with the inner-product op."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and \
        hasattr(torch.ops.mkldnn, "_linear_pointwise")


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX), where torch's bf16
    kernel is fast at every width (an earlier machine: 17 rows for 1.3x one row)."""
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in
               ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def reads_prompts_apart(model: nn.Module) -> bool:
    """Whether some layer of the model reads prompts on another kernel than its steps (a routed
    bfloat16 layer): specviz.lm.CachedLM then reads a prompt in a pass of its own."""
    return any(type(m) is OneDNNLinear and m.weight.dtype == torch.bfloat16 for m in model.modules())


def _inner_product(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    # oneDNN reads the bias as if contiguous (a strided view's values came out 1e28 off)
    return torch.ops.mkldnn._linear_pointwise(x, w, None if b is None else b.contiguous(), "none", [], "")


class OneDNNLinear(nn.Linear):
    """nn.Linear on oneDNN's float32 inner product: always for float32 weights; for bfloat16 ones
    while reading a prompt (reading_prompt), on float32 copies made for the call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        w, b = self.weight, self.bias
        if w.device.type != "cpu" or x.device.type != "cpu" or x.dtype != w.dtype:
            return super().forward(x)  # moved to another device after routing
        if w.dtype == torch.float32:
            return _inner_product(x, w, b)
        if w.dtype == torch.bfloat16 and getattr(_reading, "prompt", False):
            # bf16 products are exact in float32 and both kernels sum in float32: the same sums
            # in another order, rounded to bfloat16 once at the end, as torch's kernel does
            return _inner_product(x.float(), w.float(), None if b is None else b.float()).to(w.dtype)
        return super().forward(x)


def route(model: nn.Module) -> int:
    """Route the model's CPU nn.Linear layers of at least MIN_WEIGHTS weights through oneDNN in
    place (float32 ones; bfloat16 ones too where the CPU has no bf16 instructions); how many were.

    The layers keep their parameters (tied weights stay tied, state_dict keys are unchanged):
    only their class changes, to OneDNNLinear."""
    if not available():
        return 0
    dtypes = (torch.float32,) if native_bf16() else (torch.float32, torch.bfloat16)
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype in dtypes \
                and module.weight.device.type == "cpu" and module.weight.numel() >= MIN_WEIGHTS:
            module.__class__ = OneDNNLinear
            count += 1
    return count
