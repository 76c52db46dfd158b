"""Token ids -> display pieces. The engine never sees text; this is the one place that does."""

from __future__ import annotations

import re

_PENDING = "\ufffd"  # what a byte-level tokenizer decodes an unfinished UTF-8 character to
# An unfinished character has at most 3 of its bytes: one U+FFFD from a byte-level decoder, one a
# byte from a byte-fallback one (SentencePiece's <0xE4>). Marks before those are invalid bytes.
_MAX_PENDING = 3
_MAX_CONTEXT = 64  # context tokens read at most, where the last `window` begin inside a character


def _byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet (also Qwen's, Llama 3's): the character each byte is spelled
    with in a token's name -> the byte."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled = dict(zip(shown, shown, strict=True))
    for b in range(256):
        if b not in spelled:
            spelled[b] = 256 + len(spelled) - len(shown)
    return {chr(c): b for b, c in spelled.items()}


_BYTE_OF = _byte_level()
_FALLBACK_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback pieces


def token_bytes(tokenizer, token_id: int) -> bytes | None:
    """The bytes one token stands for, where its name says them (a byte-level tokenizer's, or a
    byte-fallback piece); None otherwise."""
    try:
        name = tokenizer.convert_ids_to_tokens(int(token_id))
    except (AttributeError, IndexError, KeyError, OverflowError, TypeError, ValueError):
        return None
    if not isinstance(name, str) or not name:
        return None
    if m := _FALLBACK_BYTE.fullmatch(name):
        return bytes([int(m.group(1), 16)])
    if all(c in _BYTE_OF for c in name):
        return bytes(_BYTE_OF[c] for c in name)
    return None


# repr's \xNN of a character U+0080-U+00FF (C1 controls, the no-break space, the soft hyphen), not
# after an escaped backslash: a label writes those \u00NN, its \xNN past 0x7f being bytes
_LATIN1_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\x([89a-f][0-9a-f])")


def _quoted(text: str) -> str:
    """repr(text), a character U+0080-U+00FF that it escapes written \\u00NN (the no-break space
    \\u00a0): repr's '\\xa0' is what a label shows for the lone byte 0xA0."""
    return _LATIN1_ESCAPE.sub(r"\1\\u00\2", repr(text))


def token_label(tokenizer, token_id: int) -> str:
    """One token as a quoted string, for a label: repr of its text, except that a token holding only
    part of a character (whose text decodes to U+FFFD marks, alike for every such token) shows its
    bytes past the characters it finishes as \\x escapes: ' \\xf0\\x9f' and '\\x9a\\x80' are two tokens.
    A character U+0080-U+00FF that repr escapes is written \\u00NN: with repr, a token of the
    no-break space (bytes c2 a0) and one of the byte a0 alone both read '\\xa0'."""
    text = tokenizer.decode([token_id])
    if _PENDING not in text or (raw := token_bytes(tokenizer, token_id)) is None \
            or raw.decode("utf-8", "replace") != text:  # a name that is not this text's bytes
        return _quoted(text)
    shown = raw.decode("utf-8", "surrogateescape")  # an invalid byte b -> U+DC00 + b
    body = "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                   else "\\'" if c == "'" else _quoted(c)[1:-1] for c in shown)
    return f"'{body}'"


def _finished(text: str) -> str:
    """text less the U+FFFDs that an unfinished character at its end may have left."""
    marks = len(text) - len(text.rstrip(_PENDING))
    return text[:len(text) - min(marks, _MAX_PENDING)]


def token_pieces(tokenizer, context: list[int], ids: list[int], window: int = 8,
                 final: bool = False) -> list[str]:
    """The text each of ids adds after context (same length as ids): the pieces join to the
    text the whole sequence decodes to, past the context's, no character lost or doubled.

    A token adds the characters it finishes: one that ends inside a multi-byte character adds
    the text before that character ("" if none), and the token that completes it carries the
    whole character. Text is decoded from a point a few tokens back (the window), moved on only
    where a character ends: tokenizers that drop or add leading spaces (SentencePiece) give the
    spacing the full text has, and a byte-fallback decoder, which marks a whole run of byte tokens
    U+FFFD until its last character completes, the characters it held.

    final: ids end the text (a finished run), so no later token can complete a character they
    leave unfinished: the last piece then carries the U+FFFD marks the whole text decodes to
    (a byte-fallback decoder's: those of the unfinished bytes alone, the characters before them
    shown as they were).
    """
    ids, back = list(ids), window
    while True:  # context that begins inside a character reads as U+FFFD: begin further back
        seq = list(context[-back:]) + ids
        start = len(seq) - len(ids)
        shown = tokenizer.decode(seq[:start], skip_special_tokens=False)
        if not shown.startswith(_PENDING) or back >= min(len(context), _MAX_CONTEXT):
            break
        back *= 2
    ready = start  # the context's text up to its last finished character, all shown before ids
    while ready and shown.endswith(_PENDING):
        ready -= 1
        shown = tokenizer.decode(seq[:ready], skip_special_tokens=False)
    lo, ends, pieces = 0, [], []  # ends: where a character ended, for the window to move to
    for i in range(ready, len(seq)):
        full = tokenizer.decode(seq[lo:i + 1], skip_special_tokens=False)
        done = _finished(full)
        if done.startswith(shown) or not full.endswith(_PENDING):  # (or the decoder rewrote the
            piece, shown = done[len(shown):], done  # text before: spaces cleaned up before "'t")
        else:  # a byte-fallback run marked its finished characters too: wait for the run's end
            piece = ""
        if i >= start:
            pieces.append(piece)
        if not full.endswith(_PENDING):
            ends.append(i + 1)
            move = max((e for e in ends if e <= i + 1 - window), default=lo)  # an end `window` back
            if move - lo > window:
                lo, ends = move, [e for e in ends if e > move]
                shown = tokenizer.decode(seq[lo:i + 1], skip_special_tokens=False)
    if final and pieces and full.endswith(_PENDING):  # the marks held back for a character nothing
        # will finish (only then: where a character ended the window may have moved, and the text
        # read from lo is not what `shown` continues). A byte-fallback run marks the characters it
        # finished before too: the unfinished bytes' own marks, read after the last character's end
        pieces[-1] += full[len(shown):] if full.startswith(shown) else tokenizer.decode(
            seq[ends[-1] if ends else ready:], skip_special_tokens=False)
    return pieces
