"""The shipped default model: it loads, is the documented shape, has learnt its corpus, and its
MTP speculation reproduces greedy decoding on a held-out prompt with drafts accepted."""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import checkpoints
from mtpspec import config as C
from mtpspec.tokenizers import ByteTokenizer
from mtpspec.training import losses

ASSETS = pathlib.Path(__file__).resolve().parent.parent / "mtpspec" / "assets"


@pytest.mark.slow(27)
def test_shipped_model_loads_predicts_held_out_text_and_speculates_exactly():
    config, params = checkpoints.restore_params(ASSETS / "default_model")
    assert config == C.default_model()
    tok = ByteTokenizer()
    prompts = json.loads((ASSETS / "demo_prompts.json").read_text())["prompts"]
    ids = np.asarray([tok.encode(p["text"]) for p in prompts], np.int32)
    parts = losses(config, params, jnp.asarray(ids))
    assert float(parts["main"]) < 1.5  # nats/byte on held-out code; uniform would be 5.55
    prompt = [ids[0].tolist()]
    plain = mtpspec.generate(config, params, prompt, max_new_tokens=32)
    spec = mtpspec.generate(
        config, params, prompt, max_new_tokens=32,
        speculative=mtpspec.SpecConfig(proposer="mtp", num_draft=3, commit="replay"),
    )  # fmt: skip
    assert spec.tokens == plain.tokens
    assert spec.stats["tau"] > 1.5  # the trained MTP head's drafts are accepted
