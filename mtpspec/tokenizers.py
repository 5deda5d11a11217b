"""Tokenizers: text <-> token ids, one interface for the shipped byte model and real checkpoints.

    tok.encode(text) -> list[int]          no special tokens added
    tok.decode(ids) -> str                 special tokens skipped
    tok.apply_chat_template(messages, add_generation_prompt=True) -> list[int]
    tok.eos_token_ids -> tuple[int, ...]   the ids that end a turn / a document
    tok.vocab_size

ByteTokenizer         UTF-8 bytes as ids 0..255 (the shipped model's vocabulary)
byte_tokenizer_json   the same as a Hugging Face ``tokenizer.json`` dict (for HF export)
HFTokenizer           a Hugging Face tokenizer directory (``tokenizer.json`` through the
                      ``tokenizers`` package, ``tokenizer_config.json`` / ``chat_template.jinja``
                      for the chat template, ``generation_config.json`` / ``config.json`` for EOS)
render_chat           a chat template rendered as transformers renders it (jinja2, sandboxed)
check_ids             token ids as ints, each in [0, vocab_size) (what every decode does first)

Both refuse what they cannot do rather than pass on something else: ``decode`` of an id outside
[0, vocab_size) (negative, the size itself, or beyond) is a ValueError naming the id, its position
and the vocabulary size, a non-integer id (a float, a string) a TypeError; ``encode`` of text the
tokenizer cannot represent is a ValueError naming the characters (see each ``encode``).
"""

from __future__ import annotations

import datetime
import json
import operator
import os
import pathlib
from collections.abc import Sequence

import numpy as np

# The conventional ChatML template (as Qwen's chat models use), for tokenizers that have none.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i} must be a dict with a 'role' string, got {m!r}")
        if "content" in m and not isinstance(m["content"], str | list | type(None)):
            raise ValueError(f"message {i}'s 'content' must be a string, got {m['content']!r}")
    return list(messages)


def render_chat(
    template: str,
    messages,
    *,
    add_generation_prompt: bool = True,
    special_tokens: dict | None = None,
    **kwargs,
) -> str:
    """``template`` rendered over ``messages`` the way transformers' ``apply_chat_template`` does:
    a sandboxed jinja2 environment with ``trim_blocks`` / ``lstrip_blocks``, loop controls,
    ``raise_exception``, ``tojson`` (non-ASCII kept) and ``strftime_now``; the special tokens
    (``bos_token``, ``eos_token``, ...) and extra ``kwargs`` (e.g. ``enable_thinking``) as
    variables."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - jinja2 is a dependency
        raise ImportError("chat templates need the 'jinja2' package: pip install jinja2") from e
    messages = _check_messages(messages)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            **(special_tokens or {}),
            **kwargs,
        )
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"the chat template failed: {e}") from e


def check_ids(ids, vocab_size: int, exists=None) -> list[int]:
    """``ids`` (a sequence of ints or numpy ints, or a 1-D integer array) as a list of Python ints,
    each in [0, vocab_size): a ValueError naming the first id outside it, its position and the
    vocabulary size; a TypeError naming a non-integer id (a float, a string; a bool is an int in
    Python, taken as 0 / 1). ``exists(i)``, when given, is asked about an id at or above the size
    before it is refused (a vocabulary with holes has ids beyond its count). One pass to convert
    and a min / max: cheaper than the ``int(i) for i in ids`` it replaces."""
    kind = None
    if hasattr(ids, "dtype") and hasattr(ids, "shape"):  # numpy / jax arrays
        arr = np.asarray(ids)
        kind = arr.dtype.kind
        if arr.ndim != 1 or kind not in "iuO":
            raise TypeError(
                f"token ids must be one sequence of integers, got an array of {arr.dtype} with "
                f"shape {arr.shape}"
            )
        ids = arr.tolist()  # Python ints (or, from an object array, whatever it holds)
    if kind in ("i", "u"):
        out = ids
    else:
        ids = ids if isinstance(ids, list | tuple) else list(ids)
        try:
            out = list(map(operator.index, ids))
        except TypeError:
            for pos, i in enumerate(ids):
                try:
                    operator.index(i)
                except TypeError:
                    raise TypeError(
                        f"token ids must be integers, got {i!r} ({type(i).__name__}) at "
                        f"position {pos}"
                    ) from None
            raise
    if out and (min(out) < 0 or max(out) >= vocab_size):
        bad = [
            (pos, i)
            for pos, i in enumerate(out)
            if not (0 <= i < vocab_size or (exists and 0 <= i < 2**32 and exists(i)))
        ]
        if bad:
            (pos, i), more = bad[0], len(bad) - 1
            raise ValueError(
                f"token id {i} at position {pos} is outside the vocabulary [0, {vocab_size}) "
                f"(vocab_size {vocab_size})" + (f"; {more} more ids are outside it" if more else "")
            )
    return out


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255. No special tokens, so no EOS unless given; a chat
    template only when given one (``chat_template``, rendered to text, then bytes)."""

    vocab_size = 256

    def __init__(self, chat_template: str | None = None, eos_token_ids: Sequence[int] = ()):
        self.chat_template = chat_template
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``: every string of characters has them, so nothing is lost.
        Text that came from bytes that are not UTF-8 (argv, file names, read with
        ``errors="surrogateescape"``) holds U+DC80..U+DCFF for those bytes and encodes back to
        exactly them; any other lone surrogate (U+D800..U+DFFF, e.g. half an emoji from a JSON
        ``\\ud83d`` escape) is not a character and has no bytes: a ValueError naming it."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        try:
            return list(text.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError as e:
            raise ValueError(
                f"the byte tokenizer cannot encode {text[e.start : e.end]!r} at character "
                f"{e.start}: a lone surrogate is not a character and has no UTF-8 bytes (only "
                "U+DC80..U+DCFF, undecodable bytes read with surrogateescape, stand for bytes)"
            ) from None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The bytes ``ids`` decoded as UTF-8, invalid sequences replaced by U+FFFD; an id outside
        0..255 is a ValueError naming it (``check_ids``)."""
        return bytes(check_ids(ids, self.vocab_size)).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kw) -> list[int]:
        if self.chat_template is None:
            raise ValueError(
                "the byte tokenizer has no chat template (the shipped model is not a chat model); "
                "give the prompt as text, or pass ByteTokenizer(chat_template=...)"
            )
        text = render_chat(
            self.chat_template, messages, add_generation_prompt=add_generation_prompt, **kw
        )
        return self.encode(text)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ``tokenizers`` ByteLevel pre-tokenizer
    and decoder use: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = [b for b in range(256) if b not in printable]
    chars = [*printable, *range(256, 256 + len(extra))]
    return dict(zip([*printable, *extra], map(chr, chars), strict=True))


def byte_tokenizer_json() -> dict:
    """``ByteTokenizer`` as a Hugging Face ``tokenizers`` ``tokenizer.json`` (written directly,
    no ``tokenizers`` dependency): a byte-level BPE with no merges whose vocabulary maps the
    ByteLevel character of byte b to id b, so encode = the UTF-8 bytes and decode = the bytes
    decoded with replacement of invalid sequences, exactly as ``ByteTokenizer``. No special
    tokens (ids 0..255 are all bytes; there is no eos/bos/pad), no normaliser, no regex split,
    no prefix space, no post-processor (nothing is added around a sequence)."""
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    chars = _bytes_to_unicode()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {chars[b]: b for b in range(ByteTokenizer.vocab_size)},
            "merges": [],
        },
    }


def _read_json(path: pathlib.Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def _ids(value, where: str) -> tuple[int, ...] | None:
    """An ``eos_token_id`` entry (int or list of ints) as a tuple; None when absent."""
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}: eos_token_id must be an int or a list of ints, got {value!r}")
    return tuple(values)


def _token_content(value) -> str | None:
    """A special token entry of tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (applied by decode when a tokenizer's config asks
    for ``clean_up_tokenization_spaces``): drops the space before punctuation and contractions."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'")):
        text = text.replace(a, b)
    for a, b in ((" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class HFTokenizer:
    """A Hugging Face tokenizer: a directory with ``tokenizer.json`` (or that file itself).

    Read beside it, when present: ``tokenizer_config.json`` (chat template, special tokens,
    ``clean_up_tokenization_spaces``), ``chat_template.jinja`` / ``chat_template.json`` (newer
    transformers save the template there), ``generation_config.json`` and ``config.json`` (the
    EOS ids, in that order of preference)."""

    def __init__(self, path: str | os.PathLike):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - tokenizers is a dependency
            raise ImportError(
                "HFTokenizer needs the 'tokenizers' package: pip install tokenizers"
            ) from e
        path = pathlib.Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise OSError(f"no tokenizer.json at {file}")
        self.directory = file.parent
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises its own Exception type
            raise ValueError(f"{file} is not a tokenizers-format tokenizer.json: {e}") from e
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._unk = self._find_unk()
        self._byte_level = self._is_byte_level()
        self._may_drop = self._drops_text()
        d = self.directory
        self.config = _read_json(d / "tokenizer_config.json")
        self.chat_template = self._find_template(d)
        self.clean_up_spaces = bool(self.config.get("clean_up_tokenization_spaces", False))
        self.special_tokens = {
            name: _token_content(self.config.get(name))
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        self.eos_token_ids = self._find_eos(d)

    def _find_template(self, d: pathlib.Path) -> str | None:
        if (d / "chat_template.jinja").is_file():
            return (d / "chat_template.jinja").read_text(encoding="utf-8")
        if (d / "chat_template.json").is_file():
            return _read_json(d / "chat_template.json").get("chat_template")
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None

    def _find_eos(self, d: pathlib.Path) -> tuple[int, ...]:
        for name in ("generation_config.json", "config.json"):
            data = _read_json(d / name)
            if name == "config.json" and "text_config" in data and "eos_token_id" not in data:
                data = data["text_config"]  # the VL wrappers nest the text model's config
            ids = _ids(data.get("eos_token_id"), str(d / name))
            if ids:
                return ids
        eos = self.special_tokens.get("eos_token")
        if eos is not None and self._tok.token_to_id(eos) is not None:
            return (self._tok.token_to_id(eos),)
        return ()

    def _find_unk(self) -> tuple[int, str] | None:
        """The model's unknown token as (id, text): what text outside its vocabulary becomes."""
        model = self._tok.model
        if type(model).__name__ == "Unigram":  # no unk_token attribute; its state has unk_id
            unk_id = json.loads(model.__getstate__()).get("unk_id")
            return None if unk_id is None else (unk_id, model.id_to_token(unk_id))
        unk = getattr(model, "unk_token", None)
        unk_id = None if unk is None else model.token_to_id(unk)
        return None if unk_id is None else (unk_id, unk)

    def _is_byte_level(self) -> bool:
        pre = self._tok.pre_tokenizer
        return pre is not None and b'"type":"ByteLevel"' in pre.__getstate__()

    def _drops_text(self) -> bool:
        """Whether the model can drop text silently: a BPE with no unknown token drops each
        character its vocabulary lacks, unless it holds every byte (byte fallback's <0x00>..
        <0xFF>, or the 256 characters of a byte-level pre-tokenizer with no subword affixes)."""
        model = self._tok.model
        if type(model).__name__ != "BPE" or self._unk is not None:
            return False

        def has(tokens) -> bool:
            return all(model.token_to_id(t) is not None for t in tokens)

        if model.byte_fallback and has(f"<0x{b:02X}>" for b in range(256)):
            return False
        affixes = model.continuing_subword_prefix or model.end_of_word_suffix
        return not (self._byte_level and not affixes and has(_bytes_to_unicode().values()))

    def _cannot(self, what: str, where: int, why: str) -> ValueError:
        return ValueError(
            f"the tokenizer in {self.directory} cannot encode {what} at character {where} of the "
            f"text: {why}"
        )

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, no special tokens added. Text the tokenizer cannot represent is a
        ValueError naming it, never ids that stand for something else: a lone surrogate (not a
        character: no Hugging Face tokenizer takes one), a character that would become the
        unknown token (outside the vocabulary, no byte fallback), or one a BPE with no unknown
        token would drop. Byte-level tokenizers (the GPT-2 / Qwen kind, all that this repository
        ships and builds) and complete byte fallback represent every other string, so for them
        only the surrogate case arises. What the normaliser does (NFC, lower-casing) is the
        tokenizer's own and no error."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        try:
            enc = self._tok.encode(text, add_special_tokens=False)
        except TypeError:  # "TextInputSequence must be str": the text is not valid Unicode
            pos = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
            if pos is None:
                raise
            why = (
                "a lone surrogate is not a character and has no UTF-8 bytes (a byte that was not "
                "UTF-8, read with errors='surrogateescape'?); decode the input with "
                "errors='replace'"
            )
            raise self._cannot(repr(text[pos]), pos, why) from None
        except Exception as e:  # the Rust side's own errors (an unknown token with no unk id)
            if type(e) is not Exception:
                raise
            raise ValueError(
                f"the tokenizer in {self.directory} cannot encode this text: {e}"
            ) from e
        ids = enc.ids  # a fresh list on each access
        if self._unk is not None and self._unk[0] in ids:
            unk_id, unk = self._unk
            for t, (a, b) in zip(ids, enc.offsets, strict=True):
                if t == unk_id and text[a:b] != unk:  # not the unknown token itself, as text
                    why = f"it is not in the vocabulary and would become the unknown token {unk!r}"
                    raise self._cannot(repr(text[a:b]), a, why)
        if self._may_drop:
            self._refuse_dropped(text, enc)
        return ids

    def _refuse_dropped(self, text: str, enc) -> None:
        """ValueError for the first character this BPE (no unknown token, not every byte) would
        drop: the text outside added tokens, normalised and pre-tokenised as the model sees it,
        must be in the vocabulary character by character (or whole, if merges are ignored)."""
        tok, model = self._tok, self._tok.model
        prefix, suffix = model.continuing_subword_prefix or "", model.end_of_word_suffix or ""
        added = set(tok.get_added_tokens_decoder())
        spans = [o for t, o in zip(enc.ids, enc.offsets, strict=True) if t in added]
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        for start, end in zip([0, *(b for _, b in spans)], [*(a for a, _ in spans), len(text)]):
            seg = text[start:end]
            seg = tok.normalizer.normalize_str(seg) if tok.normalizer else seg
            pre = tok.pre_tokenizer
            for piece, (a, b) in pre.pre_tokenize_str(seg) if pre else [(seg, (0, len(seg)))]:
                if model.ignore_merges and model.token_to_id(piece + suffix) is not None:
                    continue
                for j, ch in enumerate(piece):
                    key = (prefix if j else "") + ch + (suffix if j == len(piece) - 1 else "")
                    if model.token_to_id(key) is not None:
                        continue
                    what, where = repr(ch), start + a + (j if b - a == len(piece) else 0)
                    if self._byte_level and all(c in byte_of for c in piece):
                        word = bytes(byte_of[c] for c in piece).decode("utf-8", "replace")
                        what = f"the byte 0x{byte_of[ch]:02x} (of {word!r})"
                    why = "its BPE vocabulary lacks it and has no unknown token to stand for it"
                    raise self._cannot(what, where, why + " (the model would drop it)")

    def _has_id(self, i: int) -> bool:
        return self._tok.id_to_token(i) is not None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of ``ids``. An id outside [0, vocab_size) is a ValueError naming it, its
        position and the size (``check_ids``), before the ``tokenizers`` library sees it: that
        drops an unknown id silently and overflows on a negative one."""
        ids = check_ids(ids, self.vocab_size, self._has_id)
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_spaces else text

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kw) -> list[int]:
        """The checkpoint's own chat template rendered as transformers does, then encoded with no
        special tokens added (as ``apply_chat_template(tokenize=True)`` does)."""
        if self.chat_template is None:
            raise ValueError(
                f"the tokenizer in {self.directory} has no chat template (no chat_template in "
                "tokenizer_config.json, no chat_template.jinja); give the prompt as text"
            )
        specials = {k: v for k, v in self.special_tokens.items() if v is not None}
        text = render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=specials,
            **kw,
        )
        return self.encode(text)

    def to_json(self) -> str:
        """The ``tokenizer.json`` text (for ``checkpoints.save_hf``)."""
        return self._tok.to_str(pretty=True)
