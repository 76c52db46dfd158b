"""Sampling settings and the processed distribution p or q (temperature, top-k, top-p).

The same `process` is applied to the target's and the drafter's logits, so the rule in
acceptance.py compares like with like. Temperature 0 means greedy: the processed distribution
is one-hot on the argmax, which callers handle without building it (see `SamplingParams.greedy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .untrusted import real, whole

MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 100.0
TOP_P_CANDIDATES = 1024  # on a CPU, the tokens a top-p cut is first looked for among (process)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off

    def __post_init__(self):
        kinds(self.temperature, self.top_k, self.top_p)  # SamplingParams("1") failed a comparison,
        # and top_k=True drew from the top 1
        if not self.temperature >= 0:  # also catches NaN
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE or self.temperature > MAX_TEMPERATURE:
            # logits / 1e-40 overflow to inf (softmax gives NaN); inf turns masked -inf into NaN
            raise ValueError(f"temperature {self.temperature:g} is out of range: use 0 for greedy, "
                             f"or a value in {MIN_TEMPERATURE:g}..{MAX_TEMPERATURE:g}")
        if not self.top_k >= 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")

    @classmethod
    def of(cls, temperature, top_k, top_p) -> SamplingParams:
        """From a caller's values, numpy's too: numbers of the right kind, else ValueError (int()
        first turned top_k=0.5 into 0, top-k off, and "5" into 5)."""
        kinds(temperature, top_k, top_p)
        return cls(float(temperature), int(top_k), float(top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def kinds(temperature, top_k, top_p) -> None:
    """ValueError unless the settings are numbers of the right kind (numpy's and torch's count)."""
    for name, value, kind, word in (("temperature", temperature, real, "a number"),
                                    ("top_k", top_k, whole, "an integer"),
                                    ("top_p", top_p, real, "a number")):
        if not kind(value):
            raise ValueError(f"{name} must be {word}, got {value!r}")


def process(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., vocab] -> probabilities [..., vocab] (float32) under params.

    Greedy gives the one-hot argmax. Otherwise: divide by temperature, keep the top_k largest,
    keep the smallest prefix of the sorted distribution whose mass reaches top_p, softmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        rows = logits.reshape(-1, logits.shape[-1])  # [n, vocab]
        # a CPU sorts a whole vocabulary slowly (the embedded pair's 151,936 ids: 10-100 ms a row
        # on 2 cores, as much as a draft pass, for every drafted token and verified row): there the
        # cut is first looked for among each row's top TOP_P_CANDIDATES, and only a row whose cut
        # lies past them is sorted; elsewhere every row is, as that check would cost a host sync
        vocab = rows.shape[-1]
        m = min(TOP_P_CANDIDATES, vocab) if logits.device.type == "cpu" else vocab
        keep, short = _nucleus(rows, params.top_p, m)
        if m < vocab and bool(short.any()):  # a flat row's cut lies past them: sort all of it
            keep[short] = _nucleus(rows[short], params.top_p, vocab)[0]
        logits = logits.masked_fill(~keep.view(logits.shape), float("-inf"))
    return logits.softmax(-1)


def _nucleus(rows: torch.Tensor, top_p: float, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [n, vocab], short [n]) for logits rows [n, vocab] (float32): the tokens top-p keeps,
    looking for the cut among each row's m largest logits. The tokens in descending order of
    logit, tied ones by ascending id (a stable sort's order: where the cut falls among tied logits,
    the lowest ids stay, whatever the batch; an unstable sort's order of ties can change with a
    pass's width, a verify pass's rows against the target alone's one row), are kept while the
    mass before each is below top_p, the first one always (a top_p below float32's smallest
    number, say 1e-300, compares as 0 with the first token's mass before it, 0). short: the rows
    whose cut lies past their top m (m < vocab), whose keep is not set.

    Only the values of the top m are read, never their order among ties: the count kept gives
    the last kept logit, and the kept tokens are those above it and, of those tied at it, the
    lowest ids that make up the count."""
    values, at = rows.topk(m, dim=-1)  # [n, m], descending (the order of ties is not read)
    # softmax, not exp()/sum(): a CPU sums one row over its threads, several rows each on one,
    # so the sum of a row alone and in a verify pass's rows differ in their last bits (a cut near
    # top_p moved with the batch); softmax reduces a row the same way in any batch
    probs = rows.softmax(-1).gather(-1, at)  # [n, m]: tied logits, equal probabilities
    before = probs.cumsum(-1) - probs  # [n, m]: the mass before each
    drop = before >= top_p
    drop[:, 0] = False
    kept = torch.where(drop.any(-1), drop.int().argmax(-1), m)  # [n]: tokens kept (m: maybe more)
    short = (kept == m) & (m < rows.shape[-1])
    last = values.gather(-1, (kept - 1)[:, None])  # [n, 1]: the last kept logit
    above = (values > last).sum(-1, keepdim=True)  # [n, 1]: kept above it (all among the top m)
    tied = rows == last  # [n, vocab]
    return (rows > last) | tied & (tied.cumsum(-1) <= kept[:, None] - above), short
