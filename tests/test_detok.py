"""Token pieces for display: "" until a character completes, then the whole character; spacing
as the full text has it; special tokens in the context read as they are."""

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
