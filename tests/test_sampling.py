import math

import pytest
import torch

from specviz import sampling
from specviz.sampling import SamplingParams, process


def test_greedy_is_one_hot_argmax():
    probs = process(torch.tensor([[0.1, 3.0, -1.0]]), SamplingParams())
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_temperature_top_k_top_p_exact():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(process(logits, SamplingParams(1.0)), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(process(logits, SamplingParams(1.0, top_k=2)),
                          torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(process(logits, SamplingParams(1.0, top_k=3)),  # all but one: the last goes
                          torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    # top_p=1 (off) drops nothing, however small the tail: a float32 running sum reaches 1.0 before
    # these last two tokens' mass (1.45e-8, 5.3e-9), so a cut applied at 1.0 would drop them
    assert torch.allclose(process(torch.tensor([0.0, -3, -18, -19]), SamplingParams(1.0)),
                          torch.tensor([0.0, -3, -18, -19]).softmax(-1), rtol=1e-5, atol=0)
    # top_p=0.8: 0.5 + 0.3 reaches it, so the rest is dropped.
    assert torch.allclose(process(logits, SamplingParams(1.0, top_p=0.8)),
                          torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(process(logits, SamplingParams(1.0, top_p=0.81)),
                          torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    # a top_p below float32's smallest number (1e-300 reads as 0 there) still keeps the top token
    assert torch.equal(process(logits, SamplingParams(1.0, top_p=1e-300)), torch.tensor([1.0, 0, 0, 0]))
    assert torch.equal(process(logits.expand(3, 4), SamplingParams(1.0, top_p=1e-46)),
                       torch.tensor([[1.0, 0, 0, 0]] * 3))
    half = process(logits, SamplingParams(0.5))
    assert torch.allclose(half, torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365)
    # top_p applies to the tempered distribution: at T=0.5 these logits give 1/2, 1/4, 1/8, 1/8
    # (masses before 0, 1/2, 3/4): top_p=0.7 keeps two. Untempered (0.37, 0.26, 0.19, 0.19:
    # masses before 0, 0.37, 0.63) it would keep three.
    tempered = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125])) / 2  # x 1/T = the halves' logs
    assert torch.allclose(process(tempered, SamplingParams(0.5)), torch.tensor([0.5, 0.25, 0.125, 0.125]))
    assert torch.allclose(process(tempered, SamplingParams(0.5, top_p=0.7)),
                          torch.tensor([2 / 3, 1 / 3, 0, 0]))


def test_a_top_p_cut_among_tied_logits_keeps_the_lowest_ids_whatever_the_batch():
    """One token of mass 1/2 and 4,096 tied ones of 1/8192 each; top_p 0.5 + 3/8192 keeps the top
    token and the first 3 of the tie (masses before them 1/2, 1/2 + 1/8192, 1/2 + 2/8192 are below
    it, exactly in float32). Which 3 was the unstable sort's order of ties: here ids 3339, 3321
    and 3338 on this CPU, an order a GPU's sort may change with the pass's rows (the target alone's
    one row against a verify pass's k + 1). Stable: ids 1, 2 and 3, alone or in any batch."""
    logits = torch.full((4097,), math.log(1 / 8192))
    logits[0] = math.log(1 / 2)
    params = SamplingParams(1.0, top_p=0.5 + 3 / 8192)
    alone = process(logits, params)
    assert alone.nonzero().flatten().tolist() == [0, 1, 2, 3]
    batch = torch.stack([torch.randn(4097), logits, logits.flip(0), logits])  # [4, 4097]
    rows = process(batch, params)
    assert torch.equal(rows[1], alone) and torch.equal(rows[3], alone)
    assert rows[2].nonzero().flatten().tolist() == [0, 1, 2, 4096]  # flipped: the top last, the tie first


def test_top_p_stops_at_the_token_whose_mass_reaches_it():
    """Powers of two are exact in float32, so the masses before each token are exactly 0, 1/2, 3/4,
    7/8: a prefix whose mass equals top_p is kept whole and nothing after it (`>=`, not `>`)."""
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125]))
    assert (process(logits, SamplingParams(1.0)).cumsum(-1)).tolist() == [0.5, 0.75, 0.875, 1.0]
    assert process(logits, SamplingParams(1.0, top_p=0.5)).tolist() == [1.0, 0, 0, 0]
    assert torch.allclose(process(logits, SamplingParams(1.0, top_p=0.75)),
                          torch.tensor([2 / 3, 1 / 3, 0, 0]))
    assert torch.allclose(process(logits, SamplingParams(1.0, top_p=0.7500001)),
                          torch.tensor([4 / 7, 2 / 7, 1 / 7, 0]))


def _sorted_top_p(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """process as it was first written: a stable sort of every row's whole vocabulary. The masses
    are the row's softmax in id order, as process reads them: a softmax of the sorted row sums in
    another order, and a cut within a rounding step of top_p then fell elsewhere on one CPU's
    vector width (AVX2) and not on another's (AVX-512)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, stable=True, dim=-1, descending=True)
    sorted_probs = logits.softmax(-1).gather(-1, order)
    drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
    drop[..., 0] = False
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf"))).softmax(-1)


@pytest.mark.parametrize("candidates", [None, 8])
def test_top_p_keeps_what_a_stable_sort_of_the_whole_vocabulary_keeps(monkeypatch, candidates):
    """On a CPU the cut is looked for among each row's top TOP_P_CANDIDATES (8: most rows' cuts lie
    past them and are sorted whole, beside rows that are not): the same tokens as a stable sort of
    every row, ties (bfloat16 logits tie often) broken by the lowest ids, with or without top-k."""
    if candidates is not None:
        monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", candidates)
    gen = torch.Generator().manual_seed(0)
    for case in range(200):
        rows = int(torch.randint(1, 6, (1,), generator=gen))
        vocab = int(torch.randint(2, 3000, (1,), generator=gen))
        scale = float(torch.rand(1, generator=gen)) * 8
        logits = (torch.randn(rows, vocab, generator=gen) * scale).to(torch.bfloat16)  # ties
        params = SamplingParams(0.05 + 2 * float(torch.rand(1, generator=gen)), (case % 3) * 7,
                                0.0005 + 0.999 * float(torch.rand(1, generator=gen)))
        got, want = process(logits, params), _sorted_top_p(logits, params)
        assert torch.equal(got > 0, want > 0), (case, params)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), (case, params)


def test_a_peaked_row_of_a_real_vocabulary_finds_its_top_p_cut_without_sorting_it(monkeypatch):
    """The embedded pair's 151,936 ids: a CPU's sort of a row took 10-100 ms, more than the draft's
    pass, for every drafted token and every verified row of a top-p run (a sampled run's draft
    passes, the proposer's q, then the target's p). A row whose nucleus lies among its top
    TOP_P_CANDIDATES is cut without one; a flat row is still sorted, and cut as a sort cuts it."""
    vocab, gen = 151_936, torch.Generator().manual_seed(1)
    peaked = torch.randn(5, vocab, generator=gen) * 2
    peaked[:, :40] += torch.linspace(24, 12, 40)  # an LM's few likely tokens, then a long tail
    flat = torch.randn(1, vocab, generator=gen) * 0.1
    params = SamplingParams(0.8, top_p=0.9)
    want = _sorted_top_p(torch.cat([peaked, flat]), params)
    widest = []
    topk = torch.Tensor.topk

    def counted(self, k, *args, **kwargs):
        widest.append(k)
        return topk(self, k, *args, **kwargs)

    def no_sort(*args, **kwargs):
        raise AssertionError("sorted a whole row")

    monkeypatch.setattr(torch.Tensor, "topk", counted)
    monkeypatch.setattr(torch, "sort", no_sort)
    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    got = process(peaked, params)
    assert max(widest) <= sampling.TOP_P_CANDIDATES
    assert torch.equal(got[2], process(peaked[2], params))  # a row's cut, whatever the batch
    assert torch.equal(got > 0, want[:5] > 0) and 1 <= int((got[0] > 0).sum()) < 40
    widest.clear()
    both = process(torch.cat([peaked, flat]), params)  # the flat row's nucleus is thousands wide
    assert widest == [sampling.TOP_P_CANDIDATES, vocab] and torch.equal(both > 0, want > 0)
    assert torch.equal(both[:5], got) and int((both[5] > 0).sum()) > sampling.TOP_P_CANDIDATES


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"temperature": float("nan")}, "temperature"),
])
def test_bad_settings_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": "1"}, "temperature must be a number, got '1'"),
    ({"temperature": 1.0, "top_p": "0.9"}, "top_p must be a number"),
    ({"temperature": 1.0, "top_k": True}, "top_k must be an integer, got True"),  # drew from the top 1
    ({"temperature": 1.0, "top_k": 2.5}, "top_k must be an integer, got 2.5"),
])
def test_settings_of_the_wrong_kind_are_refused_by_the_constructor_too(kwargs, match):
    """SamplingParams is public: built directly, a str failed a comparison with a TypeError and
    top_k=True kept the one most likely token (SamplingParams.of checked kinds; the class did not)."""
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature", [1e-40, 1e-5, float("inf"), 1e6])
def test_temperatures_that_overflow_the_logits_are_refused_with_the_fix(temperature):
    with pytest.raises(ValueError, match="use 0 for greedy"):
        SamplingParams(temperature)


def test_the_smallest_allowed_temperature_still_gives_a_distribution():
    logits = torch.tensor([[80.0, 79.9999, -1e4, float("-inf")]])  # a masked logit and a wide one
    probs = process(logits, SamplingParams(1e-4, top_k=3))
    assert torch.isfinite(probs).all() and probs.sum().item() == pytest.approx(1.0)
    probs = process(logits, SamplingParams(100.0, top_k=3))
    assert torch.isfinite(probs).all() and probs[0, 3].item() == 0.0


def test_a_top_p_row_keeps_the_same_tokens_alone_and_in_a_batch():
    """Speculative sampling is exact only if a verify pass's rows are processed as the draft's
    and the target alone's single rows are. A CPU sums a lone row over its threads but each of
    several rows on one thread: the cut's denominator, summed so, differed in its last bits with
    the batch, and near top_p the kept set moved (2 threads: a third of 151,936-id rows at
    top_p 0.9999999). Run with two threads, as the app does on 2 cores (tests run with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(0)
        logits = torch.randn(4, 151_936, generator=gen) * 3
        params = SamplingParams(0.7, top_p=0.9999999)
        batch = process(logits, params)
        for row in range(len(logits)):
            assert torch.equal(process(logits[row:row + 1], params)[0], batch[row]), row
    finally:
        torch.set_num_threads(threads)
