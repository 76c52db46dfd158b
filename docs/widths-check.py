"""First use and pass time of the compiled step per verify width, a graph a width or one shared graph.

PYTHONPATH=. python docs/widths-check.py each | shared   (rm -rf /tmp/torchinductor_$USER before
each for the first-use times; about 5 and 2 minutes on 2 cores). docs/benchmarks.md, "One graph
for every wide pass"."""
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, StaticCache

from specviz import fastpath
from specviz.fastpath import step
from specviz.kvcache import crop

torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=28,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = AutoModelForCausalLM.from_config(cfg).eval()
fastpath.SHARED = sys.argv[1] == "shared"
compiled = fastpath.compiled_step("cpu")  # torch.compile(step, dynamic=False), shared widths or not
kv = fastpath.cache_argument(model)  # "cache", or "past_key_values" before transformers 5.24
cache = StaticCache(config=model.config, max_cache_len=128)
eager = StaticCache(config=model.config, max_cache_len=128)
with torch.inference_mode():
    for c in (cache, eager):
        step(model, c, torch.tensor([[1, 2, 3, 4]]), 1, False, kv)
    for width in (2, 5, 9, 17):
        ids = torch.tensor([[(7 * i + 3) % 1000 for i in range(width)]])
        start = time.perf_counter()
        out = compiled(model, cache, ids, width, False, kv)
        first = time.perf_counter() - start
        diff = (out - step(model, eager, ids, width, False, kv)).abs().max().item()
        for c in (cache, eager):
            crop(c, -width)
        times = []
        for _ in range(30):
            start = time.perf_counter()
            compiled(model, cache, ids, width, False, kv)
            times.append(time.perf_counter() - start)
            crop(cache, -width)
        times.sort()
        print(sys.argv[1], f"width {width}: first use {first:.1f} s, max difference {diff:.1e}, "
              f"a pass {times[15] * 1e3:.2f} ms (median of 30)", flush=True)
