"""The hybrid model against HF transformers (fixtures); cached decoding against the full forward."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtpspec import checkpoints, models
from mtpspec import config as C
from mtpspec.models import decoder
from tests.gdn_testing import rel_err

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILY_DIRS = {
    "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_next_bf16_sharded": "qwen3_next",
    "qwen3_5_vl_layout": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_fused_vl": "qwen3_5_moe",  # experts fused, wrapper names, nested text_config
}


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def hf_model(request):
    config, params = checkpoints.load_hf(FIXTURES / request.param, dtype="float32")
    return config, params, np.load(FIXTURES / request.param / "reference.npz")


@pytest.mark.parametrize("name", sorted(FAMILY_DIRS))
def test_logits_match_transformers(name):
    config, params = checkpoints.load_hf(FIXTURES / name, dtype="float32")
    ref = np.load(FIXTURES / FAMILY_DIRS[name] / "reference.npz")
    want = ref["logits_bf16_weights_f32"] if "bf16" in name else ref["logits"]
    logits = models.forward(config, params, jnp.asarray(ref["input_ids"]))
    assert logits.dtype == jnp.float32
    assert rel_err(logits, want) <= 1e-4


def test_long_sequence_logits_match_transformers(hf_model):
    """80 tokens: crosses HF's 64-token GDN chunk and our chunk boundaries."""
    config, params, ref = hf_model
    logits = models.forward(config, params, jnp.asarray(ref["long_input_ids"]))
    assert rel_err(logits, ref["long_logits"]) <= 1e-4


def test_mtp_head_runs_on_loaded_mtp_weights(hf_model):
    """Row i: final-normed hidden of position i + embedding of token i+1 -> predicts token i+2."""
    config, params, ref = hf_model
    ids = jnp.asarray(ref["input_ids"])
    _, hidden = models.forward_hidden(config, params, ids)
    np.testing.assert_allclose(hidden, ref["last_hidden"], rtol=1e-4, atol=1e-4)
    logits, mtp_hidden = models.mtp_forward(config, params, hidden[:, :-1], ids[:, 1:])
    assert rel_err(logits, ref["mtp_logits"]) <= 1e-4
    assert rel_err(mtp_hidden, ref["mtp_hidden"]) <= 1e-4
    # Negative control: zeroing the MTP fc weights changes the prediction.
    broken = dict(params, mtp=dict(params["mtp"], fc=jnp.zeros_like(params["mtp"]["fc"])))
    bad, _ = models.mtp_forward(config, broken, hidden[:, :-1], ids[:, 1:])
    assert rel_err(bad, ref["mtp_logits"]) > 1e-2


def greedy_cached(config, params, prompts, n_new, capacity=64):
    """Plain greedy decoding through prefill + one-token steps."""
    out = models.prefill(config, params, prompts, capacity=capacity)
    token = jnp.argmax(out.logits[:, -1], axis=-1)
    tokens = [token]
    state = out.state
    for _ in range(n_new - 1):
        out = models.step(config, params, state, token)
        state = out.state
        token = jnp.argmax(out.logits[:, -1], axis=-1)
        tokens.append(token)
    return np.stack([np.asarray(t) for t in tokens], axis=1)


def test_cached_greedy_reproduces_transformers_generate(hf_model):
    config, params, ref = hf_model
    got = greedy_cached(
        config, params, jnp.asarray(ref["prompt_ids"]), ref["generated_ids"].shape[1]
    )
    np.testing.assert_array_equal(got, ref["generated_ids"])


def _presets():
    return {"dense": C.tiny_hybrid(), "moe": C.tiny_moe()}


@pytest.fixture(scope="module", params=["dense", "moe"])
def random_model(request):
    config = _presets()[request.param]
    return config, models.init_params(config, jax.random.key(3), norm_scale=0.1)


def test_prefill_steps_and_windows_equal_full_forward(random_model):
    config, params = random_model
    tokens = jax.random.randint(jax.random.key(0), (2, 13), 0, config.vocab_size)
    full = models.forward(config, params, tokens)
    out = models.prefill(config, params, tokens[:, :5], capacity=16)
    pieces, state = [out.logits], out.state
    for t in range(5, 8):
        out = models.step(config, params, state, tokens[:, t])
        pieces.append(out.logits)
        state = out.state
    for lo, hi in ((8, 11), (11, 13)):
        out = models.window_step(config, params, state, tokens[:, lo:hi])
        pieces.append(out.logits)
        state = out.state
    assert rel_err(jnp.concatenate(pieces, axis=1), full) <= 1e-5
    np.testing.assert_array_equal(state.lengths, [13, 13])


@pytest.mark.parametrize("method", ["recurrent", "chunk", "assoc"])
def test_window_step_gdn_methods_agree(random_model, method):
    config, params = random_model
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, config.vocab_size)
    out = models.prefill(config, params, tokens[:, :4], capacity=16)
    ref = models.window_step(config, params, out.state, tokens[:, 4:], gdn_method="recurrent")
    got = models.window_step(config, params, out.state, tokens[:, 4:], gdn_method=method)
    assert rel_err(got.logits, ref.logits) <= 1e-5
    for a, b in zip(jax.tree.leaves(got.state), jax.tree.leaves(ref.state), strict=True):
        assert rel_err(a, b) <= 1e-5 if a.dtype != jnp.int32 else np.array_equal(a, b)


def test_ragged_prefill_and_padded_windows_equal_per_sequence_forward(random_model):
    """Right-padded prompts of lengths 7 and 3, then windows with 2 and 4 real tokens: every real
    position's logits equal that sequence's own full forward; padding touches no state."""
    config, params = random_model
    seq = np.asarray(jax.random.randint(jax.random.key(2), (2, 11), 0, config.vocab_size))
    lengths = np.array([7, 3])
    prompts = np.where(np.arange(7)[None] < lengths[:, None], seq[:, :7], 0)
    out = models.prefill(config, params, jnp.asarray(prompts), jnp.asarray(lengths), capacity=16)
    valid = np.array([2, 4])
    window = np.stack([seq[0, 7:11], seq[1, 3:7]])
    window[0, 2:] = 0  # padding
    out2 = models.window_step(config, params, out.state, jnp.asarray(window), jnp.asarray(valid))
    np.testing.assert_array_equal(out2.state.lengths, [9, 7])
    for i, total in enumerate(lengths + valid):
        own = np.concatenate([seq[i, : lengths[i]], window[i, : valid[i]]])
        full = models.forward(config, params, jnp.asarray(own[None]))[0]
        got = np.concatenate(
            [np.asarray(out.logits[i, : lengths[i]]), np.asarray(out2.logits[i, : valid[i]])]
        )
        assert got.shape[0] == total
        assert rel_err(got, full) <= 1e-5
    # The next step after the ragged window still matches the per-sequence forward.
    nxt = jnp.asarray([5, 6])
    out3 = models.step(config, params, out2.state, nxt)
    for i in range(2):
        own = np.concatenate([seq[i, : lengths[i]], window[i, : valid[i]], [int(nxt[i])]])
        full = models.forward(config, params, jnp.asarray(own[None]))[0, -1]
        assert rel_err(out3.logits[i, 0], full) <= 1e-5


def test_mtp_cached_window_equals_teacher_forced_mtp(random_model):
    config, params = random_model
    tokens = jax.random.randint(jax.random.key(4), (2, 10), 0, config.vocab_size)
    _, hidden = models.forward_hidden(config, params, tokens)
    want, _ = models.mtp_forward(config, params, hidden[:, :-1], tokens[:, 1:])
    state = models.init_decode_state(config, 2, 16)
    got = []
    for lo, hi in ((0, 4), (4, 5), (5, 9)):
        n = jnp.full((2,), hi - lo, jnp.int32)
        logits, _, state = models.mtp_window_step(
            config, params, state, hidden[:, lo:hi], tokens[:, lo + 1 : hi + 1], n
        )
        got.append(logits)
    assert rel_err(jnp.concatenate(got, 1), want) <= 1e-5
    np.testing.assert_array_equal(state.mtp_lengths, [9, 9])


def test_one_token_step_compiles_once(random_model):
    config, params = random_model
    out = models.prefill(config, params, jnp.zeros((1, 3), jnp.int32), capacity=16)
    state = out.state
    before = decoder._window_step._cache_size()
    for t in range(6):
        state = models.step(config, params, state, jnp.asarray([t], jnp.int32)).state
    assert decoder._window_step._cache_size() - before == 1


def test_writes_beyond_capacity_are_dropped_not_wrapped(random_model):
    config, params = random_model
    out = models.prefill(config, params, jnp.ones((1, 4), jnp.int32), capacity=4)
    attn = [c for c in out.state.layers if isinstance(c, models.AttentionCache)][0]
    full = models.step(config, params, out.state, jnp.asarray([2], jnp.int32))
    attn_after = [c for c in full.state.layers if isinstance(c, models.AttentionCache)][0]
    np.testing.assert_array_equal(attn_after.k, attn.k)  # nothing overwritten at slot 0


def test_bad_inputs_raise_before_device_work(random_model):
    config, params = random_model
    with pytest.raises(ValueError, match="outside the vocabulary"):
        models.forward(config, params, jnp.asarray([[0, config.vocab_size]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        models.forward(config, params, np.asarray([[-1, 2]]))
    with pytest.raises(TypeError, match="integer dtype"):
        models.forward(config, params, jnp.zeros((1, 3), jnp.float32))
    with pytest.raises(TypeError, match="integer array"):
        models.forward(config, params, [[1, 2]])
    with pytest.raises(ValueError, match="rank 2"):
        models.forward(config, params, jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        models.prefill(config, params, jnp.zeros((1, 9), jnp.int32), capacity=8)
    with pytest.raises(ValueError, match="no MTP head"):
        models.mtp_forward(
            dataclasses.replace(config, mtp_num_layers=0),
            params,
            jnp.zeros((1, 2, config.hidden_size)),
            jnp.zeros((1, 2), jnp.int32),
        )
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        models.init_decode_state(config, 1, 0)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="num_attention_heads"):
        C.tiny_hybrid(num_attention_heads=3)
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        C.tiny_hybrid(linear_num_value_heads=3)
    with pytest.raises(ValueError, match="layer_types"):
        C.tiny_hybrid(
            layer_types=("linear_attention", "mamba", "linear_attention", "full_attention")
        )
    with pytest.raises(ValueError, match="unsupported model_type"):
        checkpoints.from_hf_config({"model_type": "llama"})


def test_default_like_scales_the_default_family():
    from mtpspec import config as C
    from mtpspec.models.params import param_shapes

    def count(cfg):
        leaves = jax.tree.leaves(param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
        return sum(int(np.prod(s)) for s in leaves)

    small = C.default_like(6, 128)
    assert small.layer_types == C.first_default_model().layer_types and small.vocab_size == 256
    assert C.default_model() == C.default_like(12, 256)  # the shipped shape
    big = C.default_like(12, 256)
    assert big.num_layers == 12 and big.layer_types.count(C.FULL) == 4 and big.head_dim == 64
    assert 11.0e6 < count(big) < 11.3e6  # experiments.investigations.shape_sweep's 11.15M


def test_mtp_chain_equals_the_cached_draft_chain(random_model):
    """Teacher-forced depth d, row i == the proposer's draft d from row i: the MTP cache folded
    over rows 0..i, then d - 1 chained one-token steps on the head's own output hidden."""
    config, params = random_model
    depth, t = 3, 9
    tokens = jax.random.randint(jax.random.key(5), (2, t), 0, config.vocab_size)
    _, hidden = models.forward_hidden(config, params, tokens)
    chain = jax.jit(decoder.mtp_chain_impl, static_argnums=(0, 4))(
        config, params, hidden, tokens, depth
    )
    assert [c.shape[1] for c in chain] == [t - 1, t - 2, t - 3]
    want1, _ = models.mtp_forward(config, params, hidden[:, :-1], tokens[:, 1:])
    assert rel_err(chain[0], want1) <= 1e-5
    one = jnp.ones((2,), jnp.int32)
    for i in (0, 3, t - 1 - depth):
        state = models.init_decode_state(config, 2, 16)
        n = jnp.full((2,), i + 1, jnp.int32)
        logits, h, state = models.mtp_window_step(
            config, params, state, hidden[:, : i + 1], tokens[:, 1 : i + 2], n
        )
        h = h[:, i : i + 1]
        for d in range(2, depth + 1):
            logits, h, state = models.mtp_window_step(
                config, params, state, h, tokens[:, i + d : i + d + 1], one
            )
            assert rel_err(logits[:, 0], chain[d - 1][:, i]) <= 1e-5, (i, d)
    # negative control: depth 1 at row i + 1 (the trunk's hidden where the chain feeds the
    # head's own output, the only pairing a depth-1 loss trains) predicts the same token
    # differently
    assert rel_err(want1[:, 1:], chain[1]) > 1e-2


def _init_params_leaf_by_leaf(config, key, norm_scale):
    """The definition ``init_params`` keeps: one jax.random draw of each leaf's own shape."""
    from mtpspec.models.params import _is_shape

    leaves, treedef = jax.tree_util.tree_flatten_with_path(
        models.param_shapes(config), is_leaf=_is_shape
    )
    out = []
    for (path, shape), k in zip(leaves, jax.random.split(key, len(leaves)), strict=True):
        name = str(getattr(path[-1], "key", ""))
        if name == "A_log":
            x = jnp.log(jax.random.uniform(k, shape, minval=0.1, maxval=1.5))
        elif name == "dt_bias":
            x = 0.5 * jax.random.normal(k, shape)
        elif name == "norm" and getattr(path[-2], "key", "") == "gdn":
            x = 1.0 + 0.1 * jax.random.normal(k, shape)
        elif len(shape) == 1:
            x = norm_scale * jax.random.normal(k, shape)
        elif name == "embed":
            x = 0.5 * jax.random.normal(k, shape)
        else:
            x = jax.random.normal(k, shape) * shape[-2] ** -0.5
        out.append(x.astype(config.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def test_init_params_draws_each_leaf_bit_for_bit_from_length_buckets():
    """init_params draws length buckets and slices them (threefry draws are prefix-consistent):
    the same bits as drawing every leaf at its own shape, with one compile per bucket; a bf16
    config rounds those float32 values."""
    from mtpspec.models import params as P

    config = C.tiny_moe(**C.TWO_LAYERS)
    want = _init_params_leaf_by_leaf(config, jax.random.key(4), 0.1)
    P._draw_jit.clear_cache()
    got = models.init_params(config, jax.random.key(4), norm_scale=0.1)
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want), strict=True
    ):
        assert a.dtype == b.dtype == jnp.float32 and a.shape == b.shape, path
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    shapes = jax.tree.leaves(models.param_shapes(config), is_leaf=P._is_shape)
    sizes = {int(np.prod(s)) for s in shapes}
    buckets = {P._bucket(n) for n in sizes}
    assert P._draw_jit._cache_size() <= len(buckets) + 1 < len(sizes)  # + 1: the uniform draw
    assert [P._bucket(n) for n in (1, 256, 257, 1 << 20, (1 << 20) + 1)] == [
        256, 256, 512, 1 << 20, 2 << 20,
    ]  # fmt: skip
    half = models.init_params(
        dataclasses.replace(config, dtype="bfloat16"), jax.random.key(4), norm_scale=0.1
    )
    for a, b in zip(jax.tree.leaves(half), jax.tree.leaves(want), strict=True):
        assert a.dtype == jnp.bfloat16
        assert np.asarray(a).tobytes() == np.asarray(b.astype(jnp.bfloat16)).tobytes()
