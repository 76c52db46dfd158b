"""Seconds a sample of the Exactness lab's end-to-end check takes on the embedded pair, side by
side in one run: a fresh run per sample (each reading the prompt, as before the thirty-first stop)
against service.continuations (one target cache and one draft cache for every sample, the
prompt read into both before either run's clock starts).

    PYTHONPATH=. python docs/e2e-check-time.py [samples]
"""

import sys
import time

from specviz import generate
from specviz.loading import load_pair
from specviz.service import _prompt_ids, continuations
from specviz.settings import Limits, RunSettings

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
pair = load_pair()  # the embedded default pair
s = RunSettings(pair="embedded", temperature=0.8)  # the lab's defaults: 2-token samples
ids = _prompt_ids(pair, s, Limits())
print(f"{pair.dtype}, a {len(ids)}-token prompt, {n} samples a method")
for proposer in (s.proposer, "none"):
    start = time.perf_counter()
    for seed in range(n):
        list(generate(pair, ids, proposer=proposer, k=s.k, max_new_tokens=2, temperature=0.8, seed=seed))
    print(f"fresh runs, {proposer}: {(time.perf_counter() - start) / n:.2f} s a sample")
*_, result = continuations(pair, s, n, Limits())  # progress steps, then the result
for run, seconds in result["seconds"].items():
    print(f"continuations, {run}: {seconds / n:.2f} s a sample")
