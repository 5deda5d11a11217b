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
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
from collections.abc import Sequence

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


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255. No special tokens, so no EOS unless given; a chat
    template only when given one (``chat_template``, rendered to text, then bytes)."""

    vocab_size = 256

    def __init__(self, chat_template: str | None = None, eos_token_ids: Sequence[int] = ()):
        self.chat_template = chat_template
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)

    def encode(self, text: str) -> list[int]:
        # surrogateescape: text that came from bytes that are not UTF-8 (argv, file names, read
        # with errors="surrogateescape") encodes back to exactly those bytes
        return list(text.encode("utf-8", "surrogateescape"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

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

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
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
