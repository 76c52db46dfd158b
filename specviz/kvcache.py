"""The KV caches a CachedLM keeps (lm.py), and their rollback.

A cache is dynamic (transformers' DynamicCache: its tensors grow, and a rollback crops them) or
static (StaticCache: buffers of a fixed length, where a rollback moves the length the next write
starts at, with no copy). Either way every attention layer keeps every position (full_layers): a
sliding-window layer would drop keys that a rollback past its window needs again.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import (
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
)


def crop(cache, remove: int) -> None:
    """Remove the last -remove positions (remove <= 0) from every layer of a cache.

    transformers before 5.24 (e.g. 5.17) give static layers no crop; theirs, as 5.24's, is just
    moving the length the next write starts at, which is done here by hand.

    Under inference mode whoever calls it: on CUDA a static layer moves its length tensor to the
    device inside the first forward (an inference-mode pass), which makes it an inference tensor,
    and an in-place update of one outside inference mode raises (seen on an H200: the engine's
    rollback after each round, and gpucheck's after each timed pass, both outside it).

    A static cache's layers keep their lengths in device tensors: one multi-tensor subtraction
    moves them all (on a GPU one kernel, where a loop launched one a layer)."""
    assert remove <= 0, remove
    with torch.inference_mode():
        if remove and all(type(layer) is StaticLayer and isinstance(layer.cumulative_length, torch.Tensor)
                          for layer in cache.layers):
            written = [layer.cumulative_length for layer in cache.layers
                       if getattr(layer, "is_initialized", True)]  # (as crop_layer: unwritten stay at 0)
            if written:
                torch._foreach_sub_(written, -remove)  # every layer's length in one launch, not one each
            return
        if all(hasattr(layer, "crop") for layer in cache.layers):
            cache.crop(remove)
            return
        for layer in cache.layers:
            crop_layer(layer, remove)


def crop_layer(layer, remove: int) -> None:
    """crop for one layer (remove <= 0)."""
    if hasattr(layer, "crop"):
        layer.crop(remove)
        return
    if not hasattr(layer, "cumulative_length"):
        raise ValueError(f"{type(layer).__name__} cache layers cannot roll back in this "
                         "transformers: upgrade to 5.24 or later")
    if remove and getattr(layer, "is_initialized", True):
        layer.cumulative_length.sub_(-remove)


def truncate(cache, length: int) -> None:
    """Every layer of a cache cut back to `length` positions, each by what it holds beyond it: a
    step that failed part-way has written some layers and not others. (Inference mode: crop.)"""
    with torch.inference_mode():
        for layer in cache.layers:
            extra = int(layer.get_seq_length()) - length
            if extra > 0:
                crop_layer(layer, -extra)


def full_layers(cache, max_len: int | None = None):
    """cache with each sliding-window layer made a full one (max_len: a static cache's length), in
    place. A sliding-window layer drops the keys that leave its window, so it cannot be cropped back
    past it; a full layer keeps them, and the model still applies its window: transformers 5.24
    masks the keys a sliding layer may not see by their positions (masking_utils), whatever the
    cache holds. The memory is a full-attention cache's, the logits the sliding cache's (the same
    to 6e-6 in float32 on tiny Mistral, Gemma 2 and Gemma 3 models, fed in chunks with rollbacks
    past a 16-token window)."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:
            cache.layers[i] = DynamicLayer()
        elif type(layer) is StaticSlidingWindowLayer:
            cache.layers[i] = StaticLayer(max_cache_len=max_len or layer.max_cache_len)
    return cache


def dynamic_cache(model):
    """A DynamicCache for the model whose every attention layer keeps every position (full_layers)."""
    return full_layers(DynamicCache(config=model.config))


def static_cache(model, max_len: int):
    """A StaticCache of max_len positions whose every attention layer keeps them all (full_layers)."""
    return full_layers(StaticCache(config=model.config, max_cache_len=max_len), max_len)
