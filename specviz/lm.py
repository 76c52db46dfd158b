"""CachedLM: the one owner of a model's KV cache, with explicit rollback.

Invariant: the cache holds exactly the key/values of `self.tokens`. `forward(ids, last)` feeds
only what the cache lacks and returns logits for the last `last` positions; `rollback(ids)`
crops the cache to the longest prefix it shares with ids, leaving at least the last id to feed.
After each engine round the target's cache holds the committed tokens minus the last.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache


class CachedLM:
    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # ids >= vocab_size are embedding padding: never produced
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        self.tokens: list[int] = []
        self.passes = 0
        self.seconds = 0.0

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def rollback(self, ids: list[int]) -> None:
        """Crop the cache to the longest common prefix of its tokens and ids[:-1]."""
        keep = 0
        limit = min(len(self.tokens), len(ids) - 1)
        while keep < limit and self.tokens[keep] == ids[keep]:
            keep += 1
        if keep < len(self.tokens):
            self.cache.crop(keep - len(self.tokens))
            self.tokens = self.tokens[:keep]
        assert self.cache_length == len(self.tokens), (self.cache_length, len(self.tokens))

    @torch.inference_mode()
    def forward(self, ids: list[int], last: int = 1) -> torch.Tensor:
        """Feed what the cache lacks of ids; return logits [last, vocab_size] (float32)."""
        self.rollback(ids[: len(ids) - last + 1])
        new = ids[len(self.tokens):]
        start = time.perf_counter()
        input_ids = torch.tensor([new], device=self.device)  # [1, len(new)]
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=last)
        logits = out.logits[0, -last:, : self.vocab_size].float()  # [last, vocab]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - start
        self.passes += 1
        self.tokens = list(ids)
        assert self.cache_length == len(self.tokens), (self.cache_length, len(self.tokens))
        return logits
