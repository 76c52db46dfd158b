"""Token pieces for display: "" until a character completes, then the whole character; spacing
as the full text has it; special tokens in the context read as they are."""

import re

from specviz.detok import token_pieces


class Bytes:
    """A byte-level tokenizer: token i is byte i."""

    def decode(self, ids, **_):
        return bytes(ids).decode("utf-8", "replace")


class Words:
    """A tokenizer that cleans up spaces before an apostrophe (as clean_up_tokenization_spaces
    does) and drops its special token 0 when asked to."""

    VOCAB = {0: "<s>", 1: "don", 2: " ", 3: "'t", 4: "x"}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.VOCAB[i] for i in ids if not (skip_special_tokens and i == 0)).replace(" '", "'")


def test_a_character_is_shown_whole_on_the_token_that_completes_it():
    smile = list("\U0001f600".encode())  # four bytes, four tokens
    assert token_pieces(Bytes(), [], smile + [ord("!")]) == ["", "", "", "\U0001f600", "!"]
    # the character's first byte closes an 8-token context: the newest context counts
    assert token_pieces(Bytes(), list(b"abcdefgh") + [0xC3], [0xA9, ord("!")]) == ["\u00e9", "!"]


def test_a_broken_byte_in_the_context_does_not_blank_the_tokens_after_it():
    assert token_pieces(Bytes(), [0xC3, ord("x")], [ord("y"), ord("z")]) == ["y", "z"]


def test_text_the_decoder_rewrites_gives_only_the_new_tokens_part():
    # "don" " " then "'t": the decoder writes "don't", so the text before no longer prefixes it;
    # the piece is what the full text adds past the text before, not the whole window again
    assert token_pieces(Words(), [1, 2], [3]) == ["t"]


def test_special_tokens_in_the_context_are_decoded_as_they_stand():
    assert token_pieces(Words(), [0], [4, 4]) == ["x", "x"]


class Cuts:
    """A byte-level tokenizer of the given byte strings: token i is VOCAB[i]."""

    def __init__(self, *vocab: bytes):
        self.vocab = vocab

    def decode(self, ids, **_):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", "replace")


def test_a_token_that_ends_inside_a_character_keeps_the_text_before_it():
    """The embedded pair's tokenizer (Qwen2.5) writes " 🚀" as " \\xf0\\x9f", "\\x9a", "\\x80" and
    " ñ" as " \\xc3", "\\xb1": the space went with the unfinished character, and the page read
    "Hello🚀 world" and "caféñandú"."""
    tok = Cuts(b"Hello", b" \xf0\x9f", b"\x9a", b"\x80", b" world",
               b"caf\xc3\xa9", b" \xc3", b"\xb1and\xc3\xba")
    assert token_pieces(tok, [], [0, 1, 2, 3, 4]) == ["Hello", " ", "", "\U0001f680", " world"]
    assert token_pieces(tok, [5], [6, 7]) == [" ", "\u00f1and\u00fa"]
    # a token that completes one character and begins the next (CJK tokens do): a 中 was lost
    zh = "中中".encode()
    tok = Cuts(zh[:2], zh[2:4], zh[4:])
    assert token_pieces(tok, [], [0, 1, 2]) == ["", "中", "中"]
    assert token_pieces(tok, [0], [1]) + token_pieces(tok, [0, 1], [2]) == ["中", "中"]  # round by round


def test_pieces_join_to_the_decoded_text_however_the_tokens_are_cut_and_called():
    """Random cuts of mixed-script text with invalid bytes among them, read a few tokens at a time
    (as rounds are) or all at once: the pieces join to the text the whole sequence decodes to."""
    import random

    rng = random.Random(7)
    text = "héllo 🚀 中文字符 naïve ✨👨\u200d👩 עברית ok ".encode()
    for trial in range(400):
        data = bytearray(text[rng.randrange(len(text)):])
        for _ in range(trial % 3):  # invalid bytes: a lone continuation, an unfinished lead, 0xFF
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.choice(b"\x80\xe4\xf0\xff") for _ in range(rng.randrange(1, 9)))
        cuts = sorted(rng.sample(range(1, len(data)), rng.randrange(len(data) // 2, len(data))))
        tok = Cuts(*(bytes(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)), b"!")
        ids, pieces = [*range(len(tok.vocab) - 1), len(tok.vocab) - 1], []
        while len(pieces) < len(ids):
            n = rng.choice([1, 2, 5, 1000])
            pieces += token_pieces(tok, ids[:len(pieces)], ids[len(pieces):len(pieces) + n])
        assert "".join(pieces) == tok.decode(ids), (trial, bytes(data))


def test_a_finished_text_that_ends_inside_a_character_shows_the_mark_it_decodes_to():
    """A run cut by its token budget inside a character: no later token will finish it, so the
    last token shows the U+FFFD the whole text decodes to, not "" (the page showed "Hello" where
    the run decoded to "Hello �"); a running text still holds the marks back."""
    tok = Cuts(b"Hello", b" \xf0\x9f", b"\x9a")
    assert token_pieces(tok, [], [0, 1, 2]) == ["Hello", " ", ""]
    assert token_pieces(tok, [], [0, 1, 2], final=True) == ["Hello", " ", "\ufffd"]
    assert token_pieces(tok, [0, 1], [2], final=True) == ["\ufffd"]  # the last round alone
    assert token_pieces(Bytes(), [], list(b"ok"), final=True) == ["o", "k"]  # nothing held back
    import random

    rng = random.Random(11)
    text = "héllo 🚀 中文字符 naïve ✨👨\u200d👩 ok".encode()
    for trial in range(300):  # random cuts, read round by round, the last round final
        data = text[:rng.randrange(1, len(text) + 1)]
        cuts = sorted(rng.sample(range(1, len(data)), rng.randrange(len(data) // 2, len(data)))) \
            if len(data) > 2 else []
        tok = Cuts(*(data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)))
        ids, pieces = list(range(len(tok.vocab))), []
        while len(pieces) < len(ids):
            end = min(len(ids), len(pieces) + rng.choice([1, 2, 5]))
            pieces += token_pieces(tok, ids[:len(pieces)], ids[len(pieces):end], final=end == len(ids))
        assert "".join(pieces) == tok.decode(ids), (trial, data)


def test_a_finished_repetitive_text_is_not_doubled_where_the_window_moved_on_its_last_token():
    """final=True on a text whose window moved at its last token: the text read from the old
    start began with the new window's, and its rest was added again ("a" x 17 showed 26 a's)."""
    for pattern in (b"a", b"\n", b"la "):
        for n in range(1, 60):
            ids = list((pattern * 60)[:n])
            assert "".join(token_pieces(Bytes(), [], ids, final=True)) == Bytes().decode(ids), (pattern, n)


def test_a_run_of_invalid_bytes_shows_each_mark_once_no_character_can_hold_it():
    """An unfinished character holds at most 3 of its bytes: a mark with 3 more after it is an
    invalid byte (a small model writes them), shown on the token that makes that sure, not held
    back with the rest until the next valid character."""
    ids = list(b"a\xff\xff\xff\xff\xffb")
    held = "\ufffd" * 3  # the last 3 marks may still be a character's start, until "b"
    assert token_pieces(Bytes(), [], ids) == ["a", "", "", "", "\ufffd", "\ufffd", held + "b"]
    assert token_pieces(Bytes(), ids[:4], ids[4:]) == ["\ufffd", "\ufffd", held + "b"]  # round by round


def test_a_long_text_is_decoded_a_few_tokens_back_not_from_its_start():
    """The window moves on where a character ends: a finished run's 2,000 tokens (its text made
    whole at the end) decode a few tokens back from each, about 2,000 x 14 tokens read in all;
    from the start at each token that was 2,000,000 (seconds of a page's final view)."""
    read = []

    class Counted(Bytes):
        def decode(self, ids, **kw):
            read.append(len(ids))
            return super().decode(ids, **kw)

    ids = list(("héllo, 中文 " * 200).encode())[:2000]
    assert "".join(token_pieces(Counted(), [], ids, final=True)) == Bytes().decode(ids)
    assert sum(read) < 40 * len(ids), sum(read)


class SentencePiece:
    """A byte-fallback tokenizer (as SentencePiece's): ids 0..255 are the pieces <0x00>..<0xFF>,
    256 is "▁ok"."""

    def __init__(self):
        from tokenizers import Tokenizer, decoders, models

        vocab = {f"<0x{b:02X}>": b for b in range(256)} | {"▁ok": 256}
        self.sp = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
        self.sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                             decoders.Fuse(), decoders.Strip(" ", 1, 0)])

    def decode(self, ids, **_):
        return self.sp.decode(ids, skip_special_tokens=False)

    def convert_ids_to_tokens(self, i):
        return self.sp.id_to_token(i)


def test_a_byte_fallback_run_shows_each_character_once():
    """A byte-fallback decoder (SentencePiece's <0xF0>...) marks a whole run of byte tokens U+FFFD
    until its last character completes: "🚀" then 中's first byte read as five marks, and the
    token that finished 中 showed "🚀中", the rocket twice."""
    ids = [256, *"🚀中".encode(), 256]
    assert SentencePiece().decode(ids[:6]) == "ok" + "\ufffd" * 5  # the run, unfinished
    pieces = token_pieces(SentencePiece(), [], ids)
    assert pieces == ["ok", "", "", "", "🚀", "", "", "中", " ok"]
    assert token_pieces(SentencePiece(), ids[:6], ids[6:]) == pieces[6:]  # read after the run's start
    # a round read after a run longer than the window: the window's 8 tokens began inside 中
    # (its last byte), where the run reads as marks to its end and 符 was never shown
    long = [256, *"中文字符".encode(), 256]
    assert token_pieces(SentencePiece(), long[:11], long[11:]) == ["", "符", " ok"]
    # a finished run that ends on a byte after a character its byte run finished: the run reads
    # as marks to its end, and the last token showed "" where the text ends unfinished
    ended = [256, *"🚀".encode(), 0xE4]
    assert token_pieces(SentencePiece(), [], ended, final=True) == ["ok", "", "", "", "🚀", "\ufffd"]
    assert token_pieces(SentencePiece(), ended[:5], ended[5:], final=True) == ["\ufffd"]


def test_a_trained_byte_level_tokenizer_whose_tokens_cross_characters_joins_to_its_text():
    """A byte-level BPE (as GPT-2's, Qwen's and Llama 3's) trained on text of several scripts
    merges bytes across characters (" \\xe2\\x9c" of " ✨", "\\xe6\\x96" and "\\xa9\\xe5\\xad" of
    中文字): read a round at a time, the pieces lost the space before ✨ and the 文."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = "ship 🚀 go 🚢 now ✨ and 😀 then 中文字符 naïve café ñandú"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([text] * 50, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    ids = tok.encode(text)
    assert any(p == "" for p in token_pieces(tok, [], ids))  # tokens that end inside a character
    for n in (1, 2, 3, len(ids)):  # a round at a time, of n tokens
        pieces = sum((token_pieces(tok, ids[:at], ids[at:at + n]) for at in range(0, len(ids), n)), [])
        assert "".join(pieces) == text and len(pieces) == len(ids)


def test_the_byte_level_alphabet_is_gpt2s():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from specviz.detok import _BYTE_OF

    assert _BYTE_OF == {c: b for b, c in bytes_to_unicode().items()}


def trained_byte_level(text: str, vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([text] * 50, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


def from_label(label: str) -> bytes:
    """A label read back: its \\x escapes as bytes, its other characters as UTF-8."""
    body = label[1:-1]
    parts = re.split(r"\\x([0-9a-f]{2})", body)
    return b"".join(bytes([int(part, 16)]) if i % 2 else part.encode() for i, part in enumerate(parts))


def test_a_label_shows_the_bytes_of_a_token_that_holds_part_of_a_character():
    """Every token holding part of a character decoded to U+FFFD alone: the lab's bars and its
    drafted token read "' �'" for " \\xf0\\x9f" of " 🚀" and for " \\xc3" of " ñ" alike."""
    from specviz.detok import _BYTE_OF, token_bytes, token_label

    tok = trained_byte_level("go", vocab_size=257)  # the byte alphabet, and no merges
    char_of = {b: c for c, b in _BYTE_OF.items()}
    byte = lambda b: tok.convert_tokens_to_ids(char_of[b])  # noqa: E731
    assert token_label(tok, byte(0xF0)) == "'\\xf0'" and token_label(tok, byte(0x9A)) == "'\\x9a'"
    assert token_label(tok, byte(ord("g"))) == "'g'" and token_label(tok, byte(ord("'"))) == repr("'")
    # merged across characters: every token holding part of one has a label of its own, its bytes
    tok = trained_byte_level("go 🚀 now ñandú 'ẞ' ok 中文字符 'é' 🚢 ✨ " * 3, vocab_size=320)
    partial = [i for i in range(len(tok)) if "\ufffd" in tok.decode([i])]
    labels = [token_label(tok, i) for i in partial]
    assert len(partial) > 20 and len(set(labels)) == len(labels)
    assert [from_label(shown) for shown in labels] == [token_bytes(tok, i) for i in partial]
    assert not any("\ufffd" in shown for shown in labels)
    assert any(shown.startswith("' \\x") for shown in labels)  # " \\xf0\\x9f": a space and bytes
    # a whole character's token, and the character U+FFFD itself, read as their text
    literal = trained_byte_level("a \ufffd b", vocab_size=300)
    ids = literal.encode("\ufffd")
    assert len(ids) == 1 and token_label(literal, ids[0]) == "'\ufffd'"
    whole = [i for i in range(len(tok)) if "\ufffd" not in tok.decode([i])]
    assert all(token_label(tok, i) == repr(tok.decode([i])) for i in whole)


def test_a_no_break_space_and_the_byte_a0_alone_have_labels_of_their_own():
    """repr writes the no-break space (bytes c2 a0), U+0085, the soft hyphen and U+0080 as \\xNN:
    the label of a token of one of them read as that of the lone byte 0xNN (Qwen's ids 4102 and
    254 both read '\\xa0'; 41416 and 222, the rocket's last byte, '\\x80')."""
    import ast

    from specviz.detok import _BYTE_OF, token_label

    tok = trained_byte_level("a\u00a0b a\u0085b soft\u00adhyphen x\u0080y typed \\xa0", vocab_size=300)
    labels = [token_label(tok, i) for i in range(len(tok))]
    assert len(set(labels)) == len(labels)  # every token a label of its own
    char_of = {b: c for c, b in _BYTE_OF.items()}
    for char in "\u00a0\u0085\u00ad\u0080":
        (whole,) = tok.encode(char)
        alone = tok.convert_tokens_to_ids(char_of[char.encode()[1]])  # its last byte, a token alone
        assert token_label(tok, whole) == f"'\\u{ord(char):04x}'"
        assert ast.literal_eval(token_label(tok, whole)) == char  # still a string's literal
        assert token_label(tok, alone) == f"'\\x{char.encode()[1]:02x}'"
    typed = tok.encode(" \\xa0")  # a backslash typed before "xa0": its text, escaped as repr does
    assert "".join(ast.literal_eval(token_label(tok, i)) for i in typed) == " \\xa0"


def test_a_byte_fallback_piece_is_labelled_with_its_byte():
    from specviz.detok import token_label

    assert token_label(SentencePiece(), 0xF0) == "'\\xf0'" and token_label(SentencePiece(), 0x41) == "'A'"
    assert token_label(SentencePiece(), 256) == "'ok'"


def test_a_label_falls_back_to_the_text_where_the_tokens_name_is_not_its_bytes():
    from specviz.detok import token_label

    class Named:  # a name that is not the token's bytes (a decoder that rewrites), or no name at all
        def decode(self, ids, **_):
            return {0: "\ufffd", 1: "a\ufffd"}[ids[0]]

        def convert_ids_to_tokens(self, i):
            return {0: "x", 1: "<0xZZ>"}[i]

    assert token_label(Named(), 0) == "'\ufffd'" and token_label(Named(), 1) == "'a\ufffd'"
    assert token_label(Bytes(), 0xF0) == "'\ufffd'"  # no names: the text, as before


def test_a_name_is_read_as_bytes_only_where_all_of_it_spells_them():
    """A name that holds a byte-fallback piece among other characters is not that piece; one with a
    character outside the byte-level alphabet (SentencePiece's "▁", a piece holding U+FFFD itself)
    says no bytes; a lookup of the name that fails leaves the label its text."""
    from specviz.detok import token_bytes, token_label

    class Named:
        texts = {0: "\ufffd", 1: "a\ufffd", 2: "\ufffd", 3: "\ufffd"}

        def decode(self, ids, **_):
            return self.texts[ids[0]]

        def convert_ids_to_tokens(self, i):
            if i == 2:
                raise IndexError("piece id is out of range")  # a list of names shorter than the ids
            if i == 3:
                raise OverflowError("out of range integral type conversion attempted")
            return ["x<0xF0>", "a\ufffd"][i]

    # "x<0xF0>" spells its seven characters' bytes in the byte-level alphabet, not the byte f0
    assert [token_bytes(Named(), i) for i in range(4)] == [b"x<0xF0>", None, None, None]
    assert [token_label(Named(), i) for i in range(4)] == ["'\ufffd'", "'a\ufffd'", "'\ufffd'", "'\ufffd'"]
    assert token_bytes(SentencePiece(), 256) is None and token_bytes(SentencePiece(), 0xF0) == b"\xf0"


class Text:
    """A tokenizer of one token, id 0, of the given text; no names (its label is its text)."""

    def __init__(self, text: str):
        self.text = text

    def decode(self, ids, **_):
        return self.text


def test_a_label_reads_back_as_its_text_where_backslashes_and_latin1_characters_meet():
    """The \\u00NN rewrite of repr's \\xNN leaves a typed backslash's "\\xa0" alone, keeps the
    backslashes before a rewritten character, and rewrites each such character of a label."""
    import ast

    from specviz.detok import token_label

    for text, label in (("a\\xa0", r"'a\\xa0'"),  # typed: a backslash, then "xa0"
                        ("\\\u00a0", r"'\\\u00a0'"),  # a backslash, then the no-break space
                        ("\\\\\u00a0", r"'\\\\\u00a0'"),  # two of them
                        ("\u00a0\u00ad", r"'\u00a0\u00ad'")):  # each character rewritten
        assert token_label(Text(text), 0) == label
        assert ast.literal_eval(label) == text


def test_a_partial_characters_label_escapes_its_other_characters_as_a_whole_tokens_does():
    """Past its bytes, a partial character's label writes its other characters as a whole token's
    label does: an apostrophe escaped inside the quotes, a backslash doubled, the no-break space
    \\u00a0 (written '\\xa0' it read as the lone byte a0: three bytes where there are four)."""
    from specviz.detok import _BYTE_OF, token_label

    char_of = {b: c for c, b in _BYTE_OF.items()}

    class Named:
        names = [b"'\xf0\x9f", b"\\\xf0", b"\xc2\xa0\xf0\x9f"]

        def decode(self, ids, **_):
            return self.names[ids[0]].decode("utf-8", "replace")

        def convert_ids_to_tokens(self, i):
            return "".join(char_of[b] for b in self.names[i])

    assert [token_label(Named(), i) for i in range(3)] == [r"'\'\xf0\x9f'", r"'\\\xf0'", r"'\u00a0\xf0\x9f'"]


def test_the_verdicts_top2_labels_a_partial_character_by_its_bytes():
    """A bf16 near-tie between " \\xf0\\x9f" and " \\xc3" read "' �' 12.5 vs ' �' 12.5"."""
    from specviz.compare import Comparison
    from specviz.detok import _BYTE_OF
    from specviz.views import verdict_html

    char_of = {b: c for c, b in _BYTE_OF.items()}

    class Named:
        names = {1: b" \xf0\x9f", 2: b" \xc3"}

        def decode(self, ids, **_):
            return " \ufffd"

        def convert_ids_to_tokens(self, i):
            return "".join(char_of[b] for b in self.names[i])

    c = Comparison(False, 3, [(1, 12.5), (2, 12.5)], [(2, 12.5), (1, 12.5)], "torch.bfloat16", "cpu", 0.1)
    shown = verdict_html(c, Named(), greedy=True)
    assert "&#x27; \\xf0\\x9f&#x27; 12.5000 vs &#x27; \\xc3&#x27; 12.5000" in shown
