"""Tiny offline models without pytest: a byte-level BPE tokenizer trained in memory, random
Qwen2/GPT-2 configs, a draft made from a target with noise. The tests reach them through conftest;
the docs' scripts that run where pytest is absent (docs/arch-sweep.py on a GPU machine) import
them from here."""

from __future__ import annotations

import torch

CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n",
] * 20
EOS = "<|endoftext|>"


def make_tokenizer(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    return fast


def make_model(kind: str, vocab: int, seed: int, eos_id: int, scale: float = 1.0, positions: int = 256):
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config

    torch.manual_seed(seed)
    if kind == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=32, n_layer=2, n_head=4,
                            eos_token_id=eos_id, bos_token_id=eos_id, initializer_range=0.2 * scale)
    else:
        config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=positions, eos_token_id=eos_id,
                             bos_token_id=eos_id, initializer_range=0.2 * scale,
                             tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    return model.eval()


def perturbed(model, seed: int, noise: float):
    """A draft that resembles the target: its weights plus Gaussian noise."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
    return draft
