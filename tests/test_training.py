"""Training: corpus manifest integrity, deterministic data order, MTP-only phase, and a run killed
with SIGKILL resuming to the same loss curve."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mtpspec import config as C
from mtpspec import models
from mtpspec.tokenizers import ByteTokenizer
from mtpspec.training import TrainConfig, build_manifest, load_corpus
from mtpspec.training import data as data_lib
from mtpspec.training.train import make_optimizer, make_train_step

REPO = pathlib.Path(__file__).resolve().parent.parent


def _write_files(root: pathlib.Path, n: int = 12):
    rng = np.random.default_rng(0)
    for i in range(n):
        words = rng.choice(["def", "return", "self", "x", "=", "(", ")", ":", "\n    "], 900)
        (root / f"mod{i:02d}.py").write_text(" ".join(words))


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "def f(x):\n    return x  # ünïcode"
    assert tok.decode(tok.encode(text)) == text
    assert max(tok.encode(text)) < tok.vocab_size == 256


def test_manifest_pins_the_corpus(tmp_path):
    _write_files(tmp_path)
    manifest = build_manifest(10**6, root=tmp_path)
    corpus = load_corpus(manifest, root=tmp_path, eval_fraction=0.3)
    assert len(corpus.train) and len(corpus.eval) and corpus.eval_files
    (tmp_path / manifest["files"][0]["path"]).write_text("changed")
    with pytest.raises(ValueError, match="does not match its manifest hash"):
        load_corpus(manifest, root=tmp_path)
    (tmp_path / manifest["files"][0]["path"]).unlink()
    with pytest.raises(OSError, match="corpus file missing"):
        load_corpus(manifest, root=tmp_path)


def test_batches_are_a_function_of_the_step():
    data = np.arange(1000, dtype=np.uint8)
    a = data_lib.batch_at(data, 7, batch=3, seq_len=16, seed=1)
    b = data_lib.batch_at(data, 7, batch=3, seq_len=16, seed=1)
    c = data_lib.batch_at(data, 8, batch=3, seq_len=16, seed=1)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 17) and not np.array_equal(a, c)


def test_mtp_only_phase_changes_only_the_mtp_head():
    config = C.tiny_hybrid(vocab_size=256)
    params = models.init_params(config, jax.random.key(0))
    tc = TrainConfig(steps=10, batch=2, seq_len=16, phase="mtp_only", warmup=1)
    opt = make_optimizer(tc)
    step = make_train_step(config, tc, opt)
    batch = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 17)), jnp.int32)
    new, state, _ = step(params, opt.init(params), batch)  # lr is 0 on the warm-up's first step
    new, _, metrics = step(new, state, batch)
    for key in params:
        changed = jax.tree.leaves(
            jax.tree.map(lambda a, b: bool(jnp.any(a != b)), params[key], new[key])
        )
        assert any(changed) == (key == "mtp"), key
    assert np.isfinite(float(metrics["mtp"]))
    assert isinstance(opt, optax.GradientTransformation)


def _run(workdir, corpus, *extra):
    """experiments.train as a subprocess on a small generated corpus (independent of the stdlib)."""
    cmd = [
        sys.executable, "-m", "experiments.train", f"--workdir={workdir}", "--preset=tiny",
        "--steps=14", "--save_every=5", "--eval_every=100", "--log_every=100", "--batch=2",
        "--seq_len=32", f"--manifest={corpus / 'manifest.json'}", f"--corpus_root={corpus}",
        *extra,
    ]  # fmt: skip
    cache = os.environ.get("MTPSPEC_TEST_JAX_CACHE", str(REPO / ".jax_cache"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if cache != "off":  # the three runs compile the same train step
        env.update(
            JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5"
        )
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _losses(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows], [r["loss"] for r in rows]


def test_sigkilled_run_resumes_with_the_same_loss_curve(tmp_path):
    """SIGKILL right after step 10's metrics line, before its checkpoint: the run resumes from the
    step-5 checkpoint, rewinds the metrics, redoes 6..10 and matches an uninterrupted run."""
    kill_at = 10
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write_files(corpus, n=40)  # enough files that the 10 % held-out split is not empty
    (corpus / "manifest.json").write_text(json.dumps(build_manifest(10**6, root=corpus)))
    ref = _run(tmp_path / "ref", corpus)
    assert ref.returncode == 0, ref.stderr[-2000:]
    killed = _run(tmp_path / "run", corpus, f"--kill_at_step={kill_at}")
    assert killed.returncode == -9, killed.stderr[-2000:]  # really SIGKILLed
    steps, _ = _losses(tmp_path / "run")
    assert steps[-1] == kill_at
    resumed = _run(tmp_path / "run", corpus)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from step" in resumed.stdout + resumed.stderr
    ref_steps, ref_losses = _losses(tmp_path / "ref")
    got_steps, got_losses = _losses(tmp_path / "run")
    assert got_steps == ref_steps == list(range(1, 15))
    np.testing.assert_allclose(got_losses, ref_losses, rtol=1e-6)
