"""Reading a trace: every field of an uploaded trace is untrusted, so each is typed and bounded
here, and checked against the rest (rounds count up, a round's tokens are its kept drafts and the
target's token, a tree's fates are what a walk of the rule leaves, a recording is of this run).

`fields_of` turns a parsed trace into the fields of a trace.Trace; trace.loads parses the JSON and
words the errors. Limits: docs/trace-format.md.
"""

from __future__ import annotations

from dataclasses import fields, replace
from itertools import pairwise, starmap
from operator import ge

import torch

from . import untrusted as u
from .engine import MAX_K, PROPOSERS, RoundEvent
from .explorer import EXPLORER_PROPOSERS, Recording
from .metrics import RunStats
from .render import LEGEND, Span, round_marks
from .settings import (
    DTYPES,
    TRACE_MAX_NEW_TOKENS,
    TRACE_MAX_PROMPT_CHARS,
    TRACE_MAX_PROMPT_TOKENS,
    UI_MAX_K,
    RunSettings,
)
from .settings import MAX_NAME_CHARS as MAX_SETTING_CHARS
from .tree import ACCEPTED, FATES, REJECTED, UNREACHED, TreeNode, first_branch
from .treedraft import MAX_BRANCHING, MAX_NODES
from .treeview import tree_run

FORMAT, VERSION = "specviz-trace", 1
# Limits (docs/trace-format.md). Every field of an opened trace is untrusted: each is typed and
# bounded here so that opening the largest trace accepted, views and k explorer included, stays
# within a couple of seconds.
MAX_TRACE_BYTES = 4 * 2**20
MAX_NEW_TOKENS = TRACE_MAX_NEW_TOKENS  # tokens one run generates (the app's default limit is 512)
MAX_ROUNDS = MAX_NEW_TOKENS  # every round commits at least one token
MAX_VOCAB = 2**20  # token ids are below this (below vocab_size when loads is given one)
MAX_POSITIONS = 2**20  # prompt + generated tokens, and the target's cache length
MAX_DEPTH = 16  # JSON nesting; a valid trace nests 6 deep (target_top2 pairs)
MAX_PASSES = MAX_ROUNDS * (MAX_K + 1)  # cumulative target or draft passes
# A tree round holds at most MAX_NODES (64) nodes, drafted at most MAX_K deep; the byte cap, not
# the round count, bounds a tree trace: 4 MiB holds about 45,000 of the smallest nodes.
SCORE_SLACK = 1e-6  # a node's score against its parent's score times its q (float rounding)
MAX_SECONDS = 1e6  # any recorded duration
MAX_NGRAM_SLOPE = 100.0  # the n-gram rule's prices (a token, the step), in target passes
MAX_LOGIT = 1e9  # |logit| in target_top2
MAX_SUMMARY_VALUES = 1000  # an informative summary's values, nested ones included
MAX_TEXT_CHARS = 1000  # one token's display text (spans, recording pieces and token_text)
MAX_NAME_CHARS = 256  # model names, device, pair
MAX_PROMPT_CHARS = TRACE_MAX_PROMPT_CHARS  # settings.prompt (an operator's limit stays within it)
MAX_TEMPERATURE = 100.0
# The k explorer's n-gram replay copies the context every round, for 18 values of k: about
# len(output) * (len(prompt) + len(output)) steps each. This bound (twice the app's largest run,
# 512 new tokens after a 2,048-token prompt: 0.8 s measured) keeps a hostile n-gram recording
# near 2 s; a longer one is refused.
MAX_NGRAM_REPLAY = 2 * 512 * (2048 + 512)
# Each replay also indexes every n-gram of the context, n = 1..ngram_size: (len(prompt) +
# len(output)) * ngram_size entries, bounded at twice the app's largest context at size 16.
MAX_NGRAM_INDEX = 2 * (2048 + 512) * 16
PROB_SLACK = 1e-6  # float32 rounding above 1.0 in a probability
MODEL_DTYPES = ("float32", "bfloat16", "float16", "float64")
SOURCES = PROPOSERS  # which drafter proposed a round ("draft", "ngram", "none", "adaptive", ...)


def ngram_replayable(prompt: int, output: int, ngram: int) -> bool:
    """Whether an n-gram recording of `output` tokens after a `prompt`-token prompt, at n-gram
    size `ngram`, is within both replay bounds (a run past them records none: it would not open;
    _recording refuses each bound with its own message)."""
    return output * (prompt + output) <= MAX_NGRAM_REPLAY and (prompt + output) * ngram <= MAX_NGRAM_INDEX


_EVENT_FIELDS = [f.name for f in fields(RoundEvent)]
_EVENT_OPTIONAL = ("target_top2", "tree")  # absent: no rows / a chain round (older traces)
_EVENT_KEYS = tuple(frozenset(_EVENT_FIELDS) - set(absent)  # dict_keys compare equal to sets
                    for absent in ((), ("target_top2",), ("tree",), _EVENT_OPTIONAL))
_EVENT_REQUIRED = [name for name in _EVENT_FIELDS if name not in _EVENT_OPTIONAL]
_NODE_FIELDS = [f.name for f in fields(TreeNode)]
_NODE_KEYS = frozenset(_NODE_FIELDS)
_SECONDS = ("draft_seconds", "target_seconds", "round_seconds", "elapsed")


def _top2(v, where: str, k: int, vocab: int) -> list[list[tuple[int, float]]]:
    """No rows, or k+1 rows (one per verified position) of two [id, logit] pairs."""
    rows = u.items(v, where, 0, k + 1, "rows")
    if rows and len(rows) != k + 1:
        u.fail(where, f"must have no rows or k+1 = {k + 1} rows, got {len(rows)}")
    try:  # unpacking takes any 2-item iterable; the type checks below leave only lists
        flat = [x for (a, b), (c, e) in rows for x in (a, b, c, e)]
    except (TypeError, ValueError):
        u.fail(where, "rows must each hold two [id, logit] pairs")
    u.ids(flat[0::2], f"{where} ids", vocab, 0, len(flat))
    u.numbers(flat[1::2], f"{where} logits", len(flat) // 2, -MAX_LOGIT, MAX_LOGIT)
    return [[(a, float(b)), (c, float(e))] for a, b, c, e in zip(*[iter(flat)] * 4, strict=True)]


def _tree(v, w: str, d: dict, vocab: int) -> tuple[TreeNode, ...]:
    """A tree round's verified nodes (none for a chain round), d being its checked event: a
    tree listed parents first, fates that a walk of the rule leaves, and the event's chain-shaped
    fields (k, draft_tokens, accepted, kind, probs) describing its walked branch. Checked a
    column at a time where possible: a trace holds up to about 45,000 nodes."""
    where = f"{w}.tree"
    raw = u.items(v, where, 0, MAX_NODES, "tree nodes")
    if not raw:
        if d["source"] == "tree" and d["k"]:
            u.fail(where, "must hold the verified nodes: a round of the tree drafter that drafted")
        return ()
    if d["source"] != "tree":
        u.fail(where, "must be empty: only the tree drafter's rounds (source 'tree') verify a tree")
    for i, node in enumerate(raw):
        if type(node) is not dict or node.keys() != _NODE_KEYS:
            u.keys(node, f"{where}[{i}]", _NODE_FIELDS, _NODE_FIELDS)
    column = {name: [node[name] for node in raw] for name in _NODE_FIELDS}
    parents, tokens, depths, fates = (column[name] for name in ("parent", "token", "depth", "fate"))
    m = len(raw)
    u.ids(tokens, f"{where}[].token", vocab, 0, m)
    for name in ("p", "q", "score"):
        u.numbers(column[name], f"{where}[].{name}", m, 0.0, 1.0 + PROB_SLACK)
    if not set(map(type, fates)) <= {str} or not set(fates) <= set(FATES):
        u.fail(f"{where}[].fate", f"must be one of {', '.join(FATES)}")
    # Whole columns first; the loops below run only to name the node that failed.
    if not set(map(type, parents)) <= {int} or min(parents) < -1 or any(map(ge, parents, range(m))):
        for i, parent in enumerate(parents):
            u.integer(parent, f"{where}[{i}].parent", -1, i - 1)  # parents come first
    ext = depths + [0]  # ext[-1]: the root's depth
    if not set(map(type, depths)) <= {int} or max(depths) > MAX_K or \
            [ext[parent] + 1 for parent in parents] != depths:
        for i, parent in enumerate(parents):
            if u.integer(depths[i], f"{where}[{i}].depth", 1, MAX_K) != ext[parent] + 1:
                u.fail(f"{where}[{i}].depth", f"must be {ext[parent] + 1}: its parent's depth + 1 "
                                             "(1 at the root)")
    if len(set(zip(parents, tokens, strict=True))) < m:
        seen: set[tuple[int, int]] = set()
        for i, pair in enumerate(zip(parents, tokens, strict=True)):
            if pair in seen:
                u.fail(f"{where}[{i}].token", "must differ from its siblings' tokens")
            seen.add(pair)
    q, score, p = (list(map(float, column[name])) for name in ("q", "score", "p"))
    ext = score + [1.0]  # ext[-1]: the root's score
    for i, (s, parent, x) in enumerate(zip(score, parents, q, strict=True)):
        if abs(s - ext[parent] * x) > SCORE_SLACK:
            u.fail(f"{where}[{i}].score", "must be its parent's score × its q (1 × q at the root)")
    kids: dict[int, list[int]] = {i: [] for i in range(-1, m)}  # parent -> children, in order
    for i, parent in enumerate(parents):
        kids[parent].append(i)
    # The walk: accepted nodes are a chain from the root; a tried (accepted or refused) child's
    # parent is on it, and at each such node the tries come first, in the draft's order; the
    # round ends at the chain's last node, whose children were all refused.
    path = [i for i, fate in enumerate(fates) if fate == ACCEPTED]
    n, k, draft = d["accepted"], d["k"], d["draft_tokens"]
    if len(path) != n:
        u.fail(f"{where}[].fate", f"must mark {n} nodes accepted (the event's accepted), got {len(path)}")
    if [parents[i] for i in path] != ([-1] + path)[:n]:
        u.fail(f"{where}[].fate", "must mark accepted a chain of nodes down from the root")
    if [tokens[i] for i in path] != draft[:n]:
        u.fail(f"{where}[].token", "of the accepted nodes must be draft_tokens[:accepted]")
    end = path[-1] if path else -1
    for node in (-1, *path):
        for before, after in pairwise(kids[node]):
            if fates[before] == UNREACHED and fates[after] != UNREACHED:
                u.fail(f"{where}[{after}].fate", "cannot follow an unreached sibling: children are "
                                                "tried in the draft's order")
    for c in kids[end]:
        if fates[c] != REJECTED:
            u.fail(f"{where}[{c}].fate", "must be 'rejected': the round ended at its parent, so "
                                        "every child there was refused")
    stray = next((i for i, fate in enumerate(fates)
                  if fate == REJECTED and parents[i] != -1 and fates[parents[i]] != ACCEPTED), None)
    if stray is not None:
        u.fail(f"{where}[{stray}].fate", "must be 'unreached': only children of the root or of an "
                                        "accepted node are tried")
    if (d["kind"] == "bonus") != (not kids[end]):
        u.fail(f"{w}.kind", "must be 'bonus' exactly when the last accepted node (or the root) has "
                           "no children")
    chain = path + first_branch(parents, end)  # the walked branch: then the first refused child
    if len(chain) != k or [tokens[i] for i in chain] != draft:
        u.fail(f"{w}.draft_tokens", "must be the tree's walked branch: the accepted nodes, then the "
                                   "first refused child and its first children down to a leaf")
    for name, values, letter in (("target_probs", p, "p"), ("draft_probs", q, "q")):
        if d[name] != [values[i] for i in chain]:
            u.fail(f"{w}.{name}", f"must be the walked branch's {letter}, node by node")
    q, score, p = _float32(q), _float32(score), _float32(p)  # saved to 9 digits: the exact values
    return tuple(starmap(TreeNode, zip(parents, tokens, depths, q, score, p, fates, strict=True)))


def _float32(values: list[float]) -> list[float]:
    return torch.tensor(values, dtype=torch.float32).tolist()


def _events(raw, where: str, lo: int, vocab: int) -> tuple[RoundEvent, ...]:
    """Events of one run: rounds 1, 2, ...; position = tokens committed before the round."""
    u.items(raw, where, lo, MAX_ROUNDS, "round events")
    out, position, passes, elapsed = [], 0, (0, 0), 0.0
    for i, d in enumerate(raw):
        w = f"{where}[{i}]"
        if type(d) is not dict or d.keys() not in _EVENT_KEYS:
            u.keys(d, w, _EVENT_FIELDS, _EVENT_REQUIRED)
        if d["round"] != i + 1 or type(d["round"]) is not int:
            u.fail(f"{w}.round", f"must be {i + 1}: rounds count 1, 2, ...")
        k = u.integer(d["k"], f"{w}.k", 0, MAX_K)
        n = u.integer(d["accepted"], f"{w}.accepted", 0, k)
        draft = u.ids(d["draft_tokens"], f"{w}.draft_tokens", vocab, k, k)
        token = u.integer(d["token"], f"{w}.token", 0, vocab - 1)
        if d["kind"] != ("bonus" if n == k else "recovered"):
            u.fail(f"{w}.kind", "must be 'bonus' when all k drafts were kept, else 'recovered'")
        new = u.ids(d["new_tokens"], f"{w}.new_tokens", vocab, 1, n + 1)
        if new != (draft[:n] + [token])[: len(new)]:
            u.fail(f"{w}.new_tokens", "must be the kept drafts then the target's token (possibly cut)")
        if len(new) <= n and d["stop"] != "eos":  # the engine drafts at most the budget less one
            u.fail(f"{w}.new_tokens", "may end before the target's token only at an EOS (stop 'eos'): "
                                      "the token budget leaves room for it")
        u.numbers(d["target_probs"], f"{w}.target_probs", k, 0.0, 1.0 + PROB_SLACK)
        u.numbers(d["draft_probs"], f"{w}.draft_probs", k, 0.0, 1.0 + PROB_SLACK)
        now = (u.integer(d["target_passes"], f"{w}.target_passes", passes[0], MAX_PASSES),
               u.integer(d["draft_passes"], f"{w}.draft_passes", passes[1], MAX_PASSES))
        if now[0] != i + 1:  # one target pass a round: tokens per pass and the plots read it
            u.fail(f"{w}.target_passes", f"must be {i + 1}: a round is one target pass")
        for name in _SECONDS:
            u.number(d[name], f"{w}.{name}", 0.0, MAX_SECONDS)
        if d["elapsed"] < elapsed:  # the time plot and the speed read it as a clock
            u.fail(f"{w}.elapsed", f"must be at least the round before's ({elapsed:g} s): it is the "
                                   "time since the run began")
        if d["position"] != position or type(d["position"]) is not int:
            u.fail(f"{w}.position", f"must be {position}, the tokens committed before this round")
        if d["source"] not in SOURCES:
            u.fail(f"{w}.source", f"must be one of {', '.join(SOURCES)}")
        u.integer(d["target_cache_length"], f"{w}.target_cache_length", 0, MAX_POSITIONS)
        if d["stop"] not in (None, "eos", "length"):
            u.fail(f"{w}.stop", "must be null, 'eos' or 'length'")
        top2 = _top2(d.get("target_top2", []), f"{w}.target_top2", k, vocab)
        tree = _tree(d.get("tree", []), w, d, vocab)
        probs = {name: _float32(d[name]) for name in ("target_probs", "draft_probs")} if tree else {}
        out.append(RoundEvent(**{**d, **{name: float(d[name]) for name in _SECONDS},
                                 "target_top2": top2, "tree": tree, **probs}))
        position, passes, elapsed = position + len(new), now, d["elapsed"]
        if position > MAX_NEW_TOKENS:
            u.fail(where, f"generate more than {MAX_NEW_TOKENS} tokens")
    return tuple(out)


_SPAN_FIELDS = [f.name for f in fields(Span)]
_SPAN_KEYS = (frozenset(_SPAN_FIELDS), frozenset(_SPAN_FIELDS) - {"keep"})  # older traces lack keep
_SPAN_REQUIRED = [name for name in _SPAN_FIELDS if name != "keep"]


def _spans(raw, events: tuple[RoundEvent, ...], vocab: int) -> tuple[Span, ...]:
    """Checked a column at a time (a trace holds up to ~10^5 spans)."""
    u.items(raw, "spans", 0, sum(e.k + 1 for e in events), "spans (at most k+1 a round)")
    for i, d in enumerate(raw):
        if type(d) is not dict or d.keys() not in _SPAN_KEYS:
            u.keys(d, f"spans[{i}]", _SPAN_FIELDS, _SPAN_REQUIRED)
    column = {name: [d.get(name) for d in raw] for name in _SPAN_FIELDS}
    u.texts(column["text"], "spans[].text", MAX_TEXT_CHARS)
    fates = column["fate"]
    if fates and (not set(map(type, fates)) <= {str} or not set(fates) <= LEGEND.keys()):
        u.fail("spans[].fate", f"must be one of {', '.join(LEGEND)}")
    u.ids(column["token"], "spans[].token", vocab, 0, len(raw))
    rounds, positions = column["round"], column["position"]
    u.numbers(rounds, "spans[].round", len(raw), 1, len(events))
    u.numbers(positions, "spans[].position", len(raw), 0, MAX_K)
    if not set(map(type, rounds + positions)) <= {int} or any(
            p > events[r - 1].k for r, p in zip(rounds, positions, strict=True)):
        u.fail("spans[].position", "must be integers in 0..k of the span's round")
    for name in ("p", "q", "keep"):
        u.numbers([x for x in column[name] if x is not None], f"spans[].{name}",
                  len(raw) - column[name].count(None), 0.0, 1.0 + PROB_SLACK)
    # the events say what each round shows: a span may differ from it in its text alone (its
    # numbers are taken from the events), or the token view could contradict the stats
    marks = [m for e in events for m in round_marks(e)]
    cut = {e.round for e in events if len(e.new_tokens) <= e.accepted}  # the output ended in its drafts
    if len(raw) > len(marks) and cut:  # traces before 2026-12-02 showed that round's refused drafts too
        raw = [d for d in raw if not (d["fate"] == "rejected" and d["round"] in cut)]
    for i, (m, d) in enumerate(zip(marks, raw, strict=False)):
        if (d["fate"], d["token"], d["round"], d["position"]) != (m.fate, m.token, m.round, m.position):
            u.fail(f"spans[{i}]", f"must be what its round's event shows there: fate {m.fate!r}, token "
                                  f"{m.token}, round {m.round}, position {m.position}")
    if len(marks) != len(raw):
        u.fail("spans", f"must be the {len(marks)} tokens the events show (drafts, kept or refused, "
                        f"and the target's own), got {len(raw)}")
    return tuple(replace(m, text=d["text"]) for m, d in zip(marks, raw, strict=True))


_RECORDING_FIELDS = [f.name for f in fields(Recording)]
_RECORDING_REQUIRED = ["proposer", "prompt_ids", "output", "guesses", "draft_pass_seconds",
                       "target_pass_seconds", "max_new_tokens"]


def _pieces(v, where: str, n: int) -> tuple[str, ...]:
    if type(v) is list and v and len(v) != n:
        u.fail(where, f"must have none or one per token ({n}), got {len(v)}")
    return tuple(u.texts(u.items(v, where, 0, n, "strings"), where, MAX_TEXT_CHARS))


def _recording(d, prompt_ids: list[int], tokens: list[int], vocab: int) -> Recording | None:
    """The k explorer's recording: it must be of this trace's run (same prompt and output)."""
    if d is None:
        return None
    u.keys(d, "recording", _RECORDING_FIELDS, _RECORDING_REQUIRED)
    if d["proposer"] not in EXPLORER_PROPOSERS:
        u.fail("recording.proposer", "must be draft or ngram")
    if d["prompt_ids"] != prompt_ids:
        u.fail("recording.prompt_ids", "must equal the trace's prompt_ids")
    output = u.ids(d["output"], "recording.output", vocab, 0, MAX_NEW_TOKENS)
    if output != tokens:
        u.fail("recording.output", "must equal the tokens the events committed")
    n, draft = len(output), d["proposer"] == "draft"
    guesses = u.ids(d["guesses"], "recording.guesses", vocab, n if draft else 0, n)
    if not draft and n * (len(prompt_ids) + n) > MAX_NGRAM_REPLAY:  # (ngram_replayable's first bound)
        u.fail("recording", f"is an n-gram recording too long to replay: output tokens × (prompt + "
                           f"output) must be at most {MAX_NGRAM_REPLAY} (set recording to null to "
                           "open the rest)")
    seconds = {name: u.number(d[name], f"recording.{name}", 0.0, MAX_SECONDS)
               for name in ("draft_pass_seconds", "target_pass_seconds")}
    max_new = u.integer(d["max_new_tokens"], "recording.max_new_tokens", max(n, 1), MAX_NEW_TOKENS)
    ngram = u.integer(d.get("ngram_size", 3), "recording.ngram_size", 1, 16)
    if not draft and (len(prompt_ids) + n) * ngram > MAX_NGRAM_INDEX:  # (and its second)
        u.fail("recording", f"is an n-gram recording too long to replay: (prompt + output tokens) × "
                           f"ngram_size must be at most {MAX_NGRAM_INDEX} (set recording to null to "
                           "open the rest)")
    out_pieces = _pieces(d.get("output_pieces", []), "recording.output_pieces", n)
    guess_pieces = _pieces(d.get("guess_pieces", []), "recording.guess_pieces", len(guesses))
    text = d.get("token_text")
    if text is not None:
        if type(text) is not dict or len(text) > len(prompt_ids) + n:
            u.fail("recording.token_text", "must be an object with at most one entry per prompt "
                                          "and output token")
        keys = list(text)
        if keys and not ("".join(keys).isascii() and "".join(keys).isdigit() and 1 <= min(map(len, keys))
                         and max(map(len, keys)) <= 7 and max(map(int, keys)) < vocab):
            u.fail("recording.token_text", f"keys must be token ids in 0..{vocab - 1}")
        u.texts(list(text.values()), "recording.token_text", MAX_TEXT_CHARS)
    confidences = d.get("confidences", [])
    if type(confidences) is not list or len(confidences) not in (0, n):
        u.fail("recording.confidences", "must be a list of probabilities, one per output token")
    u.numbers(confidences, "recording.confidences", len(confidences), 0.0, 1.0 + PROB_SLACK)
    line = d.get("verify_line")
    if line is not None:
        line = tuple(u.numbers(line, "recording.verify_line", 2, 0.0, MAX_SECONDS))
        if line[0] <= 0:
            u.fail("recording.verify_line", "must start with a positive intercept (seconds)")
    slope = d.get("ngram_slope")
    if slope is not None:
        slope = u.number(slope, "recording.ngram_slope", 0.0, MAX_NGRAM_SLOPE)
    step = d.get("ngram_step")
    if step is not None:
        step = u.number(step, "recording.ngram_step", 0.0, MAX_NGRAM_SLOPE)
    reads_on = d.get("ngram_reads_on")
    if reads_on is not None and type(reads_on) is not bool:
        u.fail("recording.ngram_reads_on", "must be true, false or null")
    return Recording(d["proposer"], prompt_ids, output, guesses, seconds["draft_pass_seconds"],
                     seconds["target_pass_seconds"], max_new, ngram, out_pieces, guess_pieces, text,
                     confidences, line, slope, step, reads_on)


# The tree drafter's two settings are typed here too, so tree traces open whether or not this
# specviz's RunSettings lists them (older traces simply lack them).
_SETTING_TYPES = {f.name: getattr(f.type, "__name__", str(f.type)) for f in fields(RunSettings)} | {
    "nodes": "int", "branching": "int"}
_SETTING_RULES = {
    "nodes": (0, MAX_NODES), "branching": (0, MAX_BRANCHING),  # 0: sized each round, widened
    "proposer": PROPOSERS, "dtype": DTYPES, "prompt": MAX_PROMPT_CHARS,
    "k": (1, UI_MAX_K), "top_k": (0, MAX_VOCAB), "seed": (-(2**63), 2**64 - 1),
    "max_new_tokens": (1, MAX_NEW_TOKENS), "temperature": (0.0, MAX_TEMPERATURE), "top_p": (0.0, 1.0),
}


def _settings(d) -> dict:
    """A subset of RunSettings' fields, each of its type and within the app's bounds."""
    u.keys(d, "settings", _SETTING_TYPES)
    for name, value in d.items():
        where, kind, rule = f"settings.{name}", _SETTING_TYPES[name], _SETTING_RULES.get(name)
        if kind == "bool":
            if type(value) is not bool:
                u.fail(where, "must be true or false")
        elif kind == "str" and isinstance(rule, tuple):
            if value not in rule:
                u.fail(where, f"must be one of {', '.join(rule)}")
        elif kind == "str":
            u.text(value, where, rule or MAX_SETTING_CHARS)  # a custom pair's names: as the page takes
        elif kind == "int":
            u.integer(value, where, *(rule or (-(2**63), 2**63)))
        else:
            u.number(value, where, *(rule or (-1e6, 1e6)))
    if d.get("top_p") == 0:
        u.fail("settings.top_p", "must be in (0, 1]")
    return d


def _models(d) -> dict:
    u.keys(d, "models", ("target", "draft", "dtype", "device", "numerics", "source"))
    for name, value in d.items():
        if name == "dtype" and value is not None and value not in MODEL_DTYPES:
            u.fail("models.dtype", f"must be null or one of {', '.join(MODEL_DTYPES)}")
        u.text(value, f"models.{name}", MAX_NAME_CHARS, null=True)
    return d



_TOP_KEYS = ("format", "version", "settings", "models", "prompt_ids", "events", "baseline", "spans",
             "summary", "recording", "chain", "node_text")


def fields_of(d, vocab: int) -> dict:
    """The checked fields of a trace.Trace, from a parsed trace; u.Invalid names what is wrong."""
    if type(d) is not dict or d.get("format") != FORMAT:
        u.fail('"format"', f'must be "{FORMAT}"')
    version = d.get("version")
    if type(version) is not int or version != VERSION:
        u.fail("version", f"{u.clip(version)} is not supported (this specviz reads version {VERSION})")
    u.keys(d, "the top level", _TOP_KEYS, ("settings", "models", "prompt_ids", "events", "spans"))
    _summary(d.get("summary"))
    prompt_ids = u.ids(d["prompt_ids"], "prompt_ids", vocab, 1, TRACE_MAX_PROMPT_TOKENS)  # 2^20 - 4,096
    events = _events(d["events"], "events", 1, vocab)
    baseline = _events(d.get("baseline", []), "baseline", 0, vocab)
    chain = _events(d.get("chain", []), "chain", 0, vocab)
    if chain and not tree_run(events):  # a 1-token tree run verified no tree, yet has its chain
        u.fail("chain", "is for a tree run's comparison only: a chain run's trace has none")
    if any(e.tree for e in chain):
        u.fail("chain", "must be a chain run: its rounds have no tree")
    node_text = _node_text(d.get("node_text"), events)
    tokens = [t for e in events for t in e.new_tokens]
    settings = _settings(d["settings"])
    # the stats table and the figures name these runs by what they are
    bad = next((i for i, e in enumerate(baseline) if e.k or e.source != "none" or e.draft_passes), None)
    if bad is not None:
        u.fail(f"baseline[{bad}]", "must be a round of the target alone: k 0, source 'none', no draft passes")
    k = settings.get("k", MAX_K)
    bad = next((i for i, e in enumerate(chain) if e.source != "draft" or e.k > k), None)
    if bad is not None:
        u.fail(f"chain[{bad}]", "must be a round of the chain drafter at the run's k: source 'draft', k at "
                                "most settings.k")
    for where, run in (("events", events), ("baseline", baseline), ("chain", chain)):
        if sum(len(e.new_tokens) for e in run) > settings.get("max_new_tokens", MAX_NEW_TOKENS):
            u.fail(where, "commit more tokens than settings.max_new_tokens")
    recording = _recording(d.get("recording"), prompt_ids, tokens, vocab)
    if recording is not None:  # priced at this run's own C_D and C_T, the means after round 1:
        stats = RunStats.of(events)  # older traces averaged every round, prefills included
        recording = replace(recording, draft_pass_seconds=stats.draft_pass_seconds,
                            target_pass_seconds=stats.target_pass_seconds)
    return {"settings": settings, "models": _models(d["models"]), "prompt_ids": prompt_ids,
            "events": events, "spans": _spans(d["spans"], events, vocab), "baseline": baseline,
            "recording": recording, "chain": chain, "node_text": node_text}


def _summary(summary) -> None:
    """The summary is informative (recomputed on load) and dropped once read: an object of at
    most MAX_SUMMARY_VALUES values, nested or not (RunStats.summary() holds 22 + 2k + 1: 29 at
    k = 3, 87 at k = 32), since the app charges an opened trace's memory by its whole text, and a
    summary of a million empty lists was charged 100 MiB for nothing kept."""
    if summary is None:
        return
    if type(summary) is not dict:
        u.fail("summary", "must be an object (it is informative: recomputed on load)")
    stack, seen = [summary], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > MAX_SUMMARY_VALUES:
            u.fail("summary", f"must hold at most {MAX_SUMMARY_VALUES:,} values (it is informative: "
                              'recomputed on load; set it to {} to open the rest)')
        if type(value) is dict:
            stack.extend(value.values())
        elif type(value) is list:
            stack.extend(value)


def _node_text(text, events: list) -> dict[str, str] | None:
    """Texts of the tree runs' node tokens: at most one per distinct node token of the events,
    keyed by that token's id (a string, as JSON keys are), each at most MAX_TEXT_CHARS."""
    if text is None:
        return None
    nodes = {str(n.token) for e in events for n in e.tree}
    if type(text) is not dict or not set(text) <= nodes:
        u.fail("node_text", "must be an object keyed by the ids of the events' tree-node tokens")
    u.texts(list(text.values()), "node_text", MAX_TEXT_CHARS)
    return text
