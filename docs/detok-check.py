"""Streamed token texts against the tokenizer's own decode, on the embedded pair's tokenizer:
each text is cut into a one-token prompt and rounds of 1-4 tokens, as a run streams it, and the
pieces detok.token_pieces gives each round are joined. A mismatch prints the joined text.

    python docs/detok-check.py   # after `python -m specviz prepare` (the embedded pair's cache)

2026-12-06: 3 of these 7 texts differed before the forty-seventh stop's fix ("Hello🚀 world"),
none after.
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from transformers import AutoTokenizer  # noqa: E402

from specviz import embedded  # noqa: E402
from specviz.detok import token_pieces  # noqa: E402

tok = AutoTokenizer.from_pretrained(embedded.cache_dir(embedded.TARGET))
texts = ["Hello 🚀 world", "naïve café ñandú", "Ship it 🚢🚀✨ now", "中文测试：你好，世界！日本語のテキスト",
         "👨‍👩‍👧 family ❤️ done", "Ελληνικά и русский текст", "emoji🎉🎊in🧪a row"]
bad = 0
for text in texts:
    ids = tok.encode(text)
    context, out, pieces, rng, i = ids[:1], ids[1:], [], random.Random(0), 0
    while i < len(out):
        n = rng.randint(1, 4)
        pieces += token_pieces(tok, context, out[i:i + n])
        context += out[i:i + n]
        i += n
    got, want = "".join(pieces), tok.decode(out)
    bad += got != want
    print("ok  " if got == want else "DIFF", repr(want), "" if got == want else f"shown as {got!r}")
print(f"{bad} of {len(texts)} differ")
