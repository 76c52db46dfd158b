"""How often the exactness lab's p-value flags an exact sampler (its false alarms) and how often
a sampler that piles its draws on rare tokens is flagged, on distributions where the lab pools
cells: 4,000 draws of N from p for each, seeded.

PYTHONPATH=. python docs/lab-calibration.py   (about a minute on 2 cores). docs/benchmarks.md,
"Forty-fourth stop"."""
import torch

from specviz import lab

g = torch.Generator().manual_seed(1)
rare = torch.cat([torch.tensor([0.997]), torch.full((400,), 0.003 / 400)])
half = torch.cat([torch.tensor([0.5]), torch.full((400,), 0.5 / 400)])
CASES = {  # name: (p, N, what draws: p itself, or a sampler with ten times the rare draws)
    "one token 0.997 + 400 rare, N=1000": (rare, 1000, None),
    "the same, draws 10x on the rare ones": (rare, 1000, torch.cat([torch.tensor([0.97]),
                                                                  torch.full((400,), 0.03 / 400)])),
    "one token 0.5 + 400 flat, N=1000": (half, 1000, None),
    "the same, twice the draws on 20 of the 400": (half, 1000, half * torch.cat([torch.ones(1), torch.full(
        (20,), 2.0), torch.ones(380)])),
    "Zipf 1.5 over 5,000, N=1000": (1 / torch.arange(1, 5001).double() ** 1.5, 1000, None),
    "Zipf 1.1 over 5,000, N=10000": (1 / torch.arange(1, 5001).double() ** 1.1, 10000, None),
    "p = .5 .3 .19 .01, N=100": (torch.tensor([.5, .3, .19, .01]), 100, None),
    "softmax(3 randn) over 2,000, N=1000": ((torch.randn(2000, generator=g, dtype=torch.float64) * 3)
                                            .softmax(-1), 1000, None),
}
REPEATS = 4000
for name, (p, n, drawn) in CASES.items():
    p = (p / p.sum()).double()
    source = p if drawn is None else (drawn / drawn.sum()).double()
    draws = torch.multinomial(source.float(), n * REPEATS, replacement=True, generator=g).view(REPEATS, n)
    pvalues = torch.tensor([lab.chi_square_pvalue(torch.bincount(d, minlength=len(p)).double(), p)
                            for d in draws])
    print(f"{name}: p < 0.001 in {float((pvalues < 1e-3).double().mean()):.4f}, "
          f"p < 0.05 in {float((pvalues < 0.05).double().mean()):.4f}")
