"""python -m specviz run | prepare | presets | bench | costs | gpucheck."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import import_module
from pathlib import Path

from .bounds import BRANCHING, MAX_BRANCHING, MAX_K, MAX_NODES, NEEDS_DRAFT, PROPOSERS
from .digits import beside, percent


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"specviz: error: {message} (see --help)\n")


class _LazyParser(_Parser):
    """A subcommand's parser whose arguments are added (by `fill`, from a module that imports
    torch) only once that subcommand is parsed or its help is shown: `python -m specviz --help`
    and `run` took seconds importing torch and transformers for bench's, costs' and gpucheck's."""

    def __init__(self, *args, fill=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._fill = fill

    def _filled(self) -> None:
        if self._fill is not None:
            fill, self._fill = self._fill, None
            fill(self)

    def parse_known_args(self, args=None, namespace=None):
        self._filled()
        return super().parse_known_args(args, namespace)

    def format_help(self):
        self._filled()
        return super().format_help()

    def format_usage(self):
        self._filled()
        return super().format_usage()


def _adder(module: str):
    """A fill for _LazyParser: the module's add_<module>_args, imported when it is called."""
    return lambda p: getattr(import_module(f".{module}", __package__), f"add_{module}_args")(p)


def _add_model_args(p: argparse.ArgumentParser,
                    draft_quant: str = "draft weight quantization (auto: int4 on CPU in bfloat16 or "
                                       "float32, else none); the target is never quantized") -> None:
    p.add_argument("--target", help="hub id, model folder or .gguf (default: the embedded pair)")
    p.add_argument("--draft", help="draft model (default: the embedded draft with the embedded target)")
    p.add_argument("--pair", help="a preset key instead of --target/--draft (see `presets`)")
    p.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="both models' dtype (default: bfloat16, float16 on MPS)")
    p.add_argument("--device-map", help='"auto" spreads a large target over the GPUs')
    p.add_argument("--draft-quant", choices=["auto", "none", "int8", "int4"], default="auto",
                   help=draft_quant)


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proposer", choices=PROPOSERS, default="draft")
    p.add_argument("--k", type=int, default=4, help=f"the most tokens drafted per round, 1..{MAX_K} "
                                                     "(ngram, adaptive and hybrid choose fewer; a "
                                                     "tree's greatest depth with --proposer tree)")
    p.add_argument("--nodes", type=int, help=f"tree: the most nodes verified per round, 1..{MAX_NODES} "
                                             "(default: sized each round from the measured verify cost)")
    p.add_argument("--branching", type=int, help=f"tree: children of each expanded node, "
                                                 f"1..{MAX_BRANCHING} (default: from {BRANCHING}, "
                                                 "widened while the tree fills)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy, the target's own output; above 0: sampled, following the target's "
                        "distribution exactly")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus cut, applied to p and q alike (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k cut, applied to p and q alike (0: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled draws")
    p.add_argument("--ngram", type=int, default=3, help="longest n-gram the n-gram drafter matches "
                                                               "(hybrid's: at least 8)")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m specviz", description="Exact speculative decoding, visible.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_LazyParser)
    run = sub.add_parser("run", help="generate with speculative decoding and show each token's fate")
    _add_model_args(run)
    _add_sampling_args(run)
    run.add_argument("--compare-baseline", action="store_true", help="also run the target alone")
    run.add_argument("--json", action="store_true", help="one JSON object per event, then a summary")
    run.add_argument("prompt")
    sub.add_parser("prepare", help="build the embedded pair's cache and the draft's int4 codes ahead of time")
    sub.add_parser("presets", help="list the preset pairs and whether each can load here")
    # their modules import torch: their arguments are added when the subcommand is asked for
    sub.add_parser("bench", help="benchmark against transformers generate", fill=_adder("bench"))
    sub.add_parser("costs", help="draft and target pass costs, and a draft profile", fill=_adder("costs"))
    sub.add_parser("gpucheck", help="eager against fast-path pass costs, on random-weight copies of the "
                                    "embedded pair; writes a cost profile", fill=_adder("gpucheck"))
    return parser


def check_model_args(args, needs_draft: bool = False) -> None:
    """ValueError for model arguments that cannot go together, before a slow load: --pair with
    --target/--draft (the preset won, silently), and a drafter that needs a draft model beside a
    --target without --draft (it failed after the load, in the Python API's words)."""
    if args.pair and (args.target or args.draft):
        raise ValueError("--pair replaces --target/--draft: give one or the other")
    if needs_draft and args.target and not args.draft:
        raise ValueError("this drafter needs a draft model: add --draft MODEL (a small model of the target's "
                         "family), or use --proposer ngram or none")


def check_writable(flag: str, path: str | None) -> None:
    """ValueError unless a file can be written at path, before a long run that writes it last."""
    if path is None:
        return
    folder = Path(path).absolute().parent
    if Path(path).is_dir():  # it said "is its folder missing or read-only?" of a folder
        raise ValueError(f"{flag} {path} is a folder: give a file path (e.g. {Path(path) / 'out'}"
                         f"{'.' + flag.lstrip('-') if flag in ('--json', '--html') else ''})")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: cannot write a file there (is its folder {folder} missing or "
                         "read-only?): give a file path in a folder you can write")


def load_from_args(args):
    from . import presets
    from .loading import load_pair

    check_model_args(args)
    kwargs = {"device": args.device, "dtype": args.dtype, "device_map": args.device_map,
              "draft_quant": args.draft_quant}
    if args.pair:
        return presets.load(args.pair, **kwargs)
    return load_pair(args.target, args.draft, **kwargs)


def cmd_run(args) -> int:
    from .compare import compare
    from .engine import check_run_settings, check_settings, generate
    from .loading import EMPTY_PROMPT
    from .metrics import RunStats
    from .render import all_spans, to_ansi
    from .sampling import SamplingParams
    from .treedraft import check_tree_settings

    check_settings(args.k, args.max_new_tokens)  # fail before the slow model load
    check_run_settings(args.seed, args.ngram)
    SamplingParams(args.temperature, args.top_k, args.top_p)
    tree = args.proposer == "tree"
    if not tree and (args.nodes is not None or args.branching is not None):
        raise ValueError("--nodes and --branching shape a token tree: add --proposer tree")
    branching = args.branching  # None: the width adapts
    check_tree_settings(args.nodes, branching)
    check_model_args(args, args.proposer in NEEDS_DRAFT)
    if not args.prompt:  # Pair.encode says so too, after a load of a minute or more
        raise ValueError(EMPTY_PROMPT)
    pair = load_from_args(args)
    prompt_ids = pair.encode(args.prompt, chat=args.chat)  # a prompt it refuses: before the warm-up
    from .store import warm_up

    warm_up(pair, args.k)  # the timed run starts warm, as its baseline (which runs second) did
    settings = dict(k=args.k, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=args.chat,
                    ngram_size=args.ngram)
    shape = dict(nodes=args.nodes, branching=branching) if tree else {}
    events = []
    for event in generate(pair, prompt_ids, proposer=args.proposer, **settings, **shape):
        events.append(event)
        if args.json:
            print(json.dumps({"type": "round"} | event.to_dict()), flush=True)
    stats = RunStats.of(events)
    summary = {"type": "summary", "target": pair.target_name, "draft": pair.draft_name,
               "proposer": args.proposer, "text": pair.tokenizer.decode(stats.tokens),
               "settings": settings} | stats.summary()  # "k" below: the most a round drafted
    if tree:
        summary |= {"nodes": args.nodes, "branching": branching,
                    "nodes_per_round": stats.nodes_verified / max(len(events), 1)}
    if args.compare_baseline:
        base = RunStats.of(generate(pair, prompt_ids, proposer="none", **settings))
        summary |= {"baseline_tokens_per_second": base.tokens_per_second,
                    "speedup": stats.tokens_per_second / max(base.tokens_per_second, 1e-9)}
        summary |= {"identical_to_baseline": None, "compared": None, "first_difference": None,
                    "verdict": "sampled: not compared (the runs draw differently)",
                    "margin_speculative": None, "margin_baseline": None}
        if SamplingParams(args.temperature).greedy:  # sampled runs draw differently: texts differ
            same = compare(stats, base, pair.dtype, pair.device, pair.numerics)
            summary |= {"identical_to_baseline": same.identical, "compared": pair.numerics,
                        "first_difference": same.position,
                        "verdict": same.verdict, "margin_speculative": same.margin(same.spec_top2),
                        "margin_baseline": same.margin(same.base_top2)}
    if args.json:
        print(json.dumps(summary))
        return 0
    color, no_color = sys.stdout.isatty(), bool(os.environ.get("NO_COLOR"))  # no-color.org
    print(to_ansi(all_spans(events, pair.tokenizer, prompt_ids), color=color, marks_only=no_color))
    print()
    print(f"{stats.new_tokens} tokens in {stats.target_passes} target passes "
          f"({beside(stats.tokens_per_pass, 1.0)} per pass), {stats.draft_passes} draft passes; "
          + run_line(stats))
    if stats.drafted:  # a run that drafted nothing printed the label and nothing after it
        print(f"acceptance by position{' along the walked branch' if stats.is_tree else ''}: "
              f"{', '.join('-' if a is None else percent(a, 0) for a in stats.acceptance_by_position)}")
    sec = lambda x, digits=2: beside(x, 0.0, digits)  # noqa: E731 - a GPU's 4 ms is not "0.00 s"
    print(f"{sec(stats.wall_seconds)} s, {stats.tokens_per_second:.2f} tok/s "
          f"(draft {sec(stats.draft_seconds)} s, target {sec(stats.target_seconds)} s, "
          f"other {sec(stats.overhead_seconds, 3)} s)")
    if args.compare_baseline and summary["identical_to_baseline"] is None:
        print(f"baseline: {summary['baseline_tokens_per_second']:.2f} tok/s, speedup "
              f"{beside(summary['speedup'], 1.0)}x; outputs not compared: a sampled run follows the target's "
              "distribution, not its draws (the exactness lab tests the distribution)")
    elif args.compare_baseline:
        same = "identical" if summary["identical_to_baseline"] else (
            f"DIFFERENT from output token {summary['first_difference'] + 1} on: {summary['verdict']} "
            f"(top-2 logit margin {summary['margin_speculative']:.4g} speculative, "
            f"{summary['margin_baseline']:.4g} baseline)")
        print(f"baseline: {summary['baseline_tokens_per_second']:.2f} tok/s, speedup "
              f"{beside(summary['speedup'], 1.0)}x; output {same}")
        print(f"compared: {pair.numerics}")
    return 0


def run_line(stats) -> str:
    """The acceptance part of the run summary: a chain's α with its i.i.d. prediction; a tree's
    nodes verified and what each bought (the chain formula says nothing of trees)."""
    if stats.is_tree:
        return (f"{stats.nodes_verified} tree nodes verified ({stats.nodes_per_round()}), "
                f"{stats.accepted} accepted: {beside(stats.accepted_per_node, (0.0, 1.0), 3)} "
                "accepted per node")
    if not stats.drafted:  # as the page shows "—": nothing was tested
        return "nothing drafted: no acceptance to report"
    predicted = stats.predicted_tokens_per_pass
    return (f"per-token acceptance α {percent(stats.alpha)}"
            + ("" if predicted is None else f" (i.i.d. prediction {predicted:.2f}/pass)")
            + f", accepted/drafted {percent(stats.acceptance_rate)}")


def cmd_presets(args) -> int:
    from .presets import listing

    for preset, why in listing():
        print(f"{preset.key:14} {preset.label:55} {'ok' if why is None else 'unavailable: ' + why}")
    return 0


def cmd_prepare(args) -> int:
    from .embedded import prepare_all
    from .loading import keep_draft_codes

    for path in (*prepare_all(), keep_draft_codes()):
        print(f"cached: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"run": cmd_run, "prepare": cmd_prepare, "presets": cmd_presets}
    try:
        if args.command == "bench":
            from .bench import cmd_bench

            return cmd_bench(args)
        if args.command == "costs":
            from .costs import cmd_costs

            return cmd_costs(args)
        if args.command == "gpucheck":
            from .gpucheck import cmd_gpucheck

            return cmd_gpucheck(args)
        return commands[args.command](args)
    except ValueError as e:
        print(f"specviz: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file it could not read or write: one line, not a traceback
        print(f"specviz: error: {e}", file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as e:  # torch's OutOfMemoryError is a RuntimeError
        from .lm import first_line, out_of_memory

        if (memory := out_of_memory(e)) is None:
            raise
        print(f"specviz: error: out of memory ({first_line(memory)[:200]}): pick a smaller pair, fewer "
              "--max-new-tokens or a shorter prompt", file=sys.stderr)
        return 1
