"""Real text: the BPE tokenizer fixture (tests/fixtures/chat, made by make_chat_fixture.py with
transformers' answers in reference.json), chat templates, EOS lists, stop strings, the text API
and the generate CLI."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import mtpspec
from mtpspec import checkpoints
from mtpspec import text as text_api
from mtpspec.tokenizers import CHATML_TEMPLATE, ByteTokenizer, HFTokenizer, render_chat

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAT = ROOT / "tests" / "fixtures" / "chat"
REF = json.loads((CHAT / "reference.json").read_text(encoding="utf-8"))
MAX_NEW = 40  # as the fixture script's generate


@pytest.fixture(scope="module")
def tok():
    return checkpoints.load_tokenizer(CHAT)


@pytest.fixture(scope="module")
def model():
    return checkpoints.load(CHAT)


# ---- the tokenizer against transformers ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REF["texts"]))
def test_ids_and_text_equal_transformers(tok, name):
    case = REF["texts"][name]
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(case["ids"], skip_special_tokens=False) == case["decoded_with_specials"]


@pytest.mark.parametrize("name", sorted(REF["chats"]))
def test_chat_ids_equal_transformers(tok, name):
    case = REF["chats"][name]
    assert tok.apply_chat_template(case["messages"]) == case["ids"]


def test_eos_ids_come_from_the_generation_config(tok, tmp_path):
    assert list(tok.eos_token_ids) == REF["eos_token_ids"] and len(tok.eos_token_ids) == 2
    # without generation_config.json: config.json's single id, then the tokenizer's eos_token
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (tmp_path / name).write_bytes((CHAT / name).read_bytes())
    assert HFTokenizer(tmp_path).eos_token_ids == (REF["eos_token_ids"][0],)
    (tmp_path / "config.json").unlink()
    assert HFTokenizer(tmp_path).eos_token_ids == (tok.token_to_id("<|im_end|>"),)


def test_chat_template_file_wins_and_missing_template_is_a_clear_error(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((CHAT / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    t = HFTokenizer(tmp_path)
    ids = t.apply_chat_template([{"role": "user", "content": "hi"}])
    assert t.decode(ids, skip_special_tokens=False).startswith("<|im_start|>user\nhi")
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="no chat template"):
        HFTokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "messages, match",
    [([], "non-empty list"), ("hi", "non-empty list"), ([{"content": "x"}], "'role'")],
)
def test_bad_messages_are_refused(tok, messages, match):
    with pytest.raises(ValueError, match=match):
        tok.apply_chat_template(messages)


def test_template_errors_and_raise_exception_become_value_errors():
    template = "{{ raise_exception('only user turns') }}"
    with pytest.raises(ValueError, match="only user turns"):
        render_chat(template, [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="chat template failed"):
        render_chat("{% for %}", [{"role": "user", "content": "x"}])


def test_byte_tokenizer_has_the_same_interface():
    b = ByteTokenizer()
    assert b.eos_token_ids == () and b.decode(b.encode("Grüße 🙂")) == "Grüße 🙂"
    with pytest.raises(ValueError, match="no chat template"):
        b.apply_chat_template([{"role": "user", "content": "x"}])
    chat = ByteTokenizer(chat_template=CHATML_TEMPLATE, eos_token_ids=[10])
    ids = chat.apply_chat_template([{"role": "user", "content": "é"}])
    assert bytes(ids).decode() == "<|im_start|>user\né<|im_end|>\n<|im_start|>assistant\n"


def test_load_tokenizer_choices(tmp_path):
    assert isinstance(
        checkpoints.load_tokenizer(ROOT / "mtpspec/assets/default_model"), ByteTokenizer
    )
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    with pytest.raises(OSError, match="no tokenizer.json"):
        checkpoints.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(ValueError, match="not a tokenizers-format"):
        checkpoints.load_tokenizer(tmp_path)


# ---- EOS-stopped greedy continuations against transformers ---------------------------------------


SPECS = {
    "plain": None,
    "mtp": mtpspec.SpecConfig(proposer="mtp", num_draft=2),
    "ngram": mtpspec.SpecConfig(proposer="ngram", num_draft=3),
}


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_eos_stopped_greedy_equals_transformers(tok, model, spec):
    config, params = model
    cases = [REF["chats"][n] for n in sorted(REF["chats"])]
    result = mtpspec.generate(
        config, params, [c["ids"] for c in cases], max_new_tokens=MAX_NEW,
        eos_id=list(tok.eos_token_ids), speculative=SPECS[spec],
    )  # fmt: skip
    for case, tokens, reason in zip(cases, result.tokens, result.stop_reasons, strict=True):
        assert tokens == case["continuation"]
        assert reason == ("eos" if case["stopped_at_eos"] else "length")
        assert tok.decode(tokens) == case["text"]
    assert {c["continuation"][-1] for c in cases} == set(tok.eos_token_ids)  # both ids stop


def test_complete_and_stream_give_transformers_text(tok, model):
    config, params = model
    case = REF["chats"]["with_system"]
    done = text_api.complete(config, params, tok, case["ids"], max_new_tokens=MAX_NEW)
    assert done.text == case["text"] and done.tokens == case["continuation"]
    assert done.stop_reason == "eos"
    spec = SPECS["mtp"]
    stream = text_api.TextStream(
        config, params, tok, case["ids"], max_new_tokens=MAX_NEW, speculative=spec
    )
    pieces = list(stream)
    assert "".join(pieces) == case["text"] and stream.result.text == case["text"]
    assert stream.result.tokens == case["continuation"] and stream.result.stop_reason == "eos"
    none = text_api.complete(config, params, tok, case["ids"], max_new_tokens=MAX_NEW, eos_id=None)
    assert none.stop_reason == "length" and len(none.tokens) == MAX_NEW


def test_stop_strings_cut_the_text_before_them(tok, model):
    config, params = model
    case = REF["chats"]["with_system"]
    text = case["text"]
    stop = text[6:9]  # a string inside the continuation
    got = text_api.complete(
        config, params, tok, case["ids"], max_new_tokens=MAX_NEW, stop=[stop, "never there"]
    )
    assert got.stop_reason == "stop" and got.text == text[: text.find(stop)]
    assert tok.decode(got.tokens).startswith(got.text + stop)
    stream = text_api.TextStream(
        config, params, tok, case["ids"], max_new_tokens=MAX_NEW, stop=stop
    )
    assert "".join(stream) == got.text  # nothing of the stop string is ever shown
    with pytest.raises(ValueError, match="stop must be"):
        text_api.complete(config, params, tok, case["ids"], max_new_tokens=4, stop=[""])


def test_chat_prompt_builds_the_turn(tok):
    ids = text_api.chat_prompt(tok, "Grüße! Was ist 2 + 2?", system="You are terse.")
    want = REF["chats"]["with_system"]["messages"][:2]
    assert ids == tok.apply_chat_template(want)


# ---- export: generation_config, EOS, tokenizer files ------------------------------------------


def test_export_carries_eos_chat_template_and_tokenizer(tok, model, tmp_path):
    config, params = model
    out = tmp_path / "export"
    written = checkpoints.save_hf(config, params, out, tokenizer=tok)
    assert "generation_config.json" in written
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == REF["eos_token_ids"]
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == REF["eos_token_ids"][0]
    again = checkpoints.load_tokenizer(out)
    assert again.eos_token_ids == tok.eos_token_ids
    case = REF["chats"]["user_only"]
    assert again.apply_chat_template(case["messages"]) == case["ids"]
    byte_out = tmp_path / "bytes"
    checkpoints.save_hf(config, params, byte_out, eos_token_id=[3, 4])
    assert json.loads((byte_out / "generation_config.json").read_text())["eos_token_id"] == [3, 4]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        checkpoints.save_hf(config, params, tmp_path / "bad", eos_token_id=config.vocab_size)
    with pytest.raises(ValueError, match="eos_token_id must be"):  # as decoding checks eos_id
        checkpoints.save_hf(config, params, tmp_path / "bad", eos_token_id="2")


# ---- the CLI ------------------------------------------------------------------------------------


def _cli(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "experiments.generate", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_cli_chat_json_equals_transformers(tmp_path):
    """A chat turn through the CLI, drafted as an MTP tree (2x1) with XLA's attention: the
    transformers continuation exactly."""
    out = tmp_path / "out.json"
    case = REF["chats"]["user_only"]  # the CLI builds one user turn (+ --system)
    proc = _cli(
        f"--checkpoint={CHAT}", "--chat", f"--prompt={case['messages'][0]['content']}",
        f"--max_new_tokens={MAX_NEW}", "--proposer=mtp", "--tree=2x1", "--attention=xla",
        f"--json_out={out}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["prompt_ids"] == case["ids"]
    assert got["tokens"] == case["continuation"] and got["text"] == case["text"]
    assert got["stop_reason"] == "eos" and got["stats"]["steps"] >= 1
    assert "<|im_start|>user" in proc.stdout  # the prompt is echoed
    assert "compiling" in proc.stderr
    assert " I " not in proc.stderr and "INFO" not in proc.stderr  # third-party INFO silenced


@pytest.mark.slow(24)
def test_cli_draft_proposer_and_eos_none(tmp_path):
    out = tmp_path / "out.json"
    case = REF["chats"]["user_only"]
    proc = _cli(
        f"--checkpoint={CHAT}", "--prompt_ids=" + ",".join(map(str, case["ids"])),
        "--max_new_tokens=12", "--proposer=draft", f"--draft_checkpoint={CHAT}", "--eos=none",
        "--nostream", f"--json_out={out}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["stop_reason"] == "length" and len(got["tokens"]) == 12
    assert got["tokens"][: len(case["continuation"]) - 1] == case["continuation"][:-1]
    bad = _cli(f"--checkpoint={CHAT}", "--prompt=x", "--proposer=draft", "--max_new_tokens=2")
    assert bad.returncode != 0 and "--draft_checkpoint" in bad.stderr


def test_logprobs_on_the_fixture_match_transformers_greedy(tok, model):
    """Each emitted token's logprob is finite and the greedy token is the argmax (the largest
    logprob the model gives at that position)."""
    config, params = model
    case = REF["chats"]["user_only"]
    got = mtpspec.generate(
        config, params, [case["ids"]], max_new_tokens=MAX_NEW, eos_id=list(tok.eos_token_ids),
        return_logprobs=True,
    )  # fmt: skip
    assert got.tokens[0] == case["continuation"]
    lp = np.asarray(got.logprobs[0])
    assert np.isfinite(lp).all() and (lp <= 0).all() and len(lp) == len(case["continuation"])
