"""python -m specviz bench: specviz against transformers `generate` on the same loaded models.

Methods run interleaved (repeat > prompt > method) in one process, so machine drift hits all
alike. Greedy only: every method's output is compared with the target alone's.

Token trees (`specviz:tree-<depth>[-n<nodes>][-b<branching>]`; no -n: sized each round from the
measured verify cost; no -b: the width adapts from 3 children) run beside the chain at the same
depth (`specviz:draft-<depth>`), and the summary holds their ratios tree / chain in tokens per
target pass and tokens per second, with issue 13's goals (TREE_GOALS) marked pass or fail per class.
"""

from __future__ import annotations

import copy
import json
import platform
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import GenerationConfig

from . import benchreport as report
from . import fastpath, profiles, quant
from .benchreport import ALONE, TREE_NAME, tree_method, tree_name
from .compare import Comparison, compare, first_difference, parted, top2_at
from .engine import MAX_K, NEEDS_DRAFT, generate, round_room
from .lm import first_line
from .loading import Pair
from .metrics import RunStats
from .proposers import kept_of
from .treedraft import check_tree_settings

PROMPTS = Path(__file__).parent.parent / "assets" / "bench_prompts.json"
DEFAULT_KS = (1, 2, 3, 4, 6, 8)
NGRAM_K = 8  # tokens an n-gram round may propose (specviz and transformers alike)
ADAPTIVE_K = 16  # the most the adaptive drafter may draft in a round
PLAIN_HEAD = "specviz-plainhead"  # specviz with the target's head in its own dtype
# Tokens each method runs untimed before the timed runs where specviz's steps compile or capture:
# each new width compiles or captures on its first use (0.1-0.5 s a capture on the H200, seconds
# to tens of seconds a compile), which would land in that method's first timed run.
WARM_TOKENS = 16


@dataclass(frozen=True)
class Record:
    method: str
    family: str  # "specviz", "transformers" or PLAIN_HEAD
    k: int | None
    prompt: int
    cls: str
    repeat: int
    tokens: int
    seconds: float
    target_passes: int | None = None
    alpha: float | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None
    other_seconds: float | None = None
    peak_rss_gib: float = 0.0
    matches_target: bool | None = None
    first_difference: int | None = None
    draft_passes: int | None = None
    widths: dict[int, int] | None = None  # target passes by tokens verified (1 + k or 1 + nodes)
    nodes_verified: int | None = None  # drafted tokens the target verified (tree nodes, or each k)
    accepted: int | None = None  # drafted tokens kept
    rejections: int | None = None  # drafts the rule tested and refused (RunStats.rejections)
    decode_tokens: int | None = None  # committed after round 1 (which also paid the prefills)
    decode_seconds: float | None = None  # from the end of round 1 to the end of the run
    difference: str | None = None  # why a specviz output differs from specviz's target alone
    # (compare.Comparison's verdict and both runs' top-2 margins there), None where it matches

    @property
    def passes(self) -> profiles.Passes | None:
        return None if self.widths is None else profiles.Passes(self.draft_passes or 0, self.widths,
                                                                bool(TREE_NAME.fullmatch(self.method)),
                                                                self.k or 0)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """tok/s after round 1 (RunStats.decode_tokens_per_second); None for a transformers run."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else None


class PeakRSS:
    """Samples this process's resident memory every 20 ms while a method runs."""

    def __enter__(self):
        import psutil  # not at import time: the CLI imports this module for any command

        self.peak, self._stop = 0, threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def specviz_method(proposer: str, k: int, **tree):
    """tree: nodes and branching of proposer="tree"."""
    def run(pair, ids, n):
        stats = RunStats.of(generate(pair, ids, proposer=proposer, k=k, max_new_tokens=n, **tree))
        return stats.tokens, dict(target_passes=stats.target_passes, alpha=stats.alpha,
                                  draft_seconds=stats.draft_seconds, target_seconds=stats.target_seconds,
                                  other_seconds=stats.overhead_seconds,
                                  draft_passes=stats.draft_passes, widths=widths_of(stats.events),
                                  nodes_verified=stats.nodes_verified, accepted=stats.accepted,
                                  rejections=stats.rejections, decode_tokens=stats.decode_tokens,
                                  decode_seconds=stats.decode_seconds,
                                  _stats=stats)
    return run


def widths_of(events) -> dict[int, int]:
    """Target passes by tokens verified: 1 + the round's nodes (a chain's k, a tree's nodes)."""
    return dict(Counter(e.nodes + 1 for e in events))


class PassCounter:
    """Counts a model's top-level forward calls: transformers' target passes, prefill included,
    which is how specviz counts its own (round 1 carries the prompt)."""

    def __init__(self, model):
        self.model, self.passes = model, 0

    def __enter__(self):
        self._hook = self.model.register_forward_pre_hook(self._count)
        return self

    def _count(self, module, args):
        self.passes += 1

    def __exit__(self, *exc):
        self._hook.remove()


def plain_greedy(model) -> GenerationConfig:
    """The model's generation config with every logits processor off, so `generate` computes
    the same raw-logit greedy as specviz (a hub config may set repetition_penalty etc.)."""
    config = copy.deepcopy(model.generation_config)
    # neutral values, not None: generate fills a None from the model's own config
    config.update(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0,
                  repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
                  encoder_no_repeat_ngram_size=0, min_length=0, min_new_tokens=0,
                  bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
                  sequence_bias=None, forced_bos_token_id=None, forced_eos_token_id=None,
                  exponential_decay_length_penalty=None, renormalize_logits=False)
    return config


def rows(model) -> int:
    """A model's vocabulary size as transformers' assisted generation compares it."""
    return model.config.get_text_config().vocab_size


def hf_method(kind: str, k: int):
    def run(pair, ids, n):
        kwargs = dict(max_new_tokens=n, generation_config=plain_greedy(pair.target))
        if kind == "assisted":
            config = pair.draft.generation_config
            config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
            config.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = pair.draft
            if rows(pair.draft) != rows(pair.target):  # a padded vocabulary (Qwen2.5 7B's 152,064
                # rows, 0.5B's 151,936): transformers refuses assisted generation without both
                # tokenizers, and with them runs its universal assisted decoding (text re-encoded
                # each round), what it does for such a pair
                kwargs.update(tokenizer=pair.tokenizer, assistant_tokenizer=pair.tokenizer)
        elif kind == "lookup":
            kwargs["prompt_lookup_num_tokens"] = k
        with torch.inference_mode(), PassCounter(pair.target) as counter:
            out = pair.target.generate(torch.tensor([ids], device=pair.device), **kwargs)
        alone = {1: counter.passes} if kind == "target" else None  # others' widths are not observed
        return out[0, len(ids):].tolist(), dict(target_passes=counter.passes, draft_passes=0, widths=alone)
    return run


def passes_on_text(prompt: list[int], out: list[int], propose) -> int:
    """Greedy target passes a deterministic drafter needs to write exactly `out` after `prompt`:
    each round keeps the proposed tokens that agree with out, plus the target's own token.

    Run on the target alone's output, it compares drafting rules on one text, free of the
    timing noise and of the bf16 near-ties that make live runs write slightly different texts.
    propose(ids, budget) -> proposed ids."""
    position = passes = 0
    while position < len(out):
        proposal = propose(prompt + out[:position], len(out) - position - 1)
        kept = kept_of(proposal, out[position:])
        position, passes = position + kept + 1, passes + 1
    return passes


def lookup_rules(pair, prompt: list[int], max_new_tokens: int) -> dict:
    """The two n-gram drafters compared by passes_on_text: specviz's, and transformers' prompt
    lookup (its own candidate generator, as generate(prompt_lookup_num_tokens=8) builds it)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from .engine import ngram_price
    from .proposers import NgramProposer

    ngram = NgramProposer(3, *ngram_price(pair))  # as the engine drafts: priced by the target's
    # measured verify line (the prior 0.04 a token, no step, made other passes: 18 for 20)
    hf = PromptLookupCandidateGenerator(torch.tensor(sorted(pair.eos_ids)), num_output_tokens=NGRAM_K,
                                        max_length=len(prompt) + max_new_tokens)

    def lookup(ids, budget):
        candidates = hf.get_candidates(torch.tensor([ids]))[0][0, len(ids):].tolist()
        return candidates[:budget]

    return {f"specviz:ngram-{NGRAM_K}": lambda ids, budget: ngram.proposal(ids, min(NGRAM_K, budget)),
            f"hf:lookup-{NGRAM_K}": lookup}


def methods(ks, names: set[str] | None, has_draft: bool, quant_draft: bool = False,
            tree_nodes=()) -> dict[str, tuple[str, int | None, object]]:
    """{name: (family, k, runner)} in a fixed order; names filters by name or family prefix.

    Trees: specviz:tree-k (sized from the measured cost) for each k, and specviz:tree-k-n<N> for
    each fixed budget in tree_nodes; any other tree shape by its name in `names`. Each selected
    tree brings the chain at its depth (specviz:draft-<depth>), which its ratios compare with."""
    table = {"hf:target": ("transformers", None, hf_method("target", 0)),
             "specviz:none": ("specviz", None, specviz_method("none", 1)),
             f"hf:lookup-{NGRAM_K}": ("transformers", NGRAM_K, hf_method("lookup", NGRAM_K)),
             f"specviz:ngram-{NGRAM_K}": ("specviz", NGRAM_K, specviz_method("ngram", NGRAM_K))}
    if has_draft:
        for k in ks:
            table[f"hf:assisted-{k}"] = ("transformers", k, hf_method("assisted", k))
            if quant_draft and k == 4:  # transformers on specviz's quantized draft, for transparency
                table[f"hf:assisted-{k}-qdraft"] = ("transformers", k, hf_method("assisted", k))
            table[f"specviz:draft-{k}"] = ("specviz", k, specviz_method("draft", k))
            for nodes in (None, *tree_nodes):
                table[tree_name(k, nodes)] = ("specviz", k, specviz_method("tree", k, nodes=nodes))
        table[f"specviz:hybrid-{NGRAM_K}"] = ("specviz", NGRAM_K, specviz_method("hybrid", NGRAM_K))
        table["specviz:adaptive"] = ("specviz", ADAPTIVE_K, specviz_method("adaptive", ADAPTIVE_K))
    if names:
        table = {m: v for m, v in table.items()
                 if m in names or m.split(":")[0] in names or m.split("-")[0] in names}
        for name in [n for n in ("specviz:none-plainhead", "specviz:draft-4-plainhead") if n in names]:
            # in this order: the family's target alone runs first, so its draft run is compared
            # the target's head left in its own dtype (no float32 refinement): what it costs
            run = specviz_method(name.split(":")[1].split("-")[0], 4)
            table[name] = (PLAIN_HEAD, 4,
                           lambda pair, ids, n, run=run: run(replace(pair, refine=False), ids, n))
        for name in sorted(names):
            shape = tree_method(name)
            if shape and has_draft and name not in table:
                depth, nodes, branching = shape
                runner = specviz_method("tree", depth, nodes=nodes, branching=branching)
                table[name] = ("specviz", depth, runner)
    for name, (_, depth, _) in list(table.items()):
        chain = f"specviz:draft-{depth}"
        if tree_method(name) and chain not in table:
            table[chain] = ("specviz", depth, specviz_method("draft", depth))
    return table


def selects(name: str, table) -> bool:
    """A --methods entry names one of table's methods, or its family (hf, specviz) or kind."""
    return any(name in (m, m.split(":")[0], m.split("-")[0]) for m in table)


def check_methods(names: set[str], ks, tree_nodes=(), has_draft: bool = True) -> None:
    """ValueError for a --methods entry that selects nothing (checked before the models load), or,
    without a draft model, one whose every method runs one (specviz:none,specviz:draft-4 ran
    specviz:none alone without a word; specviz:draft-4-plainhead failed after the load)."""
    known = methods(ks, None, True, True, tree_nodes)
    for name in sorted(names):
        if name in ("specviz:none-plainhead", "specviz:draft-4-plainhead"):
            continue
        if not tree_method(name) and not selects(name, known):
            raise ValueError(f"--methods: {name[:40]!r} selects no method: give names (specviz:draft-4, "
                             "specviz:tree-4-n16), families (hf, specviz) or kinds (specviz:tree); a "
                             "draft-k or assisted-k name needs its k in --ks; the n-gram ones are "
                             f"specviz:ngram-{NGRAM_K} and hf:lookup-{NGRAM_K}")
    alone = methods(ks, None, False, True, tree_nodes)
    drafted = [n for n in sorted(names) if n != "specviz:none-plainhead" and not selects(n, alone)]
    if not has_draft and drafted:
        raise ValueError(f"--methods {','.join(drafted)[:80]}: each needs a draft model: add --draft "
                         "MODEL, or pick methods of the target alone (hf:target, specviz:none, the n-gram "
                         "ones)")


def uses_draft(name: str) -> bool:
    """A method that runs the draft model (so the draft's positions bound it too): transformers'
    assisted generation, and specviz's drafters that need one (engine.NEEDS_DRAFT)."""
    family, method = name.split(":", 1)
    if family == "hf":
        return method.startswith("assisted")
    return bool(tree_method(name)) or method.split("-")[0] in NEEDS_DRAFT


def chats(pair) -> bool:
    """The bench reads its prompts through the tokenizer's chat template, where it has one."""
    return bool(getattr(pair.tokenizer, "chat_template", None))


def encode(pair, prompt: str) -> list[int]:
    """A bench prompt's ids: chat-formatted, or the text alone for a tokenizer without a chat template
    (a base model: the gpt2 and pythia presets failed after the load, "has no chat template: turn
    chat off", which the bench has no flag for)."""
    return pair.encode(prompt, chat=chats(pair))


def run_bench(pair, prompts, ks=DEFAULT_KS, max_new_tokens=64, repeats=1, names=None, log=None,
              spec_pair=None, tree_nodes=()) -> tuple[list[Record], dict[int, list[int]], list[str]]:
    """Records of every run, the target alone's output per prompt index (when a baseline ran),
    and what cut the bench short: a method that raised (left out of the runs after it; the
    others go on) or a Ctrl-C (the runs before it are kept). spec_pair: the pair specviz
    methods run on (e.g. with a quantized draft)."""
    spec_pair = spec_pair or pair
    log = log or (lambda line: print(line, flush=True))
    table = methods(ks, names, pair.draft is not None, spec_pair.draft is not pair.draft, tree_nodes)
    encoded = [encode(pair, p["prompt"]) for p in prompts]
    # every prompt's run fits the models, before any method runs (transformers' methods ran past
    # the target's positions with a warning, and a specviz method refused it after them)
    room = max(round_room("tree" if tree_method(name) else "draft", k or 1) for name, (_, k, _) in
               table.items())
    drafted = any(uses_draft(name) for name in table)
    for ids in encoded:
        spec_pair.check_length(len(ids), max_new_tokens, room, drafted=drafted)
    stops: list[str] = []  # a method that failed, or the Ctrl-C

    def failed(name: str, e: Exception, where: str) -> None:
        # one method's error (a model it cannot run, memory) lost every run of an hours-long bench
        stops.append(f"{name} failed {where}: {type(e).__name__}: {first_line(e)[:300]}; "
                     "it was left out of the runs after that")
        log(stops[-1])
        del table[name]

    # warm-up; a chain's rounds also start the target's verify line, which the baseline's rounds
    # complete before the first n-gram run reads it (engine.ngram_price)
    for warmed in [spec_pair, pair] if spec_pair is not pair else [pair]:
        # the specviz methods' pair, and the one transformers' assisted methods run (a draft as loaded)
        list(generate(warmed, encoded[0], proposer="draft" if warmed.draft is not None else "ngram",
                      max_new_tokens=24))
    if "hf:target" in table:  # transformers' generate warms its own paths (its first call ran 15% slow)
        try:
            table["hf:target"][2](pair, encoded[0], 8)
        except Exception as e:  # noqa: BLE001 - said, and the other methods go on
            failed("hf:target", e, "warming up")
    if any(tree_method(name) for name in table):
        list(generate(spec_pair, encoded[0], proposer="tree", max_new_tokens=8))  # the tree paths too
    if fastpath.resolve_fast(spec_pair.fast, spec_pair.target)[1] is not None:
        for name, (family, _, runner) in list(table.items()):  # each method's own widths, untimed
            try:
                runner(runs_on(name, family, pair, spec_pair), encoded[0], WARM_TOKENS)
            except Exception as e:  # noqa: BLE001 - said, and the other methods go on
                failed(name, e, "warming up")
    reference: dict[tuple[str, int], list[int]] = {}  # (family, prompt) -> target alone's output
    alone: dict[tuple[str, int], RunStats | None] = {}  # its run, where specviz made it
    records: list[Record] = []
    try:
        for repeat in range(repeats):
            for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True)):
                for name, (family, k, runner) in list(table.items()):
                    with PeakRSS() as rss:
                        start = time.perf_counter()
                        on = runs_on(name, family, pair, spec_pair)
                        try:
                            tokens, details = runner(on, ids, max_new_tokens)
                        except Exception as e:  # noqa: BLE001 - said, and the other methods go on
                            failed(name, e, f"on prompt #{i} ({p['class']}, repeat {repeat})")
                            continue
                        seconds = time.perf_counter() - start
                    stats = details.pop("_stats", None)
                    ref = reference.get((family, i))
                    if name in ALONE and ref is None:  # it sets its family's reference (each family
                        reference[family, i] = tokens  # against its own target alone, every repeat)
                        alone[family, i] = stats
                    hf = reference.get(("transformers", i)) if family != "transformers" else None
                    if name in ALONE and hf is not None:  # a target alone against transformers' own
                        compared, diff = hf, first_difference(tokens, hf)
                        why = None if diff is None else explain_alone(stats, hf, ids, diff, on)
                    elif name in ALONE and ref is None:  # the first of its prompt: compared with nothing
                        compared = diff = why = None
                    else:
                        compared = ref
                        diff = None if ref is None else first_difference(tokens, ref)
                        why = None if diff is None else explain(stats, alone.get((family, i)), on)
                    rec = Record(name, family, k, i, p["class"], repeat, len(tokens), seconds,
                                 peak_rss_gib=rss.peak / 2**30, matches_target=None if compared is None
                                 else diff is None, first_difference=diff, difference=why, **details)
                    records.append(rec)
                    rate = rec.decode_tokens_per_second
                    decode = "" if rate is None else f" ({rate:.2f} after round 1)"
                    parted = "" if rec.matches_target in (True, None) else \
                        f"  differs from output token {diff + 1}: {why}"  # 1-based, as the CLI counts
                    log(f"[{repeat}] {p['class']:9} #{i} {name:22} {rec.tokens_per_second:6.2f} tok/s{decode}"
                        f"{parted}")
    except KeyboardInterrupt:  # an hours-long bench stopped by hand keeps what it measured
        done = Counter(r.method for r in records)  # the runs of the methods left, and those made
        planned = len(records) + sum(repeats * len(prompts) - done[name] for name in table)
        stops.append(f"interrupted (Ctrl-C) after {len(records)} of {planned} runs; the summary is "
                     "of those")
        log(stops[-1])
    return records, reference_texts(reference), stops


def runs_on(name: str, family: str, pair, spec_pair):
    """The pair a method runs on: specviz's (spec_pair), transformers' own with the draft as loaded
    (pair), or a "-qdraft" control of transformers' on specviz's draft."""
    return spec_pair if family != "transformers" or name.endswith("-qdraft") else pair


TEXT_PRIORITY = {"transformers": 2, "specviz": 1}  # whose target alone the n-gram replays read


def reference_texts(reference: dict[tuple[str, int], list[int]]) -> dict[int, list[int]]:
    """prompt -> the target alone's output: transformers' where it ran, else specviz's (the
    refined head's), the plain head's only where neither ran."""
    ranked = sorted(reference.items(), key=lambda r: TEXT_PRIORITY.get(r[0][0], 0))
    return {i: t for (_, i), t in ranked}  # the highest priority written last


def explain(spec: RunStats | None, base: RunStats | None, pair) -> str:
    """Why two greedy specviz runs part (compare.compare): a floating-point near-tie, or not."""
    if spec is None or base is None:
        return "not explained (only specviz runs carry the top-2 logits)"
    return described(compare(spec, base, pair.dtype, pair.device, pair.numerics))


def described(c: Comparison) -> str:
    """A comparison's verdict, both runs' top-2 margins and the near-tie bound, in one line."""
    margins = " / ".join(f"{m:.3g}" for m in (c.margin(c.spec_top2), c.margin(c.base_top2)) if m is not None)
    bound = "-" if c.threshold is None else f"{c.threshold:.3g}"
    return f"{c.verdict} (top-2 margins {margins or '-'}; near-tie bound {bound})"


def explain_alone(stats: RunStats | None, hf: list[int], ids: list[int], diff: int, pair) -> str:
    """Why a specviz target alone parts from transformers' at output token `diff`: the two runs'
    top-2 margins there (specviz's as its run recorded them; transformers' from one plain pass of
    the target over the context they share), against the near-tie bound."""
    with torch.inference_mode():
        context = torch.tensor([ids + hf[:diff]], device=pair.device)
        top = pair.target(input_ids=context, logits_to_keep=1).logits[0, -1].float().topk(2)  # [2]
    hf_top2 = list(zip(top.indices.tolist(), top.values.tolist(), strict=True))
    spec_top2 = top2_at(stats, diff) if stats is not None else None
    c = parted(diff, spec_top2, hf_top2, pair.dtype, pair.device, pair.numerics)
    return f"against transformers' target alone: {described(c)}"


def same_text_passes(pair, prompts, texts: dict[int, list[int]], max_new_tokens: int) -> dict:
    """{class: {drafter: passes}} of the n-gram drafters on the target alone's outputs (texts:
    prompt index -> output ids)."""
    out: dict[str, dict[str, int]] = {}
    for i, text in sorted(texts.items()):
        ids = encode(pair, prompts[i]["prompt"])
        row = out.setdefault(prompts[i]["class"], {})
        for name, propose in lookup_rules(pair, ids, max_new_tokens).items():
            row[name] = row.get(name, 0) + passes_on_text(ids, text, propose)
    return out


def load_profile(value: str) -> profiles.Profile:
    """--profile: a shipped profile's name (assets/profiles/) or a profile file."""
    if value in profiles.shipped():
        return profiles.load_shipped(value)
    try:
        exists = Path(value).exists()
    except OSError:  # a name too long for a path: the errno and the whole name, no fix
        exists = False
    if not exists:  # a mistyped name said only "No such file or directory"
        raise ValueError(f"--profile {value[:60]!r}: no such file, and no shipped profile of that name: "
                         f"give a profile file, or one of {', '.join(profiles.shipped())}")
    try:
        return profiles.load(Path(value))
    except ValueError as e:  # "a cost profile must be JSON" named neither the file nor what to give
        raise ValueError(f"--profile {value[:60]!r}: {e}: give a profile file that `python -m specviz "
                         f"gpucheck` wrote, or one of {', '.join(profiles.shipped())}") from None


def machine() -> dict:
    import psutil

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def add_bench_args(p) -> None:
    from .cli import _add_model_args

    _add_model_args(p)
    p.add_argument("--prompts", default=str(PROMPTS), help="JSON list of {class, prompt}, read through the "
                                                           "chat template where the tokenizer has one")
    p.add_argument("--methods", help="comma list: names (specviz:draft-4, specviz:tree-4, "
                                     "specviz:tree-4-n16-b4), families (hf, specviz) or kinds "
                                     "(specviz:draft, specviz:tree)")
    p.add_argument("--ks", help="k values for draft methods (and tree depths), comma-separated "
                                "(default: " + ",".join(map(str, DEFAULT_KS)) + "; 4 with --quick)")
    p.add_argument("--tree-nodes", default="", help="comma list of fixed tree budgets: adds "
                                                    "specviz:tree-<k>-n<nodes> for each k")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", dest="json_path", help="write records and summary here")
    p.add_argument("--html", dest="html_path", help="write a plotly report here")
    p.add_argument("--markdown", dest="markdown_path", help="write markdown tables here")
    p.add_argument("--quick", action="store_true", help="one prompt per class, k=4, 32 tokens")
    p.add_argument("--profile", help="also project each method onto a cost profile (a file written by "
                                     "`gpucheck`, or a name in assets/profiles/)")


def whole_numbers(flag: str, text: str) -> tuple[int, ...]:
    """A comma list of whole numbers; ValueError naming the flag and the form."""
    try:
        return tuple(int(n) for n in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} {text[:40]!r}: give whole numbers separated by commas, "
                         "e.g. 2,4,8") from None


def cmd_bench(args) -> int:
    from .cli import check_writable, load_from_args

    for flag, path in (("--json", args.json_path), ("--html", args.html_path),
                       ("--markdown", args.markdown_path)):
        check_writable(flag, path)  # written once every method has run: fail now, not in an hour
    try:
        prompts = json.loads(Path(args.prompts).read_text())
    except OSError as e:
        raise ValueError(f"--prompts {args.prompts}: cannot read it ({e.strerror}): give a JSON file "
                         "(assets/bench_prompts.json is one)") from None
    except ValueError as e:
        raise ValueError(f"--prompts {args.prompts} is not JSON ({e}): give a JSON list of "
                         '{"class": ..., "prompt": ...} objects (assets/bench_prompts.json is one)') from None
    for flag, value in (("--methods", args.methods), ("--ks", args.ks)):
        if value is not None and not any(part.strip() for part in value.split(",")):  # unset: not all
            raise ValueError(f"{flag} is empty: give a comma list, or leave the flag out for its default")
    ks = whole_numbers("--ks", args.ks) if args.ks else (4,) if args.quick else DEFAULT_KS
    tree_nodes = whole_numbers("--tree-nodes", args.tree_nodes) if args.tree_nodes.strip() else ()
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, dict) and isinstance(p.get("prompt"), str) and isinstance(p.get("class"), str)
            for p in prompts):
        raise ValueError(f"--prompts {args.prompts}: give a JSON list of one or more "
                         '{"class": ..., "prompt": ...} objects (assets/bench_prompts.json is one)')
    if (at := next((i for i, p in enumerate(prompts) if not p["prompt"].strip()), None)) is not None:
        raise ValueError(f"--prompts {args.prompts}: prompt #{at} is empty: give it some text")
    if any(p["class"] == report.POOLED for p in prompts):  # the report's row over every class
        raise ValueError(f"--prompts {args.prompts}: a class is named {report.POOLED!r}, the report's "
                         "row over every class: rename it")
    if (bad := next((k for k in ks if not 1 <= k <= MAX_K), None)) is not None:
        raise ValueError(f"--ks must be in 1..{MAX_K}, got {bad}: pick ks in that range")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--repeats", args.repeats)):
        if value < 1:  # one message named all three flags, whichever was wrong, and no value
            raise ValueError(f"{flag} must be >= 1, got {value}: give a positive whole number")
    for nodes in tree_nodes:
        check_tree_settings(nodes, None)
    if args.quick:
        seen: set[str] = set()
        prompts = [p for p in prompts if not (p["class"] in seen or seen.add(p["class"]))]
        args.max_new_tokens = min(args.max_new_tokens, 32)
    names = set(args.methods.split(",")) if args.methods else None
    has_draft = not (args.target and not args.draft)
    if names:
        check_methods(names, ks, tree_nodes, has_draft=has_draft)
    chosen = methods(ks, names, has_draft, True, tree_nodes)
    if tree_nodes and not any(tree_name(k, n) in chosen for k in ks for n in tree_nodes):
        raise ValueError(f"--tree-nodes {','.join(map(str, tree_nodes))}: no method runs them ("
                         + ("they need a draft model: add --draft MODEL" if not has_draft else
                            "--methods names no tree of those nodes: add specviz:tree, or "
                            f"specviz:tree-<k>-n{tree_nodes[0]}, or drop --methods") + ")")
    profile = load_profile(args.profile) if args.profile else None  # fail before the model load
    quantize, args.draft_quant = args.draft_quant, "none"
    pair = load_from_args(args)  # transformers runs the draft as loaded
    spec_pair = pair
    if pair.draft is not None and quant.wanted(pair.draft, quantize):
        draft = copy.deepcopy(pair.draft)
        label = quant.apply(draft, quantize)
        spec_pair = Pair(pair.target, pair.tokenizer, draft, pair.target_name,
                         f"{pair.draft_name} ({label})" if label else pair.draft_name, pair.chat_default)
    idle = [n for n in sorted(names or ()) if n.endswith("-qdraft") and spec_pair.draft is pair.draft]
    if idle:
        raise ValueError(f"--methods {','.join(idle)[:80]}: transformers on specviz's quantized draft, "
                         "and specviz runs this draft as loaded (--draft-quant, the device and dtype "
                         "decide): drop it, or quantize the draft (--draft-quant int4)")
    records, texts, stops = run_bench(pair, prompts, ks, args.max_new_tokens, args.repeats, names,
                                      spec_pair=spec_pair, tree_nodes=tree_nodes)
    status = 130 if stops and stops[-1].startswith("interrupted") else 1 if stops else 0
    if not records:
        print("specviz: error: no method finished a run, so nothing is saved:\n  " + "\n  ".join(stops),
              file=sys.stderr)
        return status
    summary = report.summarize(records)
    trees, prompt_rows = report.tree_vs_chain(summary, records), report.per_prompt(records)
    shown = list(dict.fromkeys(m for t, row in trees.items() for m in (t, row["chain"])))
    tree_text = (report.tree_table(trees, summary) + "\n\n" + report.per_prompt_table(prompt_rows, shown)
                 if trees else "")
    same_text = same_text_passes(pair, prompts, texts, args.max_new_tokens)
    differences = report.differences(records)
    print(report.table(summary))
    if differences:
        print(differences)
    if tree_text:
        print(tree_text)
    if same_text:
        print(report.same_text_table(same_text))
    onto = report.projected(records, profile) if profile else None
    if onto:
        print(report.projected_table(onto, profile))
    universal = pair.draft is not None and rows(pair.draft) != rows(pair.target) \
        and any(r.method.startswith("hf:assisted") for r in records)
    note = (f"transformers' assisted rows ran its universal assisted decoding (the text re-encoded "
            f"each round): the target has {rows(pair.target)} vocabulary rows and the draft "
            f"{rows(pair.draft)}, and it takes such a pair no other way" if universal else "")
    if note:
        print(note)
    cut = "The bench was cut short:\n" + "\n".join(f"- {why}." for why in stops) if stops else ""
    if cut:
        print(cut, file=sys.stderr)
    meta = {"machine": machine(), "target": pair.target_name, "draft": pair.draft_name,
            "specviz_draft": spec_pair.draft_name,
            "dtype": str(pair.dtype), "device": str(pair.device), "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "ks": list(ks), "tree_nodes": list(tree_nodes), "chat": chats(pair)} \
        | ({"hf_assisted": note} if note else {}) | ({"stopped": stops} if stops else {})
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"meta": meta, "summary": summary, "same_text_passes": same_text,
             "tree_goals": report.TREE_GOALS, "tree_vs_chain": trees, "per_prompt": prompt_rows,
             "records": [asdict(r) for r in records]}
            | ({"profile": profile.to_dict(), "projected": onto} if profile else {}), indent=1))
    if args.markdown_path:
        Path(args.markdown_path).write_text(report.markdown(summary, meta) + (
            "\n" + cut + "\n" if cut else "") + (
            "\n" + note + ".\n" if note else "") + (
            "\n" + differences + "\n" if differences else "") + (
            "\n" + tree_text + "\n" if tree_text else "") + (
            "\n" + report.same_text_table(same_text) + "\n" if same_text else "") + (
            "\n" + report.projected_table(onto, profile) + "\n" if onto else ""))
    if args.html_path:
        report.html_report(summary, Path(args.html_path), f"specviz bench: {pair.target_name}")
    return status
