"""Memory a run's rounds hold in Python (what the page's `sides` state and a kept trace's events
hold): tracemalloc around a deep copy of a run's RunStats, per round, on the tests' tiny pair.

    PYTHONPATH=.:tests python docs/rounds-memory.py [max_new_tokens] [noise]
"""
import copy
import sys
import tracemalloc

import torch
from conftest import long_pair

from specviz.engine import generate
from specviz.loading import load_pair
from specviz.metrics import RunStats

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 512
noise = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
out = long_pair(noise)
pair = load_pair(str(out / "target"), str(out / "draft"), device="cpu", dtype="float32")
for proposer in ("draft", "tree"):
    spec = RunStats.of(generate(pair, "def f", proposer=proposer, k=4, max_new_tokens=n, temperature=1.0))
    tracemalloc.start()
    held = copy.deepcopy(spec)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{proposer}: {len(held.events)} rounds, {held.new_tokens} tokens, "
          f"{size / 1024 / len(held.events):.1f} KB a round")
