"""The embedded target in float32: greedy tokens and logits before and after packing.pack.

PYTHONPATH=. python docs/packing-real-check.py   (needs the embedded cache: python -m specviz prepare)
"""
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specviz import embedded, packing
from specviz.lm import CachedLM

path = embedded.cache_dir(embedded.TARGET)
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
vocab = len(tok)
prompt = tok("def quicksort(xs):\n    \"\"\"Sort a list.\"\"\"\n", return_tensors=None)["input_ids"]

def decode(cache: str, n: int = 32):
    lm = CachedLM(model, vocab, cache=cache, max_len=len(prompt) + n + 8)
    ids, rows = list(prompt), []
    start = time.perf_counter()
    for _ in range(n):
        row = lm.forward(ids)[0]
        rows.append(row)
        ids.append(int(row.argmax()))
    verify = lm.forward(ids[:-4] + ids[-4:], last=5)  # after a rollback: a 5-token verify pass
    return ids[len(prompt):], torch.stack(rows), verify, time.perf_counter() - start

runs = {}
for name in ("unpacked", "packed"):
    if name == "packed":
        assert packing.pack(model)
    runs[name] = {c: decode(c) for c in ("dynamic", "static")}
for c in ("dynamic", "static"):
    a, b = runs["unpacked"][c], runs["packed"][c]
    print(c, "tokens equal:", a[0] == b[0], "| max logit difference:", float((a[1] - b[1]).abs().max()),
          "| verify rows:", float((a[2] - b[2]).abs().max()),
          f"| seconds unpacked {a[3]:.1f}, packed {b[3]:.1f}")
print(model.config._attn_implementation, repr(tok.decode(runs["packed"]["static"][0]))[:120])
