"""Token ids -> display pieces. The engine never sees text; this is the one place that does."""

from __future__ import annotations

_PENDING = "\ufffd"  # what a byte-level tokenizer decodes an unfinished UTF-8 character to


def token_pieces(tokenizer, context: list[int], ids: list[int], window: int = 8) -> list[str]:
    """The text each of ids adds after context (same length as ids).

    A token that ends inside a multi-byte character gets "" and the token that completes it
    carries the whole character. Decoding uses a short window of context so that tokenizers
    which drop or add leading spaces (SentencePiece) give the spacing the full text has.
    """
    seq = list(context[-window:]) + list(ids)
    pieces = []
    for i in range(len(seq) - len(ids), len(seq)):
        lo = max(0, i - window)
        before = tokenizer.decode(seq[lo:i], skip_special_tokens=False)
        after = tokenizer.decode(seq[lo:i + 1], skip_special_tokens=False)
        if after.endswith(_PENDING):
            pieces.append("")
            continue
        stable = before.rstrip(_PENDING)
        pieces.append(after[len(stable):] if after.startswith(stable) else after[len(before):])
    return pieces
