"""Host ms a round of the engine around replays that cost nothing (stand-in graphs), by run length:
what a GPU waits on the host for each round. PYTHONPATH=. python docs/host-rounds.py (about 1 minute).
A 1-layer Qwen2 of width 64 drafting for itself, vocab 1000; zero logits, so every draft is kept."""

import contextlib
import statistics

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from specviz import fastpath, lm
from specviz.engine import generate
from specviz.enginecheck import Vocabulary
from specviz.loading import Pair

torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
target = AutoModelForCausalLM.from_config(cfg).eval()
fastpath.GRAPH_DEVICES = {"cuda", "cpu"}
fastpath.GraphedStep.warm_stream = lambda self: contextlib.nullcontext()
fastpath.GraphedStep.record = lambda self, run, like: ((lambda: None), torch.zeros_like(like))
lm.CachedLM.checked_length = lambda self: len(self.tokens) + len(self.slots)  # the stand-ins write no KV
pair = Pair(target, Vocabulary(1000), target, "t", "d", fast="graphed")
prompt = [(11 * i + 5) % 1000 for i in range(64)]
for proposer in ("draft", "none"):
    list(generate(pair, prompt, k=4, max_new_tokens=16, proposer=proposer))
    for n in (256, 1024, 4000):
        best = []
        for _ in range(3):
            events = list(generate(pair, prompt, k=4, max_new_tokens=n, proposer=proposer))
            best.append(1e3 * statistics.fmean(e.round_seconds for e in events if e.position >= n // 2))
        print(f"{proposer:5s} {n:5d} tokens: {min(best):.3f} ms a round over the second half "
              f"({len(events)} rounds)")
