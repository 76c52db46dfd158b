"""refine_top at the embedded target's size (vocab 151,936, width 1,536, bf16, random weights) on
this CPU: the last stop's version (which read the candidate count back before its top-k) against
this one, side by side, and each row's logits alone against the same row in a batch.

PYTHONPATH=. python docs/refine-check.py
"""

import time

import torch

from specviz import lm


def before(hidden, weight, logits):
    out = logits.float()
    top = out.amax(-1, keepdim=True)
    ulp = torch.finfo(logits.dtype).eps * torch.exp2(torch.floor(torch.log2(top.abs().clamp_min(1e-30))))
    own = out >= top - 4 * ulp
    m = int(own.sum(-1).max())
    idx = out.topk(m, dim=-1).indices
    exact = torch.einsum("nd,nmd->nm", hidden.float(), weight[idx].float())
    return out.scatter_(-1, idx, torch.where(own.gather(-1, idx), exact, out.gather(-1, idx)))


torch.manual_seed(0)
weight = (torch.randn(151936, 1536) * 0.02).bfloat16()  # [vocab, d]
for n in (1, 5, 17):
    hidden = torch.randn(n, 1536).bfloat16()  # [n, d]
    logits = torch.nn.functional.linear(hidden, weight)  # [n, vocab]
    ms = {}
    for name, refine in (("before", before), ("now", lm.refine_top)):
        refine(hidden, weight, logits)
        start = time.perf_counter()
        for _ in range(20):
            out = refine(hidden, weight, logits)
        ms[name] = (time.perf_counter() - start) / 20 * 1e3
    ref = before(hidden, weight, logits)
    alone = max(float((lm.refine_top(hidden[i:i + 1], weight, logits[i:i + 1])[0] - out[i]).abs().max())
                for i in range(n))
    same = torch.equal(ref.argmax(-1), out.argmax(-1))
    print(f"{n} rows: before {ms['before']:.2f} ms, now {ms['now']:.2f} ms; argmax equal {same}, "
          f"max difference {float((ref - out).abs().max()):.1e}; a row alone against in the batch: {alone}")
