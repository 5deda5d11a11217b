"""Bad inputs and numerical edges at the API boundary (issue 20's catalogue, decoding and ops
part): each case either behaves correctly (a valid edge) or raises a ValueError / TypeError that
names the problem before any device work — never NaN or garbage passed on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import config as C
from mtpspec import models, ops
from mtpspec.decoding.sampling import filtered_log_probs, seed_key
from tests import faults
from tests.conftest import tiny_training_run
from tests.gdn_testing import random_gdn_inputs

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]


@pytest.fixture(scope="module")
def model():
    config = C.tiny_hybrid(vocab_size=32, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2)
    return config, models.init_params(config, jax.random.key(11), norm_scale=0.1)


@pytest.fixture(scope="module")
def greedy(model):
    config, params = model
    return mtpspec.generate(config, params, PROMPTS, max_new_tokens=12).tokens


# ---- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1e-10, 1e-30])
def test_a_tiny_temperature_tends_to_greedy_instead_of_token_zero(model, greedy, temperature):
    config, params = model
    got = mtpspec.generate(config, params, PROMPTS, max_new_tokens=12, temperature=temperature)
    assert got.tokens == greedy
    logits = jnp.asarray([[3.0, 80.0, -5.0, 80.0]])
    logp = np.asarray(filtered_log_probs(logits, temperature, 0, 1.0))
    assert np.isfinite(logp[0, [1, 3]]).all() and np.allclose(np.exp(logp[0, [1, 3]]), 0.5)
    assert (np.exp(logp[0, [0, 2]]) == 0).all()


def test_numpy_scalars_are_numbers(model):
    config, params = model
    kw = dict(max_new_tokens=8, temperature=0.7, top_k=5, top_p=0.9, seed=3)
    ref = mtpspec.generate(config, params, PROMPTS, **kw).tokens
    np_kw = dict(
        max_new_tokens=np.int64(8),
        temperature=np.float32(0.7),
        top_k=np.int32(5),
        top_p=np.float64(0.9),
        seed=np.uint64(3),
    )
    assert mtpspec.generate(config, params, PROMPTS, **np_kw).tokens == ref


def test_seeds_of_any_size_give_distinct_keys_and_small_ones_are_unchanged():
    seeds = [5, 5 + 2**32, -5, 2**70, 2**70 + 2**40, -(2**70)]
    data = [tuple(np.asarray(jax.random.key_data(seed_key(s))).tolist()) for s in seeds]
    assert len(set(data)) == len(seeds)
    assert data[0] == tuple(np.asarray(jax.random.key_data(jax.random.key(5))).tolist())


@pytest.mark.parametrize("seed", [None, 1.5, "7", True])
def test_a_seed_that_is_not_an_int_is_refused(model, seed):
    config, params = model
    with pytest.raises(TypeError, match="seed must be an int"):
        mtpspec.generate(config, params, PROMPTS, max_new_tokens=4, temperature=1.0, seed=seed)


def test_a_huge_seed_runs(model):
    config, params = model
    a = mtpspec.generate(config, params, PROMPTS, max_new_tokens=6, temperature=1.0, seed=2**70)
    b = mtpspec.generate(config, params, PROMPTS, max_new_tokens=6, temperature=1.0, seed=2**70)
    assert a.tokens == b.tokens


# ---- sizes ---------------------------------------------------------------------------------------


def test_max_new_tokens_beyond_int32_positions_is_refused(model):
    config, params = model
    with pytest.raises(ValueError, match="int32 positions"):
        mtpspec.generate(config, params, PROMPTS, max_new_tokens=2**31)


def test_max_new_tokens_too_large_for_memory_is_refused_before_xla(model):
    config, params = model
    with pytest.raises(ValueError, match="GiB"):
        mtpspec.generate(config, params, PROMPTS, max_new_tokens=10**9)


# ---- ops -----------------------------------------------------------------------------------------


def test_causal_conv1d_refuses_integer_inputs():
    x = jnp.arange(2 * 5 * 4, dtype=jnp.int32).reshape(2, 5, 4)
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        ops.causal_conv1d(x, jnp.ones((4, 4)))
    with pytest.raises(TypeError, match="weight must be a floating-point array"):
        ops.causal_conv1d(x.astype(jnp.float32), jnp.ones((4, 4), jnp.int32))


@pytest.mark.parametrize("n", [[-1, 0], [0, 6], [2, 9]])
def test_commit_counts_outside_the_window_are_refused(n):
    t = 5
    window, x = jnp.zeros((2, 3, 4)), jnp.ones((2, t, 4))
    with pytest.raises(ValueError, match=r"n must be in 0\.\.5"):
        ops.conv_window_after(window, x, jnp.asarray(n))
    q, k, v, g, beta, s0 = random_gdn_inputs(0, 2, t, 1, 1, 4, 4)
    _, _, aux = ops.gated_delta_rule_with_aux(q, k, v, g, beta, initial_state=s0)
    with pytest.raises(ValueError, match=r"n must be in 0\.\.5"):
        ops.state_after(s0, k, aux, jnp.asarray(n))


def test_commit_counts_at_the_edges_are_accepted():
    t = 5
    window, x = jnp.zeros((2, 3, 4)), jnp.ones((2, t, 4))
    out = ops.conv_window_after(window, x, jnp.asarray([0, t]))
    assert (np.asarray(out[0]) == 0).all() and (np.asarray(out[1]) == 1).all()


@pytest.mark.parametrize("method", ["recurrent", "chunk", "assoc", "pallas"])
def test_a_minus_inf_gate_resets_the_state_in_every_form(method):
    """g = −inf is a valid log-decay (the state is wiped at that position): every form must give
    the recurrence's finite answer, and positions before it must be untouched."""
    q, k, v, g, beta, s0 = random_gdn_inputs(1, 2, 12, 2, 2, 16, 16)
    g = g.at[0, 5, 1].set(-jnp.inf).at[1, 0, :].set(-jnp.inf).at[1, 11, 0].set(-jnp.inf)
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    o, s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method=method)
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(s)).all()
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s, ref_s, rtol=1e-4, atol=1e-4)
    # a reset at (seq 1, position 0, all heads): the initial state does not matter
    o2, _ = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0 * 3.0, method=method)
    np.testing.assert_allclose(o2[1], o[1], rtol=1e-4, atol=1e-4)


def test_nan_weights_are_refused_by_name(model):
    config, params = model
    layers = list(params["layers"])
    mlp = dict(layers[1]["mlp"], w_down=layers[1]["mlp"]["w_down"].at[0, 0].set(jnp.nan))
    layers[1] = dict(layers[1], mlp=mlp)
    bad = dict(params, layers=layers)
    with pytest.raises(ValueError, match=r"\['layers'\]\[1\]\['mlp'\]\['w_down'\].*NaN"):
        mtpspec.generate(config, bad, PROMPTS, max_new_tokens=4)


@pytest.mark.parametrize("proposer", [None, "ngram", "mtp"])
def test_a_capacity_that_fits_the_prompt_but_not_its_bucket_runs(model, proposer):
    """Prompts are padded to a bucket of 16 for prefill; a capacity between the prompt length
    and its bucket holds the prompt and must run (padding writes beyond capacity are dropped),
    emitting a prefix of the default-capacity tokens and stopping with reason "capacity"."""
    config, params = model
    prompts = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]  # 17 -> bucket 32
    spec = None if proposer is None else mtpspec.SpecConfig(proposer, 2)
    ref = mtpspec.generate(config, params, prompts, max_new_tokens=12, speculative=spec)
    got = mtpspec.generate(
        config, params, prompts, max_new_tokens=12, speculative=spec, capacity=22
    )
    assert got.stop_reasons[0] == "capacity" and got.stop_reasons[1] == "length"
    assert 0 < len(got.tokens[0]) < len(ref.tokens[0])
    assert got.tokens[0] == ref.tokens[0][: len(got.tokens[0])]
    assert got.tokens[1] == ref.tokens[1]
    with pytest.raises(ValueError, match="cannot hold the longest prompt"):
        mtpspec.generate(config, params, prompts, max_new_tokens=4, capacity=17)


# ---- checkpoints: a config.json that is not what it says --------------------------------------

HF_FIXTURE = "tests/fixtures/hf/qwen3_5"


def _hf_config_cases():
    import json
    import pathlib

    base = json.loads(
        (pathlib.Path(__file__).parent.parent / HF_FIXTURE / "config.json").read_text()
    )
    no_types = {k: v for k, v in base.items() if k != "layer_types"}
    return [
        ("a list", [1, 2], "must be a JSON object"),
        ("text_config null", {**base, "text_config": None}, "text_config must be a JSON object"),
        ("rope as a string", {**base, "rope_parameters": "linear"}, "rope_parameters"),
        ("a count as a string", {**base, "num_hidden_layers": "4"}, "'num_hidden_layers'"),
        ("a NaN head count", {**base, "num_attention_heads": float("nan")}, "num_attention_heads"),
        ("a fractional head dim", {**base, "head_dim": 31.5}, "'head_dim' must be an integer"),
        ("unknown layer types", {**base, "layer_types": ["attn"] * 4}, "layer_types must be"),
        ("interval 0", {**no_types, "full_attention_interval": 0}, "full_attention_interval"),
        ("mlp_only_layers 3", {**base, "mlp_only_layers": 3}, "mlp_only_layers"),
    ]


@pytest.mark.parametrize(
    "name,cfg,match", _hf_config_cases(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_a_malformed_hf_config_file_is_a_clear_value_error(tmp_path, name, cfg, match):
    import json

    from mtpspec.checkpoints.hf_config import from_hf_config

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        from_hf_config(tmp_path)


# ---- training: hyper-parameters that would train garbage ---------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("lr", float("nan")),
        ("lr", -1e-3),
        ("lr", 0.0),
        ("lr", float("inf")),
        ("weight_decay", -0.1),
        ("clip", float("nan")),
        ("mtp_weight", -1.0),
        ("warmup", -1),
        ("steps", 0),
        ("batch", 2.5),
        ("seed", True),
    ],
)
def test_a_training_config_that_would_train_garbage_is_refused(field, value):
    from mtpspec.training import TrainConfig

    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_a_sensible_training_config_is_accepted():
    from mtpspec.training import TrainConfig

    tc = TrainConfig(lr=np.float32(1e-3), steps=np.int64(5), warmup=0, clip=0.0, mtp_weight=0.0)
    assert tc.steps == 5


# ---- checkpoints: a save that fails loses nothing ------------------------------------------------


def test_a_failed_overwrite_leaves_the_previous_checkpoint_intact(model, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    from mtpspec import checkpoints

    config, params = model
    path = tmp_path / "ckpt"
    checkpoints.save_params(path, config, params)
    changed = jax.tree.map(lambda x: x + 1.0, params)

    faults.disk_full(monkeypatch, ocp.StandardCheckpointer, "save")
    with pytest.raises(OSError, match="No space left"):
        checkpoints.save_params(path, config, changed, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing half-written beside
    _, back = checkpoints.load(path)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    checkpoints.save_params(path, config, changed, overwrite=True)  # a save that completes
    _, back = checkpoints.load(path)
    jax.tree.map(np.testing.assert_array_equal, back, changed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_failed_hf_export_overwrite_leaves_the_previous_export_intact(
    model, tmp_path, monkeypatch
):
    from mtpspec import checkpoints
    from mtpspec.checkpoints import hf_export

    config, params = model
    path = tmp_path / "hf"
    checkpoints.save_hf(config, params, path)
    before = {f.name: f.read_bytes() for f in path.iterdir()}
    changed = jax.tree.map(lambda x: x + 1.0, params)
    calls = faults.crash_after(monkeypatch, hf_export, "_write_safetensors", 1)  # shard 2 fails
    with pytest.raises(OSError, match="No space left"):
        checkpoints.save_hf(config, changed, path, overwrite=True, max_shard_bytes=4096)
    monkeypatch.undo()
    assert len(calls) == 2 and {f.name: f.read_bytes() for f in path.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    checkpoints.save_hf(config, changed, path, overwrite=True, max_shard_bytes=4096)
    _, back = checkpoints.load(path)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=0), back, changed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert not (path / "model.safetensors").exists()  # the single file of the first export


# ---- training: resume after faults ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run():
    return tiny_training_run()


def _train(tiny_run, workdir, **kw):
    from mtpspec.training.train import train

    config, corpus, tc = tiny_run
    logs = []
    tc = kw.pop("tc", tc)
    train(config, tc, corpus, workdir, log=logs.append, **kw)
    return logs


def _steps(workdir):
    import json

    return [json.loads(x)["step"] for x in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow(35)
def test_resume_survives_a_torn_metrics_line_and_an_unreadable_checkpoint(tiny_run, tmp_path):
    import shutil

    _train(tiny_run, tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "lo')  # a crash in the middle of a line
    faults.garble(tmp_path / "checkpoints" / "3")  # the newest checkpoint unreadable
    logs = _train(tiny_run, tmp_path)
    assert any("torn last line" in line for line in logs), logs
    assert any("step 3 cannot be restored" in line for line in logs), logs
    assert any("resumed from step 2" in line for line in logs), logs
    assert _steps(tmp_path) == [1, 2, 3]
    shutil.rmtree(tmp_path / "checkpoints")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl line 2"):
        _train(tiny_run, tmp_path)


@pytest.mark.slow(32)
def test_resume_with_changed_hyper_parameters_is_refused_unless_asked(tiny_run, tmp_path):
    import dataclasses

    _, _, tc = tiny_run
    _train(tiny_run, tmp_path)
    with pytest.raises(ValueError, match=r"lr: 0.003 -> 0.001.*allow_config_change"):
        _train(tiny_run, tmp_path, tc=dataclasses.replace(tc, lr=1e-3))
    logs = _train(tiny_run, tmp_path, tc=dataclasses.replace(tc, log_every=2))  # intervals: fine
    assert not any("changed hyper-parameters" in line for line in logs)
    logs = _train(tiny_run, tmp_path, tc=dataclasses.replace(tc, steps=4), allow_config_change=True)
    assert any("changed hyper-parameters: steps" in line for line in logs), logs
    assert _steps(tmp_path) == [1, 2, 3, 4]
    # a directory recorded before a field existed (mtp_depth) resumes: the field had its default
    import json

    path = tmp_path / "train_config.json"
    recorded = json.loads(path.read_text())
    del recorded["mtp_depth"]
    path.write_text(json.dumps(recorded))
    logs = _train(tiny_run, tmp_path, tc=dataclasses.replace(tc, steps=4))
    assert not any("changed hyper-parameters" in line for line in logs), logs
    with pytest.raises(ValueError, match=r"mtp_depth: 1 -> 2"):
        _train(tiny_run, tmp_path, tc=dataclasses.replace(tc, steps=4, mtp_depth=2))


def test_tau_does_not_count_tokens_cut_at_max_new_tokens(model):
    """On text the n-gram table knows, a window accepts several drafts; with max_new_tokens that
    cuts the last window short, τ counts the emitted tokens, not the accepted ones."""
    config, params = model
    spec = mtpspec.SpecConfig("ngram", 4)
    cut = []
    for max_new in range(2, 9):
        r = mtpspec.generate(config, params, [[3, 1, 4, 1, 5] * 6], max_new_tokens=max_new,
                             speculative=spec)  # fmt: skip
        steps = r.stats["steps"][0]
        assert r.stats["tau"] == pytest.approx((len(r.tokens[0]) - 1) / steps)
        accepted = sum(a + 1 for a in r.stats["accepted"][0] if a >= 0)
        assert accepted >= len(r.tokens[0]) - 1
        cut.append(accepted > len(r.tokens[0]) - 1)
    assert any(cut)  # the case this test is about did happen


# ---- checkpoints: tensors and indexes that are not what they claim -------------------------------


def _copy_fixture(name, tmp_path):
    import pathlib
    import shutil

    src = pathlib.Path(__file__).parent / "fixtures" / "hf" / name
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("bad", ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors"])
def test_a_safetensors_index_cannot_point_outside_its_directory(tmp_path, bad):
    import json

    from mtpspec import checkpoints

    path = _copy_fixture("qwen3_next_bf16_sharded", tmp_path)
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = sorted(data["weight_map"])[0]
    data["weight_map"][first] = bad
    index.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="shards must be file names"):
        checkpoints.load(path)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_integer_or_boolean_weights_are_refused_not_cast(tmp_path, dtype):
    from safetensors.numpy import load_file, save_file

    from mtpspec import checkpoints

    path = _copy_fixture("qwen3_5", tmp_path)
    tensors = load_file(path / "model.safetensors")
    name = sorted(n for n in tensors if n.endswith("mlp.down_proj.weight"))[0]
    tensors[name] = (tensors[name] > 0).astype(dtype)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(TypeError, match=f"tensor {name} .* must be floating point"):
        checkpoints.load(path)


def test_non_utf8_bytes_in_argv_reach_the_model_as_those_bytes(tmp_path):
    """A prompt given as non-UTF-8 bytes on the command line (Python decodes argv with
    surrogateescape) is encoded back to exactly those bytes by the byte tokenizer."""
    import json
    import pathlib
    import subprocess
    import sys

    from mtpspec.tokenizers import ByteTokenizer

    assert ByteTokenizer().encode(b"caf\xe9 \xff".decode("utf-8", "surrogateescape")) == [
        *b"caf\xe9 \xff"
    ]
    out = tmp_path / "out.json"
    repo = pathlib.Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.generate", b"--prompt=caf\xe9 \xff",
         "--max_new_tokens=3", f"--json_out={out}"],
        cwd=repo, capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(json.loads(out.read_text())["tokens"]) == 3
    zero = subprocess.run(
        [sys.executable, "-m", "experiments.generate", "--prompt=def", "--max_new_tokens=0",
         f"--json_out={out}"],
        cwd=repo, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert zero.returncode == 0, zero.stderr[-2000:]
    assert "no tokens generated" in zero.stdout
    assert json.loads(out.read_text())["tokens"] == []


def _torn_metadata(t):
    (t / "params" / "_METADATA").unlink()


def _garbage_metadata(t):
    (t / "params" / "_METADATA").write_text("{not json")


def _config_missing_fields(t):
    (t / "config.json").write_text('{"vocab_size": 3}')


def _config_wrong_type(t):
    import json

    cfg = json.loads((t / "config.json").read_text())
    cfg["hidden_size"] = "x"
    (t / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "mutate,exc,match",
    [
        (_torn_metadata, OSError, "no readable metadata"),
        (_garbage_metadata, OSError, "no readable metadata|cannot read"),
        (_config_missing_fields, ValueError, "lacks required fields"),
        (_config_wrong_type, ValueError, "hidden_size"),
    ],
    ids=["metadata missing", "metadata garbage", "config missing fields", "config wrong type"],
)
def test_a_corrupt_mtpspec_checkpoint_is_a_clear_error(model, tmp_path, mutate, exc, match):
    from mtpspec import checkpoints

    config, params = model
    path = tmp_path / "ckpt"
    checkpoints.save_params(path, config, params)
    mutate(path)
    with pytest.raises(exc, match=match):
        checkpoints.load(path)


# ---- the API boundary: every entry point checks the params it is given ---------------------------


def _with_nan(params):
    bad = dict(params)
    bad["final_norm"] = params["final_norm"].at[0].set(jnp.nan)
    return bad


def test_nan_draft_weights_are_refused_by_name(model):
    config, params = model
    spec = mtpspec.SpecConfig("draft", 2, draft_config=config, draft_params=_with_nan(params))
    with pytest.raises(ValueError, match=r"draft_params: parameter \['final_norm'\]"):
        mtpspec.generate(config, params, PROMPTS, max_new_tokens=4, speculative=spec)


def test_training_refuses_init_weights_that_are_nan_or_do_not_match(model, tiny_run, tmp_path):
    from mtpspec.training.train import train

    config, params = model
    _, corpus, tc = tiny_run
    quiet = dict(log=lambda *_: None)
    with pytest.raises(ValueError, match=r"parameter \['final_norm'\] holds NaN"):
        train(config, tc, corpus, tmp_path / "a", init=_with_nan(params), **quiet)
    fewer = {**params, "layers": params["layers"][:1]}
    with pytest.raises(ValueError, match="init do not match"):
        train(config, tc, corpus, tmp_path / "b", init=fewer, **quiet)


def test_the_finiteness_check_runs_once_per_parameter_set(model, monkeypatch):
    from mtpspec.models import inference

    config, params = model
    calls = []
    real = inference.check_finite
    monkeypatch.setattr(inference, "check_finite", lambda p: calls.append(1) or real(p))
    fresh = jax.tree.map(lambda x: x + 0.0, params)  # new leaves: not seen before
    for _ in range(3):
        inference.check_finite_once(fresh)
    assert len(calls) == 1
    inference.check_finite_once(jax.tree.map(np.asarray, fresh))  # numpy leaves: always checked
    assert len(calls) == 2


@pytest.mark.parametrize("keep", [0.0, 0.01, 0.5, 0.99])
def test_a_torn_safetensors_file_is_an_os_error(tmp_path, keep):
    from mtpspec import checkpoints

    path = _copy_fixture("qwen3_5", tmp_path)
    faults.torn(path / "model.safetensors", keep)
    with pytest.raises(OSError, match="model.safetensors"):
        checkpoints.load(path)


def test_a_torn_orbax_metadata_file_is_an_os_error(model, tmp_path):
    from mtpspec import checkpoints

    config, params = model
    checkpoints.save_params(tmp_path / "ckpt", config, params)
    faults.torn(tmp_path / "ckpt" / "params" / "_METADATA", 0.5)
    with pytest.raises(OSError, match="metadata"):
        checkpoints.load(tmp_path / "ckpt")


# ---- ops: a non-finite input reaches what it reaches in the recurrence, no further ---------------


@pytest.mark.parametrize("field", ["q", "k", "v", "g", "beta"])
@pytest.mark.parametrize("method", ["chunk", "assoc", "pallas"])
def test_a_nan_input_reaches_exactly_what_it_reaches_in_the_recurrence(field, method):
    """A NaN at position j never reaches positions before j (the chunked form's masked products
    used to compute 0 · NaN for them); where it does reach (o from j on, the state), every form
    agrees with the recurrence, NaN for NaN."""
    q, k, v, g, beta, s0 = random_gdn_inputs(0, 2, 37, 1, 2, 8, 8)
    for pos in (0, 10, 15, 16, 36):
        arrs = dict(q=q, k=k, v=v, g=g, beta=beta)
        arrs[field] = arrs[field].at[:, pos].set(jnp.nan)
        kw = dict(initial_state=s0, return_states=True)
        ref = ops.gated_delta_rule_with_aux(*arrs.values(), method="recurrent", **kw)
        got = ops.gated_delta_rule_with_aux(*arrs.values(), method=method, chunk_size=16, **kw)
        assert bool(jnp.all(jnp.isfinite(got[0][:, :pos])))  # causality under NaN
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
            np.testing.assert_allclose(np.nan_to_num(a), np.nan_to_num(b), atol=1e-4)
