"""What a model's architecture allows, read from its config, its modules and its forward's
signature: the token ids it reads and writes, its positions, whether its cache rolls back, how a
token tree's pass gives its layers their windows, ALiBi, a static cache, the float32-refined head.
No model is run here: CachedLM (lm.py) asks these questions once, when it wraps a model."""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from . import dense

# Architectures whose logits are exactly lm_head(last hidden state): no soft-capping or scaling.
PLAIN_HEADS = {"qwen2", "qwen3", "llama", "mistral", "gpt2", "gpt_neox", "phi3", "olmo2"}


def output_rows(model) -> int:
    """How many token ids the model can produce (rows of its output projection)."""
    head = model.get_output_embeddings()
    return getattr(head, "out_features", None) or head.weight.shape[0]


def input_rows(model) -> int:
    """How many token ids the model can read (rows of its input embedding)."""
    return model.get_input_embeddings().num_embeddings


def positions(model) -> int | None:
    """The positions a model's config says it holds (None: unbounded as far as it says). MPT names
    them max_seq_len: its ALiBi table has that many key slots, and a longer run failed inside its
    forward ("The size of tensor a (257) must match the size of tensor b (256)") where
    Pair.check_length refuses it up front."""
    config = model.config
    return (getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
            or getattr(config, "max_seq_len", None))


def check_rollback(model, name: str = "the model") -> None:
    """ValueError for caches that cannot roll back at all (linear-attention or other recurrent
    layers, layers that share another's keys). Full-attention and sliding-window layers can: a
    sliding-window model's cache keeps every position (kvcache.full_layers), so it crops exactly past
    its window too."""
    for layer in DynamicCache(config=model.config).layers:
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise ValueError(f"{name} uses {type(layer).__name__} cache layers, whose state cannot be "
                             "rolled back to an earlier token: specviz needs attention models, full or "
                             "sliding-window (pick another pair)")


@functools.cache
def _takes_mask_dict(forward_class: type) -> bool:
    """Whether the model's forward takes attention_mask as a dict of masks keyed by layer type
    (transformers 5.24: Gemma 2 and 3, Cohere 2, Qwen2, ...: `isinstance(attention_mask, dict)`)."""
    try:
        return "attention_mask, dict)" in inspect.getsource(forward_class.forward)
    except (OSError, TypeError):
        return False


def tree_windows(model) -> tuple[str, int | None]:
    """How a token tree's pass gives this model's layers their windows: (how, window).

    "full": no layer slides, one ancestors-only mask. "all": every layer slides the same `window`
    (Mistral, Phi-3, Starcoder2): one mask that also hides keys `window` or more positions back.
    "split": full and sliding layers side by side (Gemma 2 and 3, Cohere 2), a model that takes a
    mask a layer type: the full layers' mask and the sliding layers' (step passes them as a dict).
    "below": any other mix (windows of several sizes, chunked attention, a model that takes one
    mask for layers of both kinds): a tree pass gives every layer the full mask, which is exact
    only while every position stays below `window`, the smallest. A 4-D mask passed to
    transformers is used as it is for every layer: the model's own window is not applied to it."""
    config = model.config.get_text_config(decoder=True)
    kinds = getattr(config, "layer_types", None)
    layers = DynamicCache(config=model.config).layers
    windows = [layer.sliding_window if type(layer) is DynamicSlidingWindowLayer else None for layer in layers]
    spans = {w for w in windows if w is not None}
    if not spans:
        return "full", None
    smallest = min(spans)
    sliding = [w is not None for w in windows]
    if kinds is not None and any(
            kind != ("sliding_attention" if slides else "full_attention")
            for kind, slides in zip(kinds, sliding, strict=False)):
        return "below", smallest  # chunked attention, or types the cache reads otherwise
    if len(spans) > 1 or smallest != getattr(config, "sliding_window", None):
        return "below", smallest
    if all(sliding):
        return "all", smallest
    if kinds is not None and _takes_mask_dict(type(model.base_model)):
        return "split", smallest
    return "below", smallest


def tree_window(model) -> int | None:
    """The positions a token tree verifies exactly below on this model (None: any): a model whose
    tree masks cannot give each layer its window (tree_windows "below") only below the smallest."""
    how, window = tree_windows(model)
    return window if how == "below" else None


@functools.cache
def _takes_position_ids(forward_class: type) -> bool:
    return "position_ids" in inspect.signature(forward_class.forward).parameters


def alibi(model) -> bool:
    """Whether the model places tokens by ALiBi biases rather than by position ids: Bloom and MPT
    (whose forwards take no position_ids), Falcon with `alibi` set. Their biases come from a 2-D
    mask (Bloom, Falcon) or from each key's slot in the cache (MPT), never from position_ids."""
    return (getattr(model.config, "alibi", False) is True
            or not all(_takes_position_ids(type(m)) for m in (model, model.base_model)))


def check_tree_model(model, name: str = "the model") -> None:
    """ValueError where the model cannot verify a token tree exactly. A tree pass (CachedLM.forward_tree)
    gives each node the position of its depth through position_ids and its ancestors through a
    4-D mask: an ALiBi model reads neither (transformers 5.24: Bloom and Falcon raised "too many
    values to unpack" building their biases from the 4-D mask; MPT biased each node by its slot in
    the cache, not its depth, and its tree rounds kept tokens the target's greedy output has not).
    Any other model whose forward takes no position_ids (Bart's, Marian's or RoFormer's decoder:
    positions counted from the cache's length) places nodes by their slots too."""
    if alibi(model):
        config = model.config
        biased = getattr(config, "alibi", False) is True or config.model_type in ("bloom", "mpt")
        how = "ALiBi biases" if biased else "its cache slots (its forward takes no position_ids)"
        raise ValueError(f"{name} ({config.model_type}) places tokens by {how}, not position "
                         "ids, so it cannot verify a token tree exactly: draft a chain (proposer 'draft', "
                         "'hybrid', 'adaptive' or 'ngram'), or pick a pair with rotary or learned positions")


def tree_refusal(model, window: int, name: str = "the model") -> str:
    """Why a token tree reaching `window` positions is refused on a model of tree_windows "below"."""
    return (f"{name} ({model.config.model_type}) has sliding-window layers whose token-tree masks this "
            f"specviz cannot build, so a token tree is exact only below its {window}-token window: draft "
            "a chain (proposer 'draft', 'hybrid', 'adaptive' or 'ngram'), or shorten the prompt or "
            "max_new_tokens")


def static_ready(model) -> bool:
    """Whether the model runs on a StaticCache in this transformers, whose every slot is a key of
    each pass. Falcon with ALiBi builds its biases over the tokens cached only (5.24: "The size of
    tensor a (77) must match the size of tensor b (11)" at its first pass); MPT's ALiBi table spans
    max_seq_len keys, fewer than a compiled slot's 1,024 or a run's last drafts past its end ("The
    size of tensor a (1024) must match the size of tensor b (256)"). Both stay on a dynamic cache.
    Bloom's biases span a static cache's every slot from transformers 5.24; before it (5.17, the
    GPU machine's) they span the tokens cached only ("The expanded size of the tensor (64) must
    match the existing size (11)" at its first static pass), so there Bloom stays dynamic too."""
    config = model.config
    falcon_alibi = config.model_type == "falcon" and getattr(config, "alibi", False)
    old_bloom = config.model_type == "bloom" and transformers_release() < (5, 24)
    return not (config.model_type == "mpt" or falcon_alibi or old_bloom)


def transformers_release() -> tuple[int, int]:
    """The installed transformers' (major, minor)."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__).release[:2]


def refinable(model) -> bool:
    # a head routed through oneDNN (dense.route, on CPUs without bf16 instructions) keeps its
    # weight and bias: the refined head reads them, not the module
    head = model.get_output_embeddings()
    return (model.dtype in (torch.bfloat16, torch.float16)
            and type(head) in (nn.Linear, dense.OneDNNLinear)
            and head.bias is None and model.config.model_type in PLAIN_HEADS
            and model.base_model is not model)
