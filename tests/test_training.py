"""Training: corpus manifest integrity, deterministic data order, MTP-only phase, and a run killed
with SIGKILL resuming to the same loss curve."""

from __future__ import annotations

import json
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
from tests import conftest

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
    env = conftest.subprocess_env()  # the three runs compile the same train step: cached
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _losses(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows], [r["loss"] for r in rows]


@pytest.mark.slow(90)
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


# ---- MTP heads for any base (issue 18) -----------------------------------------------------------


def _leaf_floats(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree) if hasattr(x, "shape"))


def test_mtp_only_optimizer_holds_state_for_the_head_alone():
    config = C.tiny_hybrid(vocab_size=256)
    params = models.init_params(config, jax.random.key(0))
    joint = make_optimizer(TrainConfig(steps=10, phase="joint")).init(params)
    mtp_only = make_optimizer(TrainConfig(steps=10, phase="mtp_only", loss="distill"))
    state = mtp_only.init(params)
    head = _leaf_floats(params["mtp"])
    assert _leaf_floats(joint) >= 2 * _leaf_floats(params)  # AdamW: two moments per weight
    assert 2 * head <= _leaf_floats(state) <= 2 * head + 16  # moments of the head + counters


@pytest.mark.parametrize("loss", ["distill", "ce"])
def test_mtp_only_training_lowers_its_loss_and_keeps_the_trunk(loss):
    config = C.tiny_hybrid(vocab_size=64)
    params = models.init_params(config, jax.random.key(1), norm_scale=0.1)
    tc = TrainConfig(steps=30, batch=4, seq_len=24, phase="mtp_only", loss=loss, warmup=2, lr=1e-2)
    opt = make_optimizer(tc)
    step = make_train_step(config, tc, opt)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 64, (4, 25))
    batch = jnp.asarray(np.where(rng.random((4, 25)) < 0.8, base % 8, base), jnp.int32)
    state, new, first = opt.init(params), params, None
    for _ in range(30):
        new, state, m = step(new, state, batch)
        first = first if first is not None else m
    key = "mtp_kl" if loss == "distill" else "mtp"
    assert float(m[key]) < 0.7 * float(first[key]) and float(m["mtp_kl"]) >= 0
    assert 0 <= float(m["mtp_agree"]) <= 1
    trunk = {k: v for k, v in params.items() if k != "mtp"}
    assert all(
        bool(jnp.all(a == b))
        for a, b in zip(jax.tree.leaves(trunk), jax.tree.leaves({k: new[k] for k in trunk}))
    )


def test_distill_needs_the_mtp_only_phase():
    with pytest.raises(ValueError, match="needs phase='mtp_only'"):
        TrainConfig(phase="joint", loss="distill")
    with pytest.raises(ValueError, match="loss must be"):
        TrainConfig(loss="kl")


def test_chained_mtp_training_trains_the_later_drafts():
    """mtp_depth=3 (mtp_only, distill): the chained depths' KL falls — the objective the
    proposer's drafts 2..k need, which a depth-1 loss does not see — and the depth-1 metrics
    keep their names; bad depths are refused."""
    config = C.tiny_hybrid(vocab_size=64)
    params = models.init_params(config, jax.random.key(2), norm_scale=0.1)
    tc = TrainConfig(steps=40, batch=4, seq_len=24, phase="mtp_only", loss="distill", warmup=2,
                     lr=1e-2, mtp_depth=3)  # fmt: skip
    opt = make_optimizer(tc)
    step = make_train_step(config, tc, opt)
    rng = np.random.default_rng(1)
    batch = jnp.asarray(rng.integers(0, 8, (4, 25)), jnp.int32)
    state, new, first = opt.init(params), params, None
    for _ in range(40):
        new, state, m = step(new, state, batch)
        first = first if first is not None else m
    assert {"mtp_kl", "mtp_kl_d2", "mtp_kl_d3", "mtp_agree_d3"} <= set(m)
    assert float(m["loss"]) == pytest.approx(
        (float(m["mtp_kl"]) + float(m["mtp_kl_d2"]) + float(m["mtp_kl_d3"])) / 3, rel=1e-5
    )
    for key in ("mtp_kl_d2", "mtp_kl_d3"):
        assert float(m[key]) < 0.7 * float(first[key]), key
    for bad in (0, 24):
        with pytest.raises(ValueError, match="mtp_depth"):
            TrainConfig(seq_len=24, mtp_depth=bad)


def test_load_text_reads_files_directories_and_jsonl(tmp_path):
    tok = ByteTokenizer(eos_token_ids=[0])
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    for i in range(30):
        (d / "sub" / f"f{i}.txt").write_text(f"document {i} " * 20)
    (d / ".hidden").write_text("never read")
    (d / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    corpus = data_lib.load_text(d, tok)
    assert corpus.train.dtype == np.int32 and len(corpus.eval_files) >= 1
    assert int((corpus.train == 0).sum()) + int((corpus.eval == 0).sum()) == 30  # EOS between
    assert not any("hidden" in f or "blob" in f for f in corpus.eval_files)
    rows = [json.dumps({"text": f"row {i} " * 10}) for i in range(25)]
    (tmp_path / "x.jsonl").write_text("\n".join(rows) + "\n")
    j = data_lib.load_text(tmp_path / "x.jsonl", ByteTokenizer())
    assert len(j.train) + len(j.eval) == sum(len(f"row {i} " * 10) + 2 for i in range(25))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"txt": 1}\n')
    with pytest.raises(ValueError, match="line 2 has no string field 'text'"):
        data_lib.load_text(tmp_path / "bad.jsonl", ByteTokenizer())
    (tmp_path / "one.txt").write_text("x" * 10)
    with pytest.raises(ValueError, match="held-out tokens"):
        data_lib.load_text(tmp_path / "one.txt", ByteTokenizer())
    with pytest.raises(OSError, match="no training data"):
        data_lib.load_text(tmp_path / "missing", ByteTokenizer())


@pytest.mark.slow(45)
def test_fresh_head_for_an_hf_base_without_mtp_end_to_end(tmp_path):
    """experiments.train --init=<HF dir without mtp.*> --phase=mtp_only --data=<dir>: a fresh
    head is trained, the trunk is bit for bit the base's, greedy output is unchanged, W/final
    loads with checkpoints.load and has an MTP head; metrics carry the learning rate and
    TensorBoard events are written."""
    import dataclasses

    import mtpspec
    from mtpspec import checkpoints

    config = dataclasses.replace(C.tiny_hybrid(vocab_size=256), mtp_num_layers=0)
    params = models.init_params(config, jax.random.key(2), norm_scale=0.1)
    params = {k: v for k, v in params.items() if k != "mtp"}
    base = tmp_path / "base"
    checkpoints.save_hf(config, params, base, tokenizer=ByteTokenizer())
    data = tmp_path / "data"
    data.mkdir()
    _write_files(data, n=20)
    work = tmp_path / "w"
    cmd = [
        sys.executable, "-m", "experiments.train", f"--init={base}", "--phase=mtp_only",
        f"--data={data}", "--steps=12", f"--workdir={work}", "--batch=2", "--seq_len=32",
        "--save_every=6", "--eval_every=6", "--log_every=4", "--warmup=2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "a fresh MTP head" in proc.stdout and "eta" in proc.stdout
    cfg, trained = checkpoints.load(work / "final")
    assert cfg.mtp_num_layers == 1 and "mtp" in trained
    base_cfg, base_params = checkpoints.load(base)
    for a, b in zip(jax.tree.leaves(base_params), jax.tree.leaves(
        {k: trained[k] for k in base_params}), strict=True):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    prompts = [[100, 101, 102, 32, 40], [61, 62]]
    plain = mtpspec.generate(base_cfg, base_params, prompts, max_new_tokens=12).tokens
    assert mtpspec.generate(cfg, trained, prompts, max_new_tokens=12).tokens == plain
    spec = mtpspec.SpecConfig("mtp", 2)
    assert mtpspec.generate(cfg, trained, prompts, max_new_tokens=12, speculative=spec).tokens == (
        plain
    )
    rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all("lr" in r and "mtp_kl" in r for r in rows)
    assert list((work / "tb").glob("events.out.tfevents.*"))
