"""k explorer: from one greedy run, recompute exactly what any k would have done.

A greedy run fixes the output for every k. Recording, for every output position, the target's
token and the drafter's greedy token given the true prefix (the run's own drafts, and one
teacher-forced draft pass where it drafted none; for n-gram the lookup itself) is enough to
replay the rounds, accepted lengths and passes for any k without calling a model. Time is
predicted from the measured draft and target pass costs.
A run that ended at EOS leaves the draft model's tokens past its output unrecorded: a round
there still drafts (and pays for) all the budget allows, as the engine does, but those drafts
commit nothing, so only their count matters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from functools import cached_property

import torch

from .arch import input_rows
from .detok import token_pieces
from .engine import MAX_K
from .engine import ngram_price as current_price
from .fastpath import resolve_fast
from .metrics import RunStats
from .proposers import DraftLength, NgramProposer
from .render import ACCEPTED, BONUS, RECOVERED, REJECTED, TARGET, Span
from .untrusted import whole
from .verifycost import VERIFY_SLOPE, fit_line

EXPLORER_PROPOSERS = ("draft", "ngram")
CURVE_KS = range(1, 17)  # the k explorer's curve
RECORD_ROWS = 64  # output positions whose draft logits record() reads in float32 at a time


@dataclass(frozen=True)
class Recording:
    proposer: str  # "draft" or "ngram"
    prompt_ids: list[int]
    output: list[int]  # the target's greedy output
    guesses: list[int]  # draft's greedy token at each output position given the true prefix
    draft_pass_seconds: float  # C_D, measured after round 1 (0 for n-gram)
    target_pass_seconds: float  # C_T, measured mean per target pass after round 1
    max_new_tokens: int
    ngram_size: int = 3
    output_pieces: tuple[str, ...] = ()  # display text of each output token in context
    guess_pieces: tuple[str, ...] = ()  # display text of each guess after the true prefix
    token_text: dict[str, str] | None = None  # id -> text, for refused n-gram proposals
    confidences: list[float] | tuple[float, ...] = ()  # draft top probability per position, true prefix
    verify_line: tuple[float, float] | None = None  # (c0, c1): a target pass feeding x tokens costs
    # c0 + c1 * x seconds, fitted to the recorded run (None: the flat mean, as older traces hold, and
    # a run whose passes fit no line: verify_line)
    ngram_slope: float | None = None  # the n-gram rule's price of a proposed token in target
    # passes, as the run used it (engine.ngram_price); None: the prior, as older traces used
    ngram_step: float | None = None  # and of a round that proposes any (None: 0, as older traces)
    ngram_reads_on: bool | None = None  # a copy at the context's end read on in itself (None: cut
    # there, as the rule was before 2026-12-06 and older traces drafted: proposers.copy_on)

    def lookup(self) -> NgramProposer:
        """A fresh n-gram drafter exactly as the recorded run drafted."""
        return NgramProposer(self.ngram_size, VERIFY_SLOPE if self.ngram_slope is None else self.ngram_slope,
                             self.ngram_step or 0.0, reads_on=bool(self.ngram_reads_on))

    def to_dict(self) -> dict:
        return asdict(self)

    @cached_property
    def curve(self) -> tuple[Point, ...]:
        """The replays' totals at k = 1..16, computed once per recording: the k explorer plots
        them on every slider move, and they depend on nothing else (16 replays took up to 2 s).
        Totals only: the replays' rounds, kept, took about 100 times the trace's own size (15 MiB
        for a 133 KB trace of 4,092 one-token rounds), outside the shelf's budget."""
        return tuple(Point.of(replay(self, k)) for k in CURVE_KS)

    @cached_property
    def _committed(self) -> dict[int, tuple[int, ...]]:
        return {}

    def committed(self, k: int) -> tuple[int, ...]:
        """Tokens each round of the fixed-k replay commits, kept for a few k: the k explorer
        checks the measured run's k against its rounds on every slider move."""
        if k not in self._committed:
            if len(self._committed) >= 4:
                self._committed.clear()
            self._committed[k] = tuple(r.committed for r in replay(self, k).rounds)
        return self._committed[k]

    @property
    def per_draft(self) -> tuple[float, float] | None:
        """(C_T, b): verify_line read per drafted token, a round verifying n drafts (feeding
        1 + n tokens) costing C_T + b * n seconds; None for older traces."""
        if self.verify_line is None:
            return None
        c0, c1 = self.verify_line
        return c0 + c1, c1

    def target_seconds(self, drafts: int) -> float:
        """C_T of a round that verifies `drafts` drafted tokens (the flat mean for older traces)."""
        if self.per_draft is None:
            return self.target_pass_seconds
        c_t, b = self.per_draft
        return c_t + b * drafts

    @property
    def replays_adaptive(self) -> bool:
        """The adaptive rule needs the draft's confidence at every position."""
        return self.proposer == "draft" and len(self.confidences) == len(self.output)


@dataclass(frozen=True)
class Round:
    position: int  # output tokens before this round
    k: int  # drafted this round (the draft model's past the output's end included: unrecorded)
    accepted: int  # drafts kept within the output (past an EOS the fate of a draft is unknown)
    rejected_token: int | None  # the first refused draft (None if all kept or unrecorded)
    committed: int  # tokens this round adds


@dataclass(frozen=True)
class Replay:
    k: int | str  # the fixed k, or "adaptive"
    rounds: tuple[Round, ...]
    recording: Recording
    k_max: int = 0  # the adaptive rule's bound (the live run's k: its verifies pad to k_max + 1)

    @property
    def target_passes(self) -> int:
        return len(self.rounds)

    @property
    def draft_passes(self) -> int:
        return sum(r.k for r in self.rounds) if self.recording.proposer == "draft" else 0

    @property
    def tokens_per_pass(self) -> float:
        return len(self.recording.output) / max(self.target_passes, 1)

    @property
    def predicted_seconds(self) -> float:
        """Draft passes * C_D + each round's C_T at the width it verifies (Recording.verify_line).
        Round 1 is priced like the others: the prompt's prefill, the same at every k, is left out."""
        rec = self.recording
        return self.draft_passes * rec.draft_pass_seconds + sum(rec.target_seconds(r.k) for r in self.rounds)


@torch.inference_mode()
def record(pair, prompt_ids: list[int], stats: RunStats, proposer: str, max_new_tokens: int,
           ngram_size: int = 3, ngram_slope: float | None = None,
           ngram_step: float | None = None, ngram_reads_on: bool | None = None) -> Recording:
    """Record a finished greedy run (one teacher-forced draft pass for the draft model).

    ngram_slope, ngram_step: the prices the n-gram run drafted with (its NgramProposer's slope and
    step). Left out, the target's line as it stands now, which is the run's only if no other run
    (chain, baseline, adaptive, hybrid or tree) ran since. ngram_reads_on: whether its copies read
    on past the context's end (its NgramProposer's reads_on); left out, they did, as the engine's
    n-gram drafter's do."""
    if proposer not in EXPLORER_PROPOSERS:
        raise ValueError(f"the k explorer replays 'draft' or 'ngram' runs, not {proposer!r}")
    output = stats.tokens
    if not output:  # logits_to_keep=0 keeps every row: the prompt's were taken for guesses
        raise ValueError("the run made no tokens: record a finished run (stats of its events)")
    guesses: list[int] = []
    confidences: list[float] = []
    if proposer == "draft":
        if max(prompt_ids + output) >= input_rows(pair.draft):
            raise ValueError("the draft cannot read every token of this run: the k explorer cannot "
                             "replay it")
        ids = torch.tensor([prompt_ids + output[:-1]], device=pair.device)
        logits = pair.draft(input_ids=ids, logits_to_keep=len(output)).logits[0]  # [n, vocab+]
        for rows in logits.split(RECORD_ROWS):  # float32 copies of a block at a time: a 151,936-id
            # vocabulary's whole output in float32, and its softmax, were 0.6 GB at 512 tokens
            rows = rows[:, : pair.vocab_size].float()  # [<= RECORD_ROWS, vocab]
            guesses += rows.argmax(-1).tolist()
            confidences += rows.softmax(-1).amax(-1).tolist()
        for i, token in run_drafts(stats.events).items():  # what the run's own passes drafted there
            if i < len(guesses):
                guesses[i] = token
    cost_d, cost_t = stats.draft_pass_seconds, stats.target_pass_seconds  # after round 1's prefills
    # without round 1 a fixed-k run's passes have one width but its last rounds', which the length
    # cut short: a line through one or two of them would read their noise as a cost per token
    on_line = prefill_on_line(pair)
    line = verify_line(stats.events, len(prompt_ids), on_line) if on_line or proposer != "draft" else None
    ended = bool(stats.events) and stats.events[-1].stop is not None  # as the Run tab reads its end
    out_pieces = token_pieces(pair.tokenizer, prompt_ids, output, final=ended)
    guess_pieces = [token_pieces(pair.tokenizer, prompt_ids + output[:i], [g])[0]
                    for i, g in enumerate(guesses)]
    token_text = {str(t): pair.tokenizer.decode([t]) for t in set(prompt_ids + output)}
    if proposer == "ngram" and ngram_slope is None:
        ngram_slope, ngram_step = current_price(pair)
    reads_on = True if ngram_reads_on is None else bool(ngram_reads_on)  # None: the engine's rule
    return Recording(proposer, list(prompt_ids), output, guesses, cost_d, cost_t, max_new_tokens,
                     ngram_size, tuple(out_pieces), tuple(guess_pieces), token_text, confidences, line,
                     *((ngram_slope, ngram_step or 0.0, reads_on) if proposer == "ngram"
                       else (None, None, None)))


def run_drafts(events) -> dict[int, int]:
    """Output position -> the token the run's draft proposed there given the true prefix: each
    round's drafts up to and including its first refused one (those after it followed a wrong
    token). Every position but a bonus token's is one. The recording replays these, not its own
    teacher-forced pass's: in bfloat16 a pass over the whole output can round a near-tie apart
    from the run's one-token steps, and the replay at the run's own k then missed the run."""
    return {e.position + j: t for e in events if getattr(e, "source", "draft") == "draft"
            for j, t in enumerate(e.draft_tokens[: e.accepted + 1])}


def verify_line(events, prompt_tokens: int, prefill_on_line: bool = True) -> tuple[float, float] | None:
    """(c0, c1): least squares of each round's target seconds on the tokens its pass fed (round 1
    the prompt and its drafts, later rounds 1 + drafts), slope clipped at 0. Round 1 gives the
    spread a fixed-k run lacks: on a CPU without bf16 matrix hardware a verified token costs
    about half a one-token pass, and a flat C_T would make every k look as cheap as k = 1.
    prefill_on_line False (prefill_on_line(pair)): round 1 is left out. None when the fit says
    nothing (fewer than two widths, or no positive intercept)."""
    events = [e for e in events if prefill_on_line or e.round != 1]
    x = [float((prompt_tokens if e.round == 1 else 1) + e.k) for e in events]
    return fit_line(x, [e.target_seconds for e in events]) if events else None


def prefill_on_line(pair) -> bool:
    """Whether the target's round 1 ran as its later rounds did. Not where those replay captured
    CUDA graphs (compiled or graphed steps on CUDA): round 1 reads the prompt eagerly, about 5x a
    captured pass on the H200 (profiles.py), and a line through it priced every verified token at
    that overhead (0.63 ms a token where the path's own passes cost 2.99 ms at 1 token and 3.64 ms
    at 17), so the fastest k read 1 where the path's costs give 4."""
    _, steps = resolve_fast(pair.fast, pair.target)
    return steps is None or pair.device.type != "cuda"


def _proposal(rec: Recording, pos: int, k: int, lookup: NgramProposer) -> tuple[list[int], int]:
    """(the drafts the recording knows, how many the round drafts). The draft model drafts all k
    (ModelProposer does), past the end of a run that ended at EOS too, where `guesses` stops."""
    if rec.proposer == "draft":
        return rec.guesses[pos:pos + k], k
    drafts = lookup.proposal(rec.prompt_ids + rec.output[:pos], k)
    return drafts, len(drafts)


def _round(rec: Recording, pos: int, k: int, lookup: NgramProposer) -> Round:
    drafts, drafted = _proposal(rec, pos, k, lookup)
    n = 0
    while n < len(drafts) and pos + n < len(rec.output) and drafts[n] == rec.output[pos + n]:
        n += 1
    committed = min(n + 1, len(rec.output) - pos)
    refused = drafts[n] if n < len(drafts) and pos + n < len(rec.output) else None  # past the
    return Round(pos, drafted, n, refused, committed)  # output's end (EOS) a draft's fate is unknown


@dataclass(frozen=True)
class Point:
    """A fixed-k replay's totals: what the curve plots and profiles.project prices."""
    k: int
    target_passes: int
    draft_passes: int
    tokens_per_pass: float
    predicted_seconds: float
    widths: tuple[tuple[int, int], ...]  # (tokens a target pass verifies, k + 1; passes), by width

    @classmethod
    def of(cls, rep: Replay) -> Point:
        widths = sorted(Counter(r.k + 1 for r in rep.rounds).items())
        return cls(rep.k, rep.target_passes, rep.draft_passes, rep.tokens_per_pass,
                   rep.predicted_seconds, tuple(widths))


def replay(rec: Recording, k: int) -> Replay:
    """The rounds a fixed-k run makes (the engine's budget rule included)."""
    if not (whole(k) and 1 <= k <= MAX_K):  # a negative k sliced the guesses from the end
        raise ValueError(f"k must be in 1..{MAX_K}, got {k!r}")
    lookup, pos, rounds = rec.lookup(), 0, []
    while pos < len(rec.output):
        r = _round(rec, pos, min(k, rec.max_new_tokens - pos - 1), lookup)
        rounds.append(r)
        pos += r.committed
    return Replay(k, tuple(rounds), rec)


def replay_adaptive(rec: Recording, k_max: int = 16) -> Replay:
    """The adaptive draft length (DraftLength) on the recorded costs and confidences, drafting
    at most k_max a round, like the live drafter run with k = k_max.

    It follows the live rule's schedule: rounds 1 and 2 draft min(4, k_max); round 1 (which
    paid both prefills) is not observed; the rule is first consulted in round 3. It is a
    prediction, not a recomputation, in three ways (`adaptive_differs`): past a refused draft the
    live draft's confidences follow its own wrong token, which the recording does not have (it
    holds the true prefix's), and the live rule learns from measured times, which carry noise,
    where this one uses the recorded mean draft pass and the run's fitted verify line
    (Recording.verify_line, whose spread in a fixed-k run comes from round 1's prompt pass, which
    the live drafter does not fit; the mean pass and the prior slope for older traces); and from
    round 3 on it drafts no further than the output's end, where a run that ended at EOS recorded
    no confidences for the rule to read: the live rule may draft on there, and pay for it, so
    near an EOS its lengths and draft passes are a lower bound.
    """
    if not rec.replays_adaptive:
        raise ValueError("the adaptive policy replays draft-model recordings with confidences: "
                         "record a greedy run of the draft drafter")
    if not 1 <= k_max <= MAX_K:
        raise ValueError(f"k must be in 1..{MAX_K}, got {k_max}")
    if rec.per_draft is None:  # an older trace: the flat mean and the prior slope
        rule = DraftLength(rec.draft_pass_seconds or 1e-9, rec.target_pass_seconds or 1e-9)
    else:  # the run's fitted line (round 1's prompt pass included)
        c_t, b = rec.per_draft
        rule = DraftLength(rec.draft_pass_seconds or 1e-9, c_t, slope=b / c_t)
    lookup, pos, rounds = rec.lookup(), 0, []
    while pos < len(rec.output):
        budget = min(k_max, rec.max_new_tokens - pos - 1)
        if len(rounds) < 2:  # like the live proposer: two rounds of min(4, k) measure the costs
            k = max(0, min(4, budget))
        else:
            k, stop = 0, rule.stopper()  # confidences past the output (a run that ended at EOS)
            for k in range(1, min(budget, len(rec.confidences) - pos) + 1):  # are not recorded
                if stop(rec.confidences[pos + k - 1]):
                    break
        r = _round(rec, pos, k, lookup)
        if rounds:  # the live rule skips round 1: it paid the prefills
            rule.observe(rec.confidences[pos:pos + r.k], r.accepted, r.committed,
                         r.k * rule.draft_pass + rule.round_target(r.k))
        rounds.append(r)
        pos += r.committed
    return Replay("adaptive", tuple(rounds), rec, k_max)


def adaptive_differs(rec: Recording) -> str:
    """How replay_adaptive differs from a live adaptive run, for this recording's costs."""
    line = ("the line fitted to the whole run, its prompt pass included" if rec.per_draft is not None
            else "the mean target pass, one more verified token at the prior slope of "
                 f"{VERIFY_SLOPE:.0%} of it (this recording holds no fitted verify line: a trace from "
                 "an older specviz, or a run whose passes fit none, one round or one width; its "
                 "predicted seconds price every pass at the mean)")
    return ("a prediction: past a refused draft the live draft's confidences follow its own "
            "wrong token (the recording holds the true prefix's), and the live rule learns "
            "from measured times, fitting the target's verify line (which every run on this "
            "target feeds: its last 32 drafted and 32 one-token rounds after each run's "
            "first), "
            f"where this uses the recorded costs: the mean draft pass and {line}; and after a "
            "run's EOS it drafts no further than the output's end, where no confidences were "
            "recorded (the live rule may draft on there and pay for it)")


def spans(rep: Replay) -> list[Span]:
    """Colour-coded spans of a replay: kept drafts, the target's token, the first refused draft
    (render.round_spans' order, which shows the refused drafts after the token that replaced them).
    A draft-model round's drafts past the output's end (a run that ended at EOS) are not shown:
    the recording does not hold them, and they commit nothing."""
    rec, out = rep.recording, []
    piece = (lambda i: rec.output_pieces[i]) if rec.output_pieces else (lambda i: str(rec.output[i]))
    for number, r in enumerate(rep.rounds, 1):
        for j in range(min(r.accepted, r.committed)):
            out.append(Span(piece(r.position + j), ACCEPTED, rec.output[r.position + j], number, j + 1))
        i = r.position + r.accepted
        if r.committed > r.accepted:  # the target's token, then the draft it replaced: as the Run tab
            fate = TARGET if not r.k else BONUS if r.rejected_token is None else RECOVERED
            out.append(Span(piece(i), fate, rec.output[i], number, 0))
        if r.rejected_token is not None:
            text = rec.guess_pieces[i] if rec.proposer == "draft" and rec.guess_pieces else \
                (rec.token_text or {}).get(str(r.rejected_token), f"⟨{r.rejected_token}⟩")
            out.append(Span(text, REJECTED, r.rejected_token, number, r.accepted + 1))
    return out
