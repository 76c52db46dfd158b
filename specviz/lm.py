"""CachedLM: the one owner of a model's KV cache, with explicit rollback.

Invariant: the cache holds exactly the key/values of `self.tokens`. `forward(ids, last)` feeds
only what the cache lacks and returns logits for the last `last` positions; `rollback(ids)`
crops the cache to the longest common prefix it shares with ids, leaving at least the last id to
feed. After each engine round the target's cache holds the committed tokens minus the last.

In bfloat16 / float16 a logit is rounded to 8 / 11 significant bits, so two tokens often tie
exactly, and a 1-token and a (k+1)-token pass break such ties differently. With `refine` the
top logits of each row (every token that rounding could have put first) are recomputed in
float32 from the same hidden state and weights: the argmax is then the float32 head's.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

# Architectures whose logits are exactly lm_head(last hidden state): no soft-capping or scaling.
PLAIN_HEADS = {"qwen2", "qwen3", "llama", "mistral", "gpt2", "gpt_neox", "phi3", "olmo2"}


def output_rows(model) -> int:
    """How many token ids the model can produce (rows of its output projection)."""
    head = model.get_output_embeddings()
    return getattr(head, "out_features", None) or head.weight.shape[0]


def input_rows(model) -> int:
    """How many token ids the model can read (rows of its input embedding)."""
    return model.get_input_embeddings().num_embeddings


def rollback_window(model, name: str = "the model") -> int | None:
    """The most positions the model's cache can hold and still be cropped (None: no limit).

    ValueError for caches that cannot roll back at all (linear-attention or other recurrent
    layers); a sliding-window layer crops exactly only while it holds fewer tokens than its
    window."""
    window = None
    for layer in DynamicCache(config=model.config).layers:
        if type(layer) is DynamicSlidingWindowLayer:
            window = min(window or layer.sliding_window, layer.sliding_window)
        elif type(layer) is not DynamicLayer:
            raise ValueError(f"{name} uses {type(layer).__name__} cache layers, whose state cannot be "
                             "rolled back to an earlier token: specviz needs full-attention models "
                             "(pick another pair)")
    return window


def refinable(model) -> bool:
    head = model.get_output_embeddings()
    return (model.dtype in (torch.bfloat16, torch.float16) and type(head) is nn.Linear
            and head.bias is None and model.config.model_type in PLAIN_HEADS
            and model.base_model is not model)


def refine_top(hidden: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Recompute in float32 every logit that low-precision rounding could have put first.

    hidden [n, d] and weight [vocab, d] in the model's dtype; logits [n, vocab] = hidden @ weight.T
    rounded to that dtype. Returns float32 logits [n, vocab]: the candidates (within 4 units in
    the last place of the row's maximum) exact to float32, the rest as given."""
    out = logits.float()  # [n, vocab]
    top = out.amax(-1, keepdim=True)  # [n, 1]
    ulp = torch.finfo(logits.dtype).eps * torch.exp2(torch.floor(torch.log2(top.abs().clamp_min(1e-30))))
    m = int((out >= top - 4 * ulp).sum(-1).max())  # candidates in the widest row
    idx = out.topk(m, dim=-1).indices  # [n, m]: every candidate
    exact = torch.einsum("nd,nmd->nm", hidden.float(), weight[idx].float())  # [n, m]
    return out.scatter_(-1, idx, exact)


class CachedLM:
    def __init__(self, model, vocab_size: int, refine: bool = True):
        self.model = model
        self.vocab_size = vocab_size  # ids >= vocab_size are never produced (masked)
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        self.refine = refine and refinable(model)
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

    def _logits(self, input_ids: torch.Tensor, last: int) -> torch.Tensor:
        """Logits [last, vocab_size] (float32) for input_ids [1, n] after the cache."""
        if not self.refine:
            out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=last)
            return out.logits[0, -last:, : self.vocab_size].float()
        hidden = self.model.base_model(input_ids=input_ids, cache=self.cache, use_cache=True)
        hidden = hidden.last_hidden_state[0, -last:]  # [last, d]
        weight = self.model.get_output_embeddings().weight[: self.vocab_size]  # [vocab, d]
        return refine_top(hidden, weight, nn.functional.linear(hidden, weight))

    @torch.inference_mode()
    def forward(self, ids: list[int], last: int = 1) -> torch.Tensor:
        """Feed what the cache lacks of ids; return logits [last, vocab_size] (float32)."""
        self.rollback(ids[: len(ids) - last + 1])
        new = ids[len(self.tokens):]
        start = time.perf_counter()
        logits = self._logits(torch.tensor([new], device=self.device), last)  # [last, vocab]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - start
        self.passes += 1
        self.tokens = list(ids)
        assert self.cache_length == len(self.tokens), (self.cache_length, len(self.tokens))
        return logits
