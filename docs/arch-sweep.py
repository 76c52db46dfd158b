"""Architecture sweep: each decoder architecture transformers offers, as a tiny random custom pair
(the target and its copy with noise as the draft), speculative greedy output against an argmax loop
over full forwards, per fast path, drafter and k. Each row: arch, variant (plain; sw16 / sw192: a
16- or 192-token sliding window), path, proposer, k -> identical, refused (with its message),
MISMATCH, CRASH or HANG (and BUILD-FAIL or REF-FAIL where the model cannot be made or its own forward
fails; skipped past --budget). docs/benchmarks.md, "Fifty-third stop".

Usage, from the repository root (the full sweep of the fifty-third stop, about 2 minutes on 1 thread):
  OMP_NUM_THREADS=1 python docs/arch-sweep.py --paths eager,static,compiled \
      --proposers draft,ngram,hybrid,adaptive,tree --sample --out arch-sweep.jsonl
On a GPU (docs/gpu-sweep.sh runs it so): the models, the argmax loop and specviz on CUDA, float32;
the compiled path with fastpath.COMPILE as the library sets it (on CPU the "aot_eager" backend):
  python docs/arch-sweep.py --device cuda --paths eager,graphed --archs llama,opt --out sweep.jsonl
Options: --archs a,b  --ks 1,4  --n 64  --variants plain,sw16,sw192  --draft perturbed|small
  --sample-on eager (the paths of --sample's runs, a,b)
  --device cpu|cuda  --limit 240 (seconds a run, then HANG)  --budget 0 (seconds the sweep may run:
  past them the archs and runs not started are recorded "skipped"; 0: no bound)
A run's row also holds specviz's log lines during it (logged: e.g. a fast path gone eager, with why).
The first row of each call names it: argv, device, torch, transformers and CUDA versions. Needs no
pytest (the tiny models come from tests/tiny.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

from tiny import EOS, make_tokenizer, perturbed  # noqa: E402

import specviz  # noqa: E402
from specviz import engine, fastpath  # noqa: E402
from specviz.loading import Pair  # noqa: E402

PROMPT = "def fibonacci(n):\n    if n < 2:"
H, FF, L, NH, KV, POS = 32, 64, 2, 4, 2, 256


def base(**extra):
    return dict(hidden_size=H, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=NH,
                num_key_value_heads=KV, max_position_embeddings=POS, tie_word_embeddings=False, **extra)


def cfg(name, vocab, eos, sw=None):
    T = transformers
    ids = dict(vocab_size=vocab, eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    if name == "llama":
        return T.LlamaConfig(**base(), **ids)
    if name == "mistral":
        return T.MistralConfig(**base(sliding_window=sw), **ids)
    if name == "gemma":
        return T.GemmaConfig(**base(head_dim=8), **ids)
    if name == "gemma2":
        return T.Gemma2Config(**base(head_dim=8, sliding_window=sw or 4096, final_logit_softcapping=3.0,
                                     attn_logit_softcapping=5.0,
                                     layer_types=["sliding_attention", "full_attention"][:L]), **ids)
    if name == "gemma3":
        return T.Gemma3TextConfig(**base(head_dim=8, sliding_window=sw or 4096, final_logit_softcapping=3.0,
                                         layer_types=["sliding_attention", "full_attention"][:L]), **ids)
    if name == "phi3":
        return T.Phi3Config(**base(sliding_window=sw), **ids)
    if name == "phi":
        return T.PhiConfig(**base(), **ids)
    if name == "qwen3":
        return T.Qwen3Config(**base(head_dim=8), **ids)
    if name == "qwen3_moe":
        return T.Qwen3MoeConfig(**base(head_dim=8, moe_intermediate_size=32, num_experts=4,
                                       num_experts_per_tok=2), **ids)
    if name == "olmo2":
        return T.Olmo2Config(**base(), **ids)
    if name == "granite":
        return T.GraniteConfig(**base(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5,
                                      attention_multiplier=0.2), **ids)
    if name == "cohere":
        return T.CohereConfig(**base(logit_scale=0.5), **ids)
    if name == "cohere2":
        return T.Cohere2Config(**base(sliding_window=sw or 4096,
                                      layer_types=["sliding_attention", "full_attention"][:L]), **ids)
    if name == "stablelm":
        return T.StableLmConfig(**base(), **ids)
    if name == "gpt_neox":
        return T.GPTNeoXConfig(**base(), **ids)
    if name == "falcon":
        c = base()
        c.pop("num_key_value_heads")
        c.pop("intermediate_size")
        return T.FalconConfig(**c, **ids)
    if name == "falcon_alibi":
        c = base()
        c.pop("num_key_value_heads")
        c.pop("intermediate_size")
        return T.FalconConfig(**c, alibi=True, **ids)
    if name == "opt":
        return T.OPTConfig(vocab_size=vocab, hidden_size=H, ffn_dim=FF, num_hidden_layers=L,
                           num_attention_heads=NH,
                           max_position_embeddings=POS, word_embed_proj_dim=H, eos_token_id=eos,
                           bos_token_id=eos, pad_token_id=eos)
    if name == "smollm3":
        return T.SmolLM3Config(**base(), **ids)
    if name == "starcoder2":
        return T.Starcoder2Config(**base(sliding_window=sw), **ids)
    if name == "bloom":
        return T.BloomConfig(vocab_size=vocab, hidden_size=H, n_layer=L, n_head=NH, eos_token_id=eos,
                             bos_token_id=eos, pad_token_id=eos)
    if name == "gptj":
        return T.GPTJConfig(vocab_size=vocab, n_embd=H, n_layer=L, n_head=NH, n_positions=POS, rotary_dim=4,
                            eos_token_id=eos, bos_token_id=eos)
    if name == "gpt_bigcode":
        return T.GPTBigCodeConfig(vocab_size=vocab, n_embd=H, n_layer=L, n_head=NH, n_positions=POS,
                                  eos_token_id=eos, bos_token_id=eos)
    if name == "codegen":
        return T.CodeGenConfig(vocab_size=vocab, n_embd=H, n_layer=L, n_head=NH, n_positions=POS, n_ctx=POS,
                               rotary_dim=4, eos_token_id=eos, bos_token_id=eos)
    if name == "mpt":
        return T.MptConfig(d_model=H, n_heads=NH, n_layers=L, expansion_ratio=2, max_seq_len=POS,
                           vocab_size=vocab, eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    if name == "mixtral":
        return T.MixtralConfig(**base(num_local_experts=4, num_experts_per_tok=2), **ids)
    if name == "glm4":
        return T.Glm4Config(**base(head_dim=8), **ids)
    if name == "helium":
        return T.HeliumConfig(**base(head_dim=8), **ids)
    raise KeyError(name)


# (arch, variant): variant "" plain; "sw16" sliding window 16 (runs pass it); "sw192" window below reach
SLIDING = {"mistral", "gemma2", "gemma3", "phi3", "cohere2", "starcoder2"}
ALL = ["llama", "mistral", "gemma", "gemma2", "gemma3", "phi3", "phi", "qwen3", "qwen3_moe", "olmo2",
       "granite", "cohere", "cohere2", "stablelm", "gpt_neox", "falcon", "falcon_alibi", "opt", "smollm3",
       "starcoder2", "bloom", "mpt", "gptj", "gpt_bigcode", "codegen", "mixtral", "glm4", "helium"]


def build(name, vocab, eos, seed, sw=None, scale=0.2, layers=2):
    """The model made on the CPU (its weights the same on every device): the caller moves it."""
    global L
    torch.manual_seed(seed)
    L, kept = layers, L
    try:
        config = cfg(name, vocab, eos, sw)
    finally:
        L = kept
    config.initializer_range = scale
    if hasattr(config, "init_std"):
        config.init_std = scale
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model.eval()


@torch.no_grad()
def argmax_loop(model, ids, n, vocab):
    """Full forward (no cache) each step, float32 argmax over the tokenizer's ids."""
    ids = list(ids)
    out = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids], device=model.device),
                       use_cache=False).logits[0, -1, :vocab]
        t = int(logits.argmax())
        out.append(t)
        ids.append(t)
    return out


def margins(model, ids, out, vocab):
    """top1-top2 logit gap at each position of out (to tell a near-tie)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids) + out], device=model.device),
                       use_cache=False).logits
        logits = logits[0, len(ids) - 1:-1, :vocab]
    top = logits.topk(2, -1).values
    return (top[:, 0] - top[:, 1]).tolist()


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout("run exceeded the time limit (hang?)")


class Logged(logging.Handler):
    """specviz's log lines (a fast path's fallback to eager), kept for the run's row and written to
    stderr as Python writes a warning where no handler is set."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())
        print(record.getMessage(), file=sys.stderr, flush=True)


def header(a):
    """The call's first row: what ran where."""
    row = {"header": True, "argv": sys.argv[1:], "device": a.device, "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": torch.version.cuda, "compile": fastpath.COMPILE,
           "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if a.device == "cuda":
        row["gpu"] = torch.cuda.get_device_name()
    return row


def record(out, row, *shown):
    """A row into the jsonl file, and its line on stdout."""
    print(json.dumps(row), file=out, flush=True)
    print(*shown, flush=True)


def one_run(pair, ids, proposer, k, n, made, logged):
    made.clear()
    logged.lines.clear()
    events = list(specviz.generate(pair, ids, proposer=proposer, k=k, max_new_tokens=n))
    toks = [t for e in events for t in e.new_tokens]
    tgt = made[0] if made else None
    info = {"rounds": len(events), "accepted": sum(e.accepted for e in events),
            "stop": events[-1].stop}
    if tgt is not None:
        info.update(static=tgt.static, compiled_passes=tgt.compiled_passes, passes=tgt.passes,
                    cache=type(tgt.cache).__name__)
    if logged.lines:
        info["logged"] = logged.lines[:4]
    return toks, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", default=",".join(ALL))
    ap.add_argument("--paths", default="eager,static")
    ap.add_argument("--proposers", default="draft,ngram,tree")
    ap.add_argument("--ks", default="1,4")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--variants", default="plain,sw16,sw192")
    ap.add_argument("--sample", action="store_true", help="also a temperature 0.8 run (crash check)")
    ap.add_argument("--sample-on", default="eager", help="the paths of the --sample runs (a,b)")
    ap.add_argument("--out", default="arch-sweep.jsonl")
    ap.add_argument("--limit", type=int, default=240, help="seconds a run may take (then HANG)")
    ap.add_argument("--budget", type=float, default=0, help="seconds the sweep may run: the archs and "
                    "runs not started by then are recorded 'skipped' (0: no bound)")
    ap.add_argument("--draft", default="perturbed", help="perturbed: the target plus noise; small: a "
                    "1-layer model of the family, seeded apart")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"arch-sweep: --device cuda, but torch {torch.__version__} sees no CUDA device")
    dev = torch.device(a.device)
    if a.device == "cpu":
        fastpath.COMPILE = {"backend": "aot_eager", "dynamic": False}
    tok = make_tokenizer(tempfile.mkdtemp())
    vocab, eos = len(tok), tok.convert_tokens_to_ids(EOS)
    made = []
    real = engine.CachedLM
    engine.CachedLM = lambda *x, **kw: made.append(real(*x, **kw)) or made[-1]
    signal.signal(signal.SIGALRM, _alarm)
    logged = Logged()
    logging.getLogger("specviz").addHandler(logged)
    out = open(a.out, "a")
    print(json.dumps(header(a)), file=out, flush=True)
    started = time.perf_counter()

    def spent():
        return bool(a.budget) and time.perf_counter() - started > a.budget

    for arch in a.archs.split(","):
        variants = [v for v in a.variants.split(",") if v == "plain" or arch in SLIDING]
        if arch in SLIDING:
            variants = [v for v in variants if v != "plain"]
        for variant in variants:
            sw = {"plain": None, "sw16": 16, "sw192": 192}.get(variant) or (
                int(variant[2:]) if variant.startswith("sw") else None)
            t0 = time.perf_counter()
            row0 = {"arch": arch, "variant": variant}
            if spent():
                record(out, {**row0, "outcome": "skipped", "msg": f"past the {a.budget:g} s budget"},
                       arch, variant, "skipped: past the budget")
                continue
            try:
                target = build(arch, vocab, eos, 0, sw)
                draft = (perturbed(target, 1, 0.05) if a.draft == "perturbed"
                         else build(arch, vocab, eos, 7, sw, layers=1))
                target, draft = target.to(dev), draft.to(dev)
            except Exception as e:  # noqa: BLE001
                record(out, {**row0, "outcome": "BUILD-FAIL", "msg": repr(e)[:300]},
                       arch, variant, "BUILD-FAIL", repr(e)[:200])
                continue
            ids = tok.encode(PROMPT)
            try:  # the model's own forward, which may fail on this device or transformers
                ref = argmax_loop(target, ids, a.n, vocab)
                gaps = margins(target, ids, ref, vocab)
            except Exception as e:  # noqa: BLE001
                record(out, {**row0, "outcome": "REF-FAIL", "msg": f"{type(e).__name__}: {str(e)[:300]}",
                             "tb": traceback.format_exc()[-1500:]}, arch, variant, "REF-FAIL", repr(e)[:200])
                del target, draft
                continue
            try:
                hf = target.generate(torch.tensor([ids], device=dev), max_new_tokens=a.n, min_new_tokens=a.n,
                                     do_sample=False)[0, len(ids):].tolist()
            except Exception as e:  # noqa: BLE001
                hf = repr(e)[:200]
            print(json.dumps({**row0, "ref_vs_hf_generate": ref == hf, "min_gap": min(gaps),
                              "ref": ref[:20]}), file=out, flush=True)
            for path in a.paths.split(","):
                pair = Pair(target, tok, draft, target_name=f"{arch}-target", draft_name=f"{arch}-draft",
                            fast=path)
                pair.__dict__["eos_ids"] = frozenset()  # run the whole budget (random models hit EOS)
                chosen = None
                try:
                    chosen = fastpath.resolve_fast(path, target)
                except Exception as e:  # noqa: BLE001
                    chosen = repr(e)[:200]
                for proposer in a.proposers.split(","):
                    for k in [int(x) for x in a.ks.split(",")]:
                        row = {**row0, "path": path, "resolved": chosen, "proposer": proposer, "k": k}
                        if spent():
                            row.update(outcome="skipped", msg=f"past the {a.budget:g} s budget")
                            record(out, row, arch, variant, path, proposer, k, "skipped: past the budget")
                            continue
                        t1 = time.perf_counter()
                        signal.alarm(a.limit)
                        try:
                            toks, info = one_run(pair, ids, proposer, k, a.n, made, logged)
                            signal.alarm(0)
                            row.update(info)
                            m = min(len(toks), len(ref))
                            same = toks == ref[:len(toks)] and (len(toks) == a.n or toks[-1] == eos)
                            if same:
                                row["outcome"] = "identical"
                            else:
                                at = next((i for i in range(m) if toks[i] != ref[i]), m)
                                row.update(outcome="MISMATCH", at=at,
                                           gap_at=gaps[at] if at < len(gaps) else None,
                                           got=toks[max(0, at - 2):at + 3], want=ref[max(0, at - 2):at + 3],
                                           n_got=len(toks))
                        except ValueError as e:
                            signal.alarm(0)
                            row.update(outcome="refused", msg=str(e)[:400])
                        except Timeout as e:
                            row.update(outcome="HANG", msg=str(e))
                        except Exception as e:  # noqa: BLE001
                            signal.alarm(0)
                            row.update(outcome="CRASH", msg=f"{type(e).__name__}: {str(e)[:300]}",
                                       tb=traceback.format_exc()[-1500:])
                        row["seconds"] = round(time.perf_counter() - t1, 2)
                        print(json.dumps(row), file=out, flush=True)
                        print(arch, variant, path, proposer, k, row["outcome"], row["seconds"],
                              row.get("msg", "")[:160], row.get("at", ""), flush=True)
                if a.sample and path in a.sample_on.split(",") and not spent():
                    signal.alarm(a.limit)
                    try:
                        ev = list(specviz.generate(pair, ids, proposer="draft", k=4, max_new_tokens=a.n,
                                                   temperature=0.8, seed=3))
                        signal.alarm(0)
                        r = {"outcome": "sampled-ok", "n": sum(len(e.new_tokens) for e in ev)}
                    except ValueError as e:
                        signal.alarm(0)
                        r = {"outcome": "refused", "msg": str(e)[:300]}
                    except Exception as e:  # noqa: BLE001
                        signal.alarm(0)
                        r = {"outcome": "CRASH", "msg": f"{type(e).__name__}: {str(e)[:300]}",
                             "tb": traceback.format_exc()[-1500:]}
                    print(json.dumps({**row0, "path": path, "proposer": "draft-sampled", "k": 4, **r}),
                          file=out, flush=True)
                    print(arch, variant, path, "sampled", r["outcome"], r.get("msg", "")[:160], flush=True)
            print(f"== {arch}/{variant} {time.perf_counter() - t0:.1f}s", flush=True)
            del target, draft, pair
            fastpath.forget_graphs()
            torch._dynamo.reset()
    print(f"TOTAL {time.perf_counter() - started:.1f}s", flush=True)
    out.close()
    with open(a.out) as rows:  # this run's and any earlier one's in the same file
        tally = Counter(row.get("outcome") for row in map(json.loads, rows) if "outcome" in row)
    print("outcomes in", a.out, dict(tally), flush=True)


if __name__ == "__main__":
    main()
