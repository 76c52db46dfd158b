"""Same-text target passes of the n-gram rules on the embedded pair's own greedy outputs: specviz's
copies reading on past the context's end (now) and cut there (before 2026-12-06), and transformers'
prompt lookup. From the repo root:

    PYTHONPATH=. python docs/ngram-same-text.py            # the bench's 8 prompts, 64 tokens
    PYTHONPATH=. python docs/ngram-same-text.py --repeat   # 6 prompts asking for repetitive text

About 4 minutes on 2 cores for the first (the target alone writes each output once)."""

import json
import sys

import specviz
from specviz import bench
from specviz.engine import generate, ngram_price
from specviz.proposers import NgramProposer

REPEAT = ["Write a Python list literal of forty zeros, on one line, and nothing else.",
          "Write a markdown table with columns a, b, c and eight rows whose cells are all 0. Only the table.",
          "Print the string '-=' repeated 30 times as a Python string literal, and nothing else.",
          "Write the word ha forty times, separated by spaces, and nothing else.",
          "Write a Python list of forty zeros written out in full, like [0, 0, 0, ...], and nothing else.",
          "Draw a line of sixty '=' characters followed by a line of sixty '-' characters, in a code block."]


def main() -> None:
    pair = specviz.load_pair()
    prompts = ([{"class": "repeat", "prompt": p} for p in REPEAT] if "--repeat" in sys.argv
               else json.loads(bench.PROMPTS.read_text()))
    totals: dict[str, dict[str, int]] = {}
    for p in prompts:
        ids = bench.encode(pair, p["prompt"])
        out = [t for e in generate(pair, ids, proposer="none", max_new_tokens=64) for t in e.new_tokens]
        row = totals.setdefault(p["class"], {"tokens": 0})
        row["tokens"] += len(out)
        rules = {"specviz:ngram-8": NgramProposer(3, *ngram_price(pair)),
                 "specviz:ngram-8 cut": NgramProposer(3, *ngram_price(pair), reads_on=False)}
        for name, drafter in rules.items():
            row[name] = row.get(name, 0) + bench.passes_on_text(
                ids, out, lambda i, b, d=drafter: d.proposal(i, min(bench.NGRAM_K, b)))
        lookup = bench.lookup_rules(pair, ids, 64)["hf:lookup-8"]
        row["hf:lookup-8"] = row.get("hf:lookup-8", 0) + bench.passes_on_text(ids, out, lookup)
        print(p["class"], len(out), repr(pair.tokenizer.decode(out))[:80], flush=True)
    print(json.dumps(totals, indent=1))
    print("all", {k: sum(r[k] for r in totals.values()) for k in next(iter(totals.values()))})


if __name__ == "__main__":
    main()
