"""Text in, text out: a tokenizer around ``decoding`` for one prompt, with streaming and stop
strings.

    tok = checkpoints.load_tokenizer(path)
    ids = chat_prompt(tok, "What is 2 + 2?", system="Be terse.")      # or tok.encode(text)
    result = complete(config, params, tok, ids, max_new_tokens=64, speculative=SpecConfig("mtp"))
    result.text, result.stop_reason, result.stats["tau"]

    stream = TextStream(config, params, tok, ids, max_new_tokens=64, stop=["\\n\\n"])
    for piece in stream:            # text as each verify step is accepted
        print(piece, end="", flush=True)
    stream.result                   # the same TextResult once the stream is exhausted

EOS: by default the tokenizer's ``eos_token_ids`` (pass ``eos_id=None`` for none, or ids).
Stop strings end the text before the string (not included) with stop reason "stop"; the
sequence stops at the verify step that completed it (tokens up to that step are kept in
``tokens``). Text is streamed without a trailing incomplete UTF-8 sequence and without a tail
that could still become a stop string.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from mtpspec.decoding import api

AUTO = "auto"


class TextResult(NamedTuple):
    text: str  # the decoded continuation (special tokens skipped; cut before a stop string)
    tokens: list[int]  # every emitted id (EOS included when hit)
    stop_reason: str  # "eos" | "length" | "capacity" | "stop"
    stats: dict  # steps, emitted, tau (tokens per verify step), run_s, tokens_per_s, ...


def chat_prompt(tokenizer, user: str, *, system: str | None = None, history=()) -> list[int]:
    """Ids of a chat turn through the tokenizer's own template: ``history`` (earlier
    {"role", "content"} messages), an optional system message first, then ``user``; ends with
    the assistant's generation prompt."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        *history,
        {"role": "user", "content": user},
    ]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def _with_default_eos(options: dict, tokenizer) -> dict:
    """``options`` with ``eos_id`` = the tokenizer's EOS ids when absent or ``AUTO``."""
    if options.get("eos_id", AUTO) != AUTO:
        return options
    return {**options, "eos_id": list(getattr(tokenizer, "eos_token_ids", ())) or None}


def _check_stop(stop) -> tuple[str, ...]:
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
    return tuple(stop)


class TextStream:
    """Iterate to get text pieces as they are accepted; ``result`` once exhausted. Keyword
    arguments are ``generate``'s (``max_new_tokens`` required), plus ``stop`` strings;
    ``eos_id`` defaults to the tokenizer's EOS ids."""

    def __init__(self, config, params, tokenizer, prompt_ids: list[int], *, stop=(), **options):
        self.tokenizer = tokenizer
        self.stop = _check_stop(stop)
        options = _with_default_eos(options, tokenizer)
        self._prepared = api.prepare(config, params, [list(prompt_ids)], **options)
        self.result: TextResult | None = None

    def __iter__(self) -> Iterator[str]:
        tokens: list[int] = []
        shown = ""
        reason, steps, first_s = "length", 0, None
        warm_t, warm_tokens = None, 0  # after the first verify step (both programs compiled)
        hold = max((len(s) for s in self.stop), default=1) - 1
        t0 = time.perf_counter()
        for item in api.stream_steps(self._prepared):
            now = time.perf_counter()
            if first_s is None:
                first_s = now - t0  # the prefill, its compile included
            if item.step == 1:
                warm_t, warm_tokens = now, len(tokens) + len(item.tokens[0])
            steps = item.step
            tokens += item.tokens[0]
            text = self.tokenizer.decode(tokens)
            cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0 or item.stop_reasons[0] is not None:  # the end: show everything left
                text, reason = (text[:cut], "stop") if cut >= 0 else (text, item.stop_reasons[0])
                if len(text) > len(shown):
                    yield text[len(shown) :]
                shown = text
                break
            safe = text[:-1] if text.endswith("\ufffd") else text
            safe = safe[: max(len(safe) - hold, len(shown))]
            if len(safe) > len(shown) and safe.startswith(shown):
                yield safe[len(shown) :]
                shown = safe
        end = time.perf_counter()
        emitted = max(len(tokens) - 1, 0)
        warm_s = end - warm_t if warm_t is not None else 0.0
        stats = {
            "steps": steps,
            "emitted": emitted,
            "tau": emitted / steps if steps else 0.0,
            "first_token_s": first_s or 0.0,  # prefill, compile included
            "run_s": end - t0,  # everything, compiles included
            # after the first verify step (both programs compiled), Python stepping included
            "tokens_per_s": (len(tokens) - warm_tokens) / warm_s if warm_s > 0 else 0.0,
        }
        self.result = TextResult(shown, tokens, reason, stats)


def complete(config, params, tokenizer, prompt_ids: list[int], *, stop=(), **options):
    """The whole continuation as a ``TextResult``. Without stop strings this is one on-device
    ``generate`` call (its timing statistics); with them, a ``TextStream`` (stopping at the
    verify step that completes a stop string)."""
    stop = _check_stop(stop)
    if stop:
        stream = TextStream(config, params, tokenizer, prompt_ids, stop=stop, **options)
        for _ in stream:
            pass
        return stream.result
    options = _with_default_eos(options, tokenizer)
    result = api.generate(config, params, [list(prompt_ids)], **options)
    tokens = result.tokens[0]
    return TextResult(tokenizer.decode(tokens), tokens, result.stop_reasons[0], result.stats)
