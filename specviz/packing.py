"""How the compiled path reshapes a model's layers: packed projections, grouped attention, and
nested compile regions.

Packed projections: each layer's q/k/v as one matrix product, and gate/up as one.

At batch 1 a decoder layer's matrix products are too small to keep an H200 busy: q, k and v of
the embedded target took 4.9-6.7 us each for 0.8-4.7 MB of weights (a launch's latency, not the
bytes), gate and up 10.3 us each (docs/benchmarks.md, "Direct capture of the compiled step").
Packing them reads the same bytes in two products instead of five. The model stays transformers'
own: the attention's forward receives the packed product in place of its input, and its q_proj,
k_proj and v_proj become slices of it (the attention reads its input only through them); the MLP
becomes the same down(act(gate) * up) over one product.

Grouped attention: under torch.compile transformers' sdpa attention gives each query head its own
copy of its key/value head's cache (repeat_kv: two copy kernels a layer, over the whole static
cache), because torch's grouped-query attention refuses a mask on CUDA. `grouped` instead stacks
the query heads that share a key/value head into one head of g * n rows, and repeats the mask's
n rows g times: the same attention, no copy of the cache.

Packing changes the model in place (its weights are moved, not copied: memory stays the same), so
every later pass of it, eager or not, runs packed. The products are the same sums in another
kernel's order: logits agree to float rounding (tests/test_packing.py), not bit for bit.
"""

from __future__ import annotations

import itertools
import types

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

# Architectures whose attention reads its input only through q_proj, k_proj and v_proj, and whose
# MLP is down_proj(act_fn(gate_proj(x)) * up_proj(x)).
PACKABLE = {"qwen2", "qwen3", "llama", "mistral"}


GROUPED = "specviz_grouped"  # the attention implementation pack sets where the model used sdpa


def grouped(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
            **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa attention over query [b, H, n, D] and key, value [b, KV, L, D], with each key/value
    head's g = H / KV query heads as one head of g * n rows (attention_mask [b, 1, n, L]: the
    same for every head). Without a mask (transformers' own causal prompt passes) or groups:
    transformers' sdpa attention. Returns ([b, n, H, D], None), as transformers' does."""
    b, heads, n, dim = query.shape
    kv = key.shape[1]
    g = heads // kv
    if g == 1 or attention_mask is None or attention_mask.shape[1] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    rows = query.reshape(b, kv, g * n, dim)  # row j * n + t: query head kv * g + j at token t
    mask = attention_mask.repeat(1, 1, g, 1)  # [b, 1, g * n, L]: the n rows once per query head
    out = nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, n, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED, grouped)
AttentionMaskInterface.register(GROUPED, sdpa_mask)


class Slice(nn.Module):
    """x[..., start:stop]: one projection's share of a packed product."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., self.start:self.stop]


class PackedAttention(nn.Module):
    """The layer's own attention, fed qkv(x) [.., q + k + v] instead of x [.., d]."""

    def __init__(self, attention: nn.Module, qkv: nn.Linear):
        super().__init__()
        self.attention, self.qkv = attention, qkv

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        return self.attention(self.qkv(hidden_states), *args, **kwargs)


class PackedMLP(nn.Module):
    def __init__(self, gate_up: nn.Linear, down_proj: nn.Linear, act_fn):
        super().__init__()
        self.gate_up, self.down_proj, self.act_fn = gate_up, down_proj, act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [.., intermediate] each
        return self.down_proj(self.act_fn(gate) * up)


def concatenated(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the linears' outputs side by side; their weights are freed."""
    first = linears[0]
    bias = first.bias is not None
    packed = nn.Linear(first.in_features, sum(m.out_features for m in linears), bias=bias,
                       device="meta")
    packed.weight = nn.Parameter(torch.cat([m.weight.detach() for m in linears]), requires_grad=False)
    if bias:
        packed.bias = nn.Parameter(torch.cat([m.bias.detach() for m in linears]), requires_grad=False)
    for m in linears:  # the originals' storage goes now, not when the model does
        m.weight = m.bias = None
    return packed


def packable(model) -> bool:
    """Whether pack would change model: a plain (unquantized, unrouted) layer stack of an
    architecture in PACKABLE, not packed yet."""
    if model.config.model_type not in PACKABLE:
        return False
    for layer in model.base_model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if isinstance(attn, PackedAttention):
            return False
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")] + \
                  [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(m) is nn.Linear for m in linears) or not hasattr(mlp, "act_fn"):
            return False
        if len({(m.bias is None) for m in linears[:3]}) > 1 or \
                mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:  # gate_up: no bias
            return False
    return True


@torch.no_grad()
def pack(model) -> bool:
    """Pack every layer's q/k/v and gate/up of model in place, and give its sdpa attention
    `grouped` query heads; False (unchanged) where not packable."""
    if not packable(model):
        return False
    for layer in model.base_model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        qkv = concatenated([attn.q_proj, attn.k_proj, attn.v_proj])
        edges = [0, *itertools.accumulate(sizes)]
        attn.q_proj, attn.k_proj, attn.v_proj = (Slice(a, b) for a, b in itertools.pairwise(edges))
        layer.self_attn = PackedAttention(attn, qkv)
        layer.mlp = PackedMLP(concatenated([mlp.gate_proj, mlp.up_proj]), mlp.down_proj, mlp.act_fn)
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(GROUPED)
    return True


def nest(model) -> bool:
    """Mark each decoder layer's forward as one nested compile region
    (torch.compiler.nested_compile_region): torch.compile then traces and compiles one layer and
    stamps its code out for the others, instead of tracing all of them, for each shape. A no-op
    outside torch.compile. In place, once; False where the model has no stack of layers of one
    class, or this torch no such regions. (On this CPU's inductor a 28-layer step's first
    compile took 42 s against 72 s, its second width 24.5 s against 70 s: docs/benchmarks.md.)"""
    region = getattr(torch.compiler, "nested_compile_region", None)
    layers = getattr(model.base_model, "layers", None)
    if region is None or not layers or getattr(layers[0].forward, "_specviz_nested", False):
        return False
    if len({type(layer) for layer in layers}) > 1:  # one region runs one class's forward
        return False
    forward = region(type(layers[0]).forward)  # one function for every layer: one region, reused
    forward._specviz_nested = True
    for layer in layers:
        layer.forward = types.MethodType(forward, layer)
    return True
