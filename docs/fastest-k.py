"""The k explorer's fastest-k line for two prompts on the embedded pair (64 tokens, greedy, k = 4),
at the run's own costs and on the shipped H200 profile. From the repo root:
    PYTHONPATH=. python docs/fastest-k.py
(loads the embedded pair, builds its cache on a first run; about a minute a prompt on 2 cores)."""

from specviz import labview
from specviz.service import run_views
from specviz.settings import Limits, RunSettings
from specviz.store import ModelStore

store = ModelStore({}, device="cpu")
for prompt in ("Write a Python function that returns the n-th Fibonacci number.", "Write a stack class."):
    last = list(run_views(store, RunSettings(prompt=prompt, max_new_tokens=64, k=4), Limits()))[-1]
    print(prompt, "|", last.status[:100])
    for profile in (None, "nvidia-h200-bfloat16"):
        numbers = labview.explorer_views(last.trace.recording, 4, False, None, None, profile)[1]
        print(" ", profile or "own costs", "|", numbers[numbers.index("Fastest"):].removesuffix("</div>"))
