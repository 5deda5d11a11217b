"""Tokenizers refuse what they cannot do (issue 38, item 2; the catalogue style of
test_reliability.py): each case is a call as a user makes it and what must happen. ``decode`` of
an id outside [0, vocab_size) is a ValueError naming the id, its position and the vocabulary
size, for every tokenizer kind, before the ``tokenizers`` library sees it (which drops an unknown
id silently and overflows on a negative one); ``encode`` of text a tokenizer cannot represent is a
ValueError naming the characters, never ids that stand for something else. In-range ids, numpy
arrays included, decode exactly as before."""

from __future__ import annotations

import json
import pathlib
import unicodedata

import numpy as np
import pytest

from mtpspec.tokenizers import ByteTokenizer, HFTokenizer, byte_tokenizer_json

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAT = ROOT / "tests" / "fixtures" / "chat"
REF = json.loads((CHAT / "reference.json").read_text(encoding="utf-8"))
KINDS = ("byte", "hf_bpe", "hf_byte_json")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Every tokenizer kind the repository ships or builds: the byte tokenizer, the BPE fixture
    (a Qwen-style byte-level BPE, with special tokens) and the byte tokenizer as the Hugging Face
    ``tokenizer.json`` that ``save_hf`` writes."""
    d = tmp_path_factory.mktemp("byte_json")
    (d / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()), encoding="utf-8")
    return {"byte": ByteTokenizer(), "hf_bpe": HFTokenizer(CHAT), "hf_byte_json": HFTokenizer(d)}


def _hf(tmp_path, tok) -> HFTokenizer:
    tok.save(str(tmp_path / "tokenizer.json"))
    return HFTokenizer(tmp_path)


# ---- decode: ids outside the vocabulary ----------------------------------------------------------


@pytest.mark.parametrize("as_array", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("case", ["negative", "the_size", "huge", "beyond_uint32", "beyond_int64"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_id_outside_the_vocabulary_is_refused_naming_it(tokenizers, kind, case, as_array):
    """A model whose embedding is wider than its tokenizer (Qwen pads 151 665 ids to 151 936)
    samples an id the tokenizer has no token for, or a caller passes -1 padding: decode must say
    which id, where, and what the vocabulary is, not drop it or overflow inside ``tokenizers``."""
    tok = tokenizers[kind]
    n = tok.vocab_size
    bad = {"negative": -1, "the_size": n, "huge": 10**9, "beyond_uint32": 2**32 + 5}.get(
        case, 2**70
    )
    ids = [5, 6, bad, 7]
    if as_array:  # 2**70 fits no integer dtype: an object array of Python ints
        ids = np.array(ids, dtype=object if bad >= 2**64 else np.int64)
    with pytest.raises(ValueError) as info:
        tok.decode(ids)
    message = str(info.value)
    assert f"token id {bad} at position 2" in message, message
    assert f"vocab_size {n}" in message and f"[0, {n})" in message, message


@pytest.mark.parametrize("kind", KINDS)
def test_every_bad_id_is_counted_and_the_first_is_named(tokenizers, kind):
    """A whole stream of padding ids: the message names the first and says how many more."""
    tok = tokenizers[kind]
    with pytest.raises(ValueError, match=r"token id -1 at position 1 .*; 2 more ids"):
        tok.decode([5, -1, -1, tok.vocab_size])


@pytest.mark.parametrize(
    "ids, what",
    [([5, 3.7], r"3\.7 \(float\) at position 1"), (["5"], r"'5' \(str\) at position 0"),
     ([5, None], r"None \(NoneType\) at position 1"),
     (np.array([5.0, 6.0]), "array of float64"), (np.array([True]), "array of bool"),
     (np.array([[5, 6]]), r"shape \(1, 2\)")],
    ids=["float", "str", "none", "float_array", "bool_array", "2d_array"],
)  # fmt: skip
@pytest.mark.parametrize("kind", KINDS)
def test_a_non_integer_id_is_refused_not_truncated(tokenizers, kind, ids, what):
    """A float id (logits' argmax kept as float, 3.7) is not silently truncated to 3, a string is
    not parsed: a TypeError naming the value and its position (or the array's dtype / shape)."""
    with pytest.raises(TypeError, match=what):
        tokenizers[kind].decode(ids)


@pytest.mark.parametrize("kind", KINDS)
def test_in_range_ids_decode_as_before_numpy_included(tokenizers, kind):
    """Positive control: ids inside the vocabulary, as a list, tuple, generator, numpy int array
    of any integer dtype or numpy ints in a list, decode to the same text as before (the
    transformers reference for the BPE fixture; the UTF-8 bytes for the byte kinds)."""
    tok = tokenizers[kind]
    if kind == "hf_bpe":
        cases = [(c["ids"], c["decoded"]) for c in REF["texts"].values()]
        cases.append((list(range(tok.vocab_size)), tok._tok.decode(list(range(tok.vocab_size)))))
    else:
        text = "Grüße 🙂 def f(x):\n\treturn x\x00"
        cases = [
            (list(text.encode()), text),
            (list(range(256)), bytes(range(256)).decode("utf-8", "replace")),
        ]
    for ids, want in cases:
        dtypes = [np.int64, np.int32, np.uint32, np.uint64] + ([np.uint8] if max(ids) < 256 else [])
        forms = [ids, tuple(ids), (i for i in ids), [np.int64(i) for i in ids]]
        forms += [np.asarray(ids, dtype=dt) for dt in dtypes]
        for form in forms:
            assert tok.decode(form) == want
    assert tok.decode([]) == ""


# ---- encode: text a tokenizer cannot represent -------------------------------------------------


def _all_kinds_of_text() -> list[str]:
    rng = np.random.default_rng(0)
    points = rng.integers(0, 0x110000, 3000)
    points = points[(points < 0xD800) | (points > 0xDFFF)]  # surrogates are not characters
    return [
        "",
        "def f(x):\n\treturn x  # plain",
        "".join(map(chr, range(256))),
        "Grüße 🙂 日本語 e\u0301 \ufeff\u200b\uffff\U0010ffff\x00",
        "".join(map(chr, points.tolist())),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_every_string_of_characters_survives_the_shipped_tokenizers(tokenizers, kind):
    """All that this repository ships or builds is byte-level: any string of characters (control
    characters, U+FFFF, U+10FFFF, random code points) encodes to ids that decode back to it (NFC-
    normalised by the BPE fixture, whose normaliser is NFC): no text is lost or turned into an
    unknown token, so for these kinds only a lone surrogate can be refused (the next case)."""
    tok = tokenizers[kind]
    for text in _all_kinds_of_text():
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        want = unicodedata.normalize("NFC", text) if kind == "hf_bpe" else text
        assert tok.decode(ids) == want


@pytest.mark.parametrize("kind", KINDS)
def test_a_lone_surrogate_is_refused_naming_it(tokenizers, kind):
    """Half an emoji from a JSON ``\\ud83d`` escape is not a character and has no UTF-8 bytes: a
    ValueError naming it and its position, not the ``tokenizers`` library's "TextInputSequence
    must be str" TypeError. A byte that was not UTF-8, read with surrogateescape (U+DC80..U+DCFF),
    is that byte to the byte tokenizer, and refused the same way by a Hugging Face one (the
    ``tokenizers`` library takes only valid Unicode)."""
    tok = tokenizers[kind]
    with pytest.raises(ValueError, match=r"cannot encode '\\ud83d' at character 4.*lone surrogate"):
        tok.encode("hi 🙂\ud83d!")
    escaped = b"caf\xe9".decode("utf-8", "surrogateescape")
    if kind == "byte":
        assert tok.encode(escaped) == [*b"caf\xe9"]
    else:
        with pytest.raises(ValueError, match=r"cannot encode '\\udce9' at character 3"):
            tok.encode(escaped)


def test_a_word_outside_a_wordpiece_vocabulary_is_refused_not_made_unknown(tmp_path):
    """A BERT-style WordPiece tokenizer.json (no byte fallback): a word it has no pieces for
    would become [UNK], and the model would read something else than was written; the error
    names the word and where it is. Words it knows still encode as the library encodes them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "wor": 2, "##ld": 3}
    raw = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = _hf(tmp_path, raw)
    assert tok.encode("hello  world") == [1, 2, 3]
    with pytest.raises(ValueError, match=r"'wörld' at character 6 .*unknown token '\[UNK\]'"):
        tok.encode("hello wörld")


def test_a_character_outside_a_bpe_vocabulary_with_an_unknown_token_is_refused(tmp_path):
    """A BPE with an unknown token and no byte fallback turns each character it lacks into
    that token: refused naming the character. The unknown token written out as text, when it is
    an added token, is that token and no error."""
    from tokenizers import Tokenizer, models

    raw = Tokenizer(models.BPE(vocab={"[UNK]": 0, "a": 1, "b": 2}, merges=[], unk_token="[UNK]"))
    raw.add_special_tokens(["[UNK]"])
    tok = _hf(tmp_path, raw)
    assert tok.encode("ab[UNK]a") == [1, 2, 0, 1]
    with pytest.raises(ValueError, match=r"'c' at character 7 .*unknown token '\[UNK\]'"):
        tok.encode("ab[UNK]cb")


def test_a_character_a_bpe_without_an_unknown_token_would_drop_is_refused(tmp_path):
    """A BPE with no unknown token and an incomplete alphabet drops, silently, each character
    it lacks ("abc" encodes as "ab"): refused naming it. Added tokens are matched before the
    model, so their characters need not be in its alphabet."""
    from tokenizers import Tokenizer, models

    raw = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    raw.add_special_tokens(["<|x|>"])
    tok = _hf(tmp_path, raw)
    assert tok.encode("ab<|x|>ba") == [2, 3, 1, 0]
    with pytest.raises(ValueError, match=r"'c' at character 9 .*would drop it"):
        tok.encode("ab<|x|>abca")


def test_a_byte_a_partial_byte_level_bpe_lacks_is_refused(tmp_path):
    """A byte-level BPE trained without the full 256-byte alphabet (``tokenizers``' trainer
    default) drops the bytes it never saw: "é" (0xC3 0xA9) is refused naming the byte and the
    word it is in; the tokenizers that have every byte (the shipped kinds) are never checked."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.BPE(vocab={"a": 0, "Ġ": 1, "b": 2}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = _hf(tmp_path, raw)
    assert tok.encode("ab a") == [0, 2, 1, 0]
    with pytest.raises(ValueError, match=r"the byte 0xc3 \(of ' é'\)"):
        tok.encode("ab é")


def test_a_unigram_model_refuses_what_it_has_no_piece_for(tmp_path):
    """A SentencePiece-style Unigram: with an unknown id, a character it lacks is refused naming
    it; without one, the library's bare Exception becomes a ValueError that says encoding failed."""
    from tokenizers import Tokenizer, models

    (tmp_path / "a").mkdir()
    with_unk = _hf(tmp_path / "a", Tokenizer(models.Unigram([("a", -1.0), ("<unk>", -2.0)], 1)))
    assert with_unk.encode("aa") == [0, 0]
    with pytest.raises(ValueError, match=r"'b' at character 1 .*unknown token '<unk>'"):
        with_unk.encode("ab")
    (tmp_path / "b").mkdir()
    without = _hf(tmp_path / "b", Tokenizer(models.Unigram([("a", -1.0)])))
    with pytest.raises(ValueError, match="cannot encode this text: .*unknown token"):
        without.encode("ab")
