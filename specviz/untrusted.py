"""Checks for untrusted JSON: the traces a visitor may upload, and the cost profiles a user may
pass on the command line.

Each check takes a parsed value and the field's name, and returns the value or raises Invalid
naming the field; the reader (trace.loads, profiles.from_dict) words Invalid as its own error.
Lists are checked a whole column at a time where they may be long (a trace holds ~10^5 ids).
The trace reader refuses NaN while parsing, and elsewhere NaN fails every bound (each
comparison with it is false); an infinity fails every finite bound, so min/max order the numbers they see.
"""

from __future__ import annotations

import gc
import os
import unicodedata
from contextlib import contextmanager
from itertools import accumulate, islice
from numbers import Integral, Real


class Invalid(ValueError):
    """A field that fails its check: `where` names it, `what` says what it must be."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where} {what}")
        self.where, self.what = where, what


def fail(where: str, what: str):
    raise Invalid(where, what)


def _code_point(c: int) -> str:
    """A character as the page names it where drawing it would mislead or show nothing."""
    return f"⟨U+{c:04X}⟩"


# Characters that reorder the text around them (bidirectional embeddings, overrides, isolates
# and marks): a token or a link's text of U+202E showed every token after it reversed.
_BIDI = {c: _code_point(c) for c in [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


# C0 controls (but tab and newline, which the views show their own way) and DEL as their Control
# Pictures (U+2400...): a browser draws a NUL token as nothing, a token no one can point at, and
# reads every CR as a line break (a CRLF token broke its line twice): ␍. The C1 controls, which
# have no pictures, by their code points (a terminal reads U+009B as an escape, as ESC [).
_CONTROLS = ({c: 0x2400 + c for c in range(32) if chr(c) not in "\t\n"} | {0x7F: 0x2421}
             | {c: _code_point(c) for c in range(0x80, 0xA0)})


def _draws_nothing(c: str) -> bool:
    """A format character (zero-width space and joiner, soft hyphen, BOM) or a variation selector."""
    return unicodedata.category(c) == "Cf" or "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"


def visible_bidi(text: str) -> str:
    """text with every bidirectional control shown as ⟨U+XXXX⟩, so none reorders the page, and
    every other control character as its Control Picture (␀ for NUL); a text of characters that
    draw nothing (a token of a zero-width joiner or U+FE0F alone: the Qwen tokenizers have both)
    as their code points, where it was a token no one could see or point at."""
    text = text.translate(_BIDI).translate(_CONTROLS)
    if text and all(map(_draws_nothing, text)):
        return "".join(_code_point(ord(c)) for c in text)
    return text


def clip(value, n: int = 40) -> str:
    """A short, safe description of an untrusted value for a message."""
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= n else text[:n] + "…"


def integer(v, where: str, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:  # type(True) is bool: booleans are refused
        fail(where, f"must be an integer in {lo}..{hi}, got {clip(v)}")
    return v


def number(v, where: str, lo: float, hi: float) -> float:
    """A number in [lo, hi] (an integer counts); inf fails the bounds."""
    if type(v) not in (int, float) or not lo <= v <= hi:
        fail(where, f"must be a number in [{lo:g}, {hi:g}], got {clip(v)}")
    return float(v)


_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


def whole(value) -> bool:
    """An integer of any kind (numpy's, a torch integer scalar), not a bool: a caller's count or id."""
    if isinstance(value, Integral):
        return not isinstance(value, bool)
    dtype = getattr(value, "dtype", None)  # a 0-d tensor or array of an integer dtype
    return getattr(value, "ndim", None) == 0 and dtype is not None and "int" in str(dtype)


def real(value) -> bool:
    """A number of any kind (numpy's, a torch scalar), not a bool."""
    if isinstance(value, Real):
        return not isinstance(value, bool)
    return whole(value) or (getattr(value, "ndim", None) == 0 and "float" in str(getattr(value, "dtype", "")))


def flag(text) -> bool | None:
    """A switch's word, any case (1/true/yes/on, 0/false/no/off), as a bool; None for any other
    value. Callers strip it where a surrounding space is allowed."""
    return _FLAGS.get(str(text).lower())


def env_flag(name: str) -> bool | None:
    """An operator's switch in the environment variable name: None when unset or blank, else its
    bool; ValueError naming the variable for any other word (SPECVIZ_ALLOW_CUSTOM_MODELS=ture read
    as off, silently)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if (value := flag(raw)) is None:
        raise ValueError(f"{name}={clip(raw)} is not a switch: give 1 or 0 (or true/false, yes/no, "
                         "on/off) or unset it")
    return value


def port(text: str, where: str) -> int:
    """A TCP port to listen on, from an operator's text; ValueError naming where it came from."""
    raw = text.strip()
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535:
        return int(raw)
    raise ValueError(f"{where}={clip(raw)} is not a port: give a whole number from 1 to 65535")


def is_utf8(s: str) -> bool:
    """s encodes as UTF-8: it holds no lone surrogate (JSON's "\\ud800" reads into one)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _utf8(s: str, where: str) -> None:
    if not is_utf8(s):
        fail(where, "holds a lone surrogate (not UTF-8 text)")


def text(v, where: str, cap: int, null: bool = False, printable: bool = False) -> str | None:
    """A string of at most cap characters (or None with null); printable: no control characters."""
    if v is None and null:
        return None
    if not isinstance(v, str) or len(v) > cap or (printable and not v.isprintable()):
        kind = "printable characters" if printable else "characters"
        fail(where, f"must be a string of at most {cap} {kind}" + (" or null" if null else ""))
    _utf8(v, where)
    return v


def texts(v: list, where: str, cap: int) -> list[str]:
    """Strings of at most cap characters each, checked together."""
    if v and (not set(map(type, v)) <= {str} or max(map(len, v)) > cap):
        fail(where, f"must hold strings of at most {cap} characters")
    _utf8("".join(v), where)
    return v


def items(v, where: str, lo: int, hi: int, what: str) -> list:
    """A list of lo..hi items (what they are named in the message)."""
    if type(v) is not list or not lo <= len(v) <= hi:
        n = f"{lo}" if lo == hi else f"{lo}..{hi}"
        fail(where, f"must be a list of {n} {what}" + (f", got {len(v)}" if type(v) is list else ""))
    return v


def ids(v, where: str, vocab: int, lo: int, hi: int) -> list[int]:
    """A list of lo..hi token ids in 0..vocab-1."""
    items(v, where, lo, hi, "token ids")
    if v and (not set(map(type, v)) <= {int} or min(v) < 0 or max(v) >= vocab):
        fail(where, f"must hold token ids (integers in 0..{vocab - 1})")
    return v


def numbers(v, where: str, n: int, lo: float, hi: float) -> list[float]:
    """A list of n numbers in [lo, hi]."""
    items(v, where, n, n, "numbers")
    if v and (not set(map(type, v)) <= {int, float} or min(v) < lo or max(v) > hi):
        fail(where, f"must hold numbers in [{lo:g}, {hi:g}]")
    return v


def keys(d, where: str, allowed, required=()) -> dict:
    """An object whose keys are among allowed (so at most that many) and include required."""
    if type(d) is not dict:
        fail(where, "must be an object")
    if d.keys() == set(allowed):
        return d
    missing, unknown = set(required) - d.keys(), d.keys() - set(allowed)
    if missing or unknown:
        named = [f"missing {', '.join(sorted(missing))}"] if missing else []
        named += [f"unknown {', '.join(clip(k, 30) for k in islice(unknown, 3))}"] if unknown else []
        fail(where, f"fields differ from {', '.join(allowed)}: {'; '.join(named)}")
    return d


_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def is_utf8_json(data: bytes) -> bool:
    """Whether JSON bytes are UTF-8 (is_utf8 asks it of a str). json.loads also reads UTF-16 and
    UTF-32 bytes, whose quote bytes sit inside other characters, so the scans below would count
    their values wrong (a 1 MiB UTF-16 body of 170,000 empty arrays counted as none)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in data  # UTF-16/32 JSON always holds NUL bytes; UTF-8 JSON escapes them


def _outside_strings(data: bytes) -> bytes:
    """JSON text without its strings' contents: escapes dropped, then the even pieces between
    quotes kept (C speed)."""
    return b"".join(data.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])


def depth(data: bytes) -> int:
    """Deepest bracket nesting of JSON text, at C speed: map the brackets outside strings to
    +1/-1 and take the running max."""
    steps = memoryview(_outside_strings(data).translate(_BRACKETS, _NOT_BRACKETS)).cast("b")
    return max(accumulate(steps), default=0)


def _structure(data: bytes) -> tuple[int, int]:
    """(arrays and objects, separators) of JSON text, outside its strings."""
    outside = _outside_strings(data)
    return outside.count(b"[") + outside.count(b"{"), outside.count(b",")


def held_bytes(data: bytes) -> int:
    """About the memory the parse of JSON text holds: its length (numbers, strings) plus 64 bytes
    an array or object and 8 a separator (a slot). Measured with tracemalloc on opened traces:
    0.87-1.0x for runs and for one of 3.9 million tiny top-2 rows (36 MiB from 3.7 MiB of JSON),
    1.9x for one that is mostly a long prompt (small ints cost only their slot)."""
    opened, separators = _structure(data)
    return len(data) + 64 * opened + 8 * separators


def containers(data: bytes) -> int:
    """Arrays, objects and separators of JSON text, outside strings: about how many values its
    parse builds (a megabyte of [[]],[[]] is 700,000; text in strings counts nothing)."""
    return sum(_structure(data))


@contextmanager
def gc_paused():
    """Collection pauses while a large upload is parsed and checked: the parse builds ~10^6
    objects, and the collections they trigger would rescan them all, doubling the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
