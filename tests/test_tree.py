"""Tree verify windows (``models.tree``, ``decoding.window``, ``decoding.commit``): every GDN
and conv node against the recurrence along its path, every tree row's logits against a chain over
its path, commit(node) against a fresh replay of its path for every node and strategy (with
negative controls), and greedy acceptance of the deepest matching path."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models, ops
from mtpspec.decoding import sampling
from mtpspec.decoding import window as dwindow
from mtpspec.decoding.commit import COMMIT_STRATEGIES, commit_window
from mtpspec.decoding.proposers.mtp import MTPProposer, MTPState
from mtpspec.decoding.sampling import Sampling
from mtpspec.kernels import cpu_gdn
from mtpspec.models import GDNCache, decoder
from mtpspec.models import tree as mtree
from mtpspec.models.tree import TreeShape
from tests import test_sampling as sampling_tests
from tests.conftest import users_jit
from tests.gdn_testing import random_gdn_inputs, rel_err

SHAPES = [(1,), (2,), (3, 1), (2, 2), (1, 3, 2), (2, 1, 2)]


def test_tree_shape_tables():
    t = TreeShape((2, 3))
    assert (t.rows, t.nodes, t.depth, t.level_sizes) == (9, 8, 2, (1, 2, 6))
    assert t.parent.tolist() == [-1, 0, 0, 1, 1, 1, 2, 2, 2]
    assert t.row_depth.tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert t.path[7].tolist() == [0, 2, 7] and t.path[2].tolist() == [0, 2, 2]
    assert t.ancestor_mask[7].tolist() == [1, 0, 1, 0, 0, 0, 0, 1, 0]
    # conv taps of width 4: old window rows 0..2, window row r at 3 + r
    assert t.conv_taps(4)[7].tolist() == [2, 3, 5, 10]
    assert t.conv_taps(4)[0].tolist() == [0, 1, 2, 3]
    assert TreeShape((1, 1, 1)).path[-1].tolist() == [0, 1, 2, 3]  # a chain
    assert mtree.check_tree([2, 2]) == TreeShape((2, 2))
    assert mtree.check_tree(np.array([2, 2])) == TreeShape((2, 2))  # NumPy ints too
    assert hash(TreeShape((2, 2))) == hash(TreeShape((2, 2)))


@pytest.mark.parametrize("bad", [(), (0,), (2, -1), (1.5,), (True,), [2, 2], None])
def test_bad_tree_shapes_are_refused(bad):
    with pytest.raises(ValueError, match="tree branching"):
        TreeShape(bad)


def test_a_tree_too_large_is_refused_before_any_table_is_built():
    with pytest.raises(ValueError, match=f"at most {mtree.MAX_ROWS} are supported"):
        TreeShape((1000, 1000))
    assert TreeShape((4, 4, 4)).rows <= mtree.MAX_ROWS


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_gdn_node_equals_the_recurrence_along_its_path(shape, native):
    """The per-depth XLA form and the C++ kernel's node-by-node walk (``native``)."""
    if native and not cpu_gdn.available():
        pytest.skip(cpu_gdn.status()[1])
    tree = TreeShape(shape)
    q, k, v, g, beta, s0 = random_gdn_inputs(1, 2, tree.rows, 2, 4, 8, 6)
    o, aux = ops.gated_delta_rule_tree(
        q, k, v, g, beta, s0, tree.parent, tree.levels, native=native
    )
    for r in range(tree.rows):
        p = tree.path[r, : tree.row_depth[r] + 1]
        o_c, final, aux_c = ops.gated_delta_rule_with_aux(
            *(x[:, p] for x in (q, k, v, g, beta)), initial_state=s0, method="recurrent"
        )
        assert rel_err(o[:, r], o_c[:, -1]) < 1e-5, r
        assert rel_err(aux.states[:, r], final) < 1e-5, r
        assert rel_err(aux.u[:, r], aux_c.u[:, -1]) < 1e-5, r
        np.testing.assert_allclose(aux.g_cum[:, r], aux_c.g_cum[:, -1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_conv_node_equals_the_conv_along_its_path(shape):
    tree = TreeShape(shape)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, tree.rows, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((5, 4)), jnp.float32)
    window = jnp.asarray(rng.standard_normal((2, 3, 5)), jnp.float32)
    y = ops.causal_conv1d_tree(x, w, window, tree.conv_taps(4))
    for r in range(tree.rows):
        p = tree.path[r, : tree.row_depth[r] + 1]
        y_c, _ = ops.causal_conv1d(x[:, p], w, initial_window=window)
        np.testing.assert_allclose(y[:, r], y_c[:, -1], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def model():
    config = C.tiny_hybrid(
        vocab_size=64,
        layer_types=(C.LINEAR, C.FULL, C.LINEAR, C.FULL),
        mlp_types=("dense",) * 4,
    )
    params = models.init_params(config, jax.random.key(4), norm_scale=0.1)
    prompts = jnp.asarray([[5, 9, 1, 7, 3, 3, 8, 2], [4, 4, 6, 0, 0, 0, 0, 0]], jnp.int32)
    pre = models.prefill(config, params, prompts, jnp.array([8, 3]), capacity=40)
    return config, params, pre.state


def _chain(config, params, state, tokens):
    return models.window_step(config, params, state, tokens)


def _path_tokens(tree, tokens, r):
    return tokens[:, tree.path[r, : tree.row_depth[r] + 1]]


def _tree_window(model, shape, seed, active=(True, True)):
    """(tree, random tokens [2, R], the tree window's output) on the prefilled ``model``."""
    config, params, state = model
    tree = TreeShape(shape)
    tokens = jax.random.randint(jax.random.key(seed), (2, tree.rows), 0, config.vocab_size)
    valid = jnp.where(jnp.array(active), tree.rows, 0)
    out = decoder.window_step(config, params, state, tokens, valid, tree=tree)
    return tree, tokens, out


@pytest.mark.parametrize("shape", [(2, 2), (3, 1, 2)])
def test_every_tree_row_gives_a_chain_over_its_path(model, shape):
    config, params, state = model
    tree, tokens, out = _tree_window(model, shape, seed=1)
    assert out.logits.shape == (2, tree.rows, config.vocab_size)
    for r in range(tree.rows):
        chain = _chain(config, params, state, _path_tokens(tree, tokens, r))
        assert rel_err(out.logits[:, r], chain.logits[:, -1]) < 1e-4, r
        assert rel_err(out.hidden[:, r], chain.hidden[:, -1]) < 1e-4, r


def _assert_states_equal(got, want, tol=1e-5):
    """GDN state and conv window, and attention KV of the live prefix, lengths."""
    np.testing.assert_array_equal(got.lengths, want.lengths)
    for a, b in zip(got.layers, want.layers, strict=True):
        if isinstance(a, GDNCache):
            assert rel_err(a.state, b.state) < tol
            np.testing.assert_allclose(a.conv, b.conv, rtol=1e-4, atol=1e-5)
            continue
        for i, n in enumerate(np.asarray(want.lengths)):
            np.testing.assert_allclose(a.k[i, :, :n], b.k[i, :, :n], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(a.v[i, :, :, :n], b.v[i, :, :, :n], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 2), (1, 3, 2)])
def test_commit_of_every_node_equals_a_fresh_replay_of_its_path(model, shape):
    config, params, state = model
    tree, tokens, out = _tree_window(model, shape, seed=2)

    def commit_path(snapshot, verified, commits, node, n, tree, strategy):
        rows = dwindow.path_rows(tree, node)
        return commit_window(snapshot, verified, commits, n, strategy, rows=rows)

    commit = users_jit(commit_path, static_argnames=("tree", "strategy"))
    for r in range(tree.rows):
        node = jnp.array([r, r], jnp.int32)
        n = jnp.full((2,), tree.row_depth[r] + 1, jnp.int32)
        want = _chain(config, params, state, _path_tokens(tree, tokens, r)).state
        for strategy in COMMIT_STRATEGIES:
            got = commit(state, out.state, out.commit, node, n, tree=tree, strategy=strategy)
            _assert_states_equal(got, want)
        # negative controls: keeping the GDN caches as the window left them (a KV-only rewind),
        # or committing a sibling's path of the same depth, both give another state
        kv_only = out.state._replace(lengths=state.lengths + n)
        gdn = [i for i, c in enumerate(want.layers) if isinstance(c, GDNCache)]
        assert all(rel_err(kv_only.layers[i].state, want.layers[i].state) > 1e-3 for i in gdn)
        siblings = [s for s in range(tree.rows) if tree.parent[s] == tree.parent[r] and s != r]
        if r and siblings:
            other = jnp.full((2,), siblings[0], jnp.int32)
            wrong = commit(state, out.state, out.commit, other, n, tree=tree, strategy="replay")
            assert all(rel_err(wrong.layers[i].state, want.layers[i].state) > 1e-3 for i in gdn)


def test_an_inactive_sequence_keeps_its_state(model):
    state = model[2]
    tree, _, out = _tree_window(model, (2, 2), seed=3, active=(True, False))
    node, n = jnp.array([4, 0], jnp.int32), jnp.array([3, 0], jnp.int32)
    for strategy in COMMIT_STRATEGIES:
        rows = dwindow.path_rows(tree, node)
        got = commit_window(state, out.state, out.commit, n, strategy, rows=rows)
        np.testing.assert_array_equal(got.lengths, state.lengths + n)
        for a, b in zip(got.layers, state.layers, strict=True):
            if isinstance(a, GDNCache):
                np.testing.assert_array_equal(a.state[1], b.state[1])
                np.testing.assert_array_equal(a.conv[1], b.conv[1])


def test_greedy_acceptance_takes_the_deepest_matching_path():
    tree = TreeShape((2, 2))  # rows: 0 | 1 2 | 3 4 (of 1) 5 6 (of 2)
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((3, tree.rows, 10)), jnp.float32)
    target = np.asarray(jnp.argmax(logits, -1))
    tokens = (target[:, tree.parent] + 1) % 10  # every draft wrong
    tokens[:, 0] = 0
    tokens[0, 2] = target[0, 0]  # sequence 0: row 2 right, then row 6 right
    tokens[0, 6] = target[0, 2]
    tokens[0, 3] = target[0, 1]  # row 3's parent (row 1) is wrong: not accepted
    tokens[1, 1] = tokens[1, 2] = target[1, 0]  # duplicate siblings: the lower row wins
    node, token = dwindow.accept_greedy(tree, logits, jnp.asarray(tokens))
    assert node.tolist() == [6, 1, 0] and tree.row_depth[node].tolist() == [2, 1, 0]
    assert token.tolist() == [target[0, 6], target[1, 1], target[2, 0]]


class _GenericChain(TreeShape):
    """A chain window that takes the generic tree forms (the chain's fast forms off)."""

    is_chain = False


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_chains_accept_equals_the_tree_form_on_its_window(k):
    """One accept: the chain's running-product greedy form equals the tree form (every path
    checked) on the tree of ones, with and without a per-row draft count; sampled, the chain's
    ``speculative_accept`` is the window walk on the chain (same node and token per key)."""
    rng = np.random.default_rng(k)
    b, vocab = 64, 4  # a tiny vocabulary: every accepted length occurs
    logits = jnp.asarray(rng.standard_normal((b, k + 1, vocab)), jnp.float32)
    target = np.asarray(jnp.argmax(logits, -1))
    tokens = np.where(rng.random((b, k + 1)) < 0.7, np.roll(target, 1, axis=1), 0)
    tokens[:, 0] = 0
    tokens = jnp.asarray(tokens, jnp.int32)
    chain, generic = TreeShape.chain(k), _GenericChain((1,) * k)
    assert chain.is_chain and not generic.is_chain
    drafted = jnp.asarray(rng.integers(0, k + 1, b), jnp.int32)
    accept_greedy = users_jit(dwindow.accept_greedy, static_argnums=0)  # as in a program
    for cap in (None, drafted):
        fast = accept_greedy(chain, logits, tokens, cap)
        slow = accept_greedy(generic, logits, tokens, cap)
        np.testing.assert_array_equal(fast[0], slow[0])
        np.testing.assert_array_equal(fast[1], slow[1])
        lead = np.cumprod(np.asarray(tokens)[:, 1:] == target[:, :-1], axis=1).sum(1)
        want = lead if cap is None else np.minimum(lead, np.asarray(cap))
        np.testing.assert_array_equal(fast[0], want)  # the obvious oracle: leading matches
    assert len(set(np.asarray(fast[0]).tolist())) == k + 1  # every accepted length occurred
    q = jax.nn.softmax(jnp.asarray(rng.standard_normal((b, k, vocab)), jnp.float32), -1)
    keys = jax.random.split(jax.random.key(1), b)
    chain_accept = users_jit(sampling.speculative_accept)
    tree_accept = users_jit(sampling.tree_speculative_accept, static_argnums=4)
    a, token = chain_accept(keys, logits, tokens[:, 1:], q, 1.0, drafted=drafted)
    node, token2 = tree_accept(keys, logits, tokens, q, generic, 1.0, drafted=drafted)
    np.testing.assert_array_equal(a, node)
    np.testing.assert_array_equal(token, token2)
    assert np.all(np.asarray(a) <= np.asarray(drafted))


@pytest.fixture(scope="module")
def mtp_model():
    config = C.tiny_hybrid(vocab_size=48)
    params = models.init_params(config, jax.random.key(6), norm_scale=0.1)
    prompts = jnp.asarray([[5, 9, 1, 7, 3, 3, 8, 2], [4, 4, 6, 0, 0, 0, 0, 0]], jnp.int32)
    lengths = jnp.array([8, 3], jnp.int32)
    pre = models.prefill(config, params, prompts, lengths, capacity=40)
    first = jnp.argmax(pre.logits[jnp.arange(2), lengths - 1], -1).astype(jnp.int32)
    nxt = jnp.concatenate([prompts[:, 1:], prompts[:, :1]], axis=1)
    nxt = jnp.where(jnp.arange(8)[None] == (lengths - 1)[:, None], first[:, None], nxt)
    y, state = decoder.mtp_window_hidden_impl(config, params, pre.state, pre.hidden, nxt, lengths)
    h = jnp.take_along_axis(y, (lengths - 1)[:, None, None], axis=1)
    return config, params, state, h


# the oracle's one-token cached MTP step and LM head, jitted as the chain proposer runs them
# (op by op they compiled ~190 small programs per case)
_MTP_STEP = jax.jit(decoder.mtp_window_step_impl, static_argnums=0)
_LM_LOGITS = jax.jit(decoder.lm_logits, static_argnums=0)


@pytest.mark.parametrize("shape", [(2, 2), (3, 1, 2), (1, 1, 1)])
def test_mtp_tree_drafts_chain_the_head_along_every_branch(mtp_model, shape):
    """Each node's children are the top-b of the MTP head chained along that node's own path
    (the cached one-token MTP steps the chain proposer takes), for every node; (1, 1, 1) runs
    the chain's form (rows written into the MTP cache), the others the tree's (own keys)."""
    config, params, state, h = mtp_model
    tree = TreeShape(shape)
    s = types.SimpleNamespace(
        config=config, tree=tree, k=tree.depth, sampling=Sampling(True), adaptive=False
    )
    proposer = MTPProposer()
    pending, active = jnp.zeros((2,), jnp.int32), jnp.ones((2,), bool)

    def drafts_of(p, st, h):
        return proposer.propose(s, p, None, MTPState(h), st, pending, active, None).drafts

    drafts = jax.jit(drafts_of)(params, state, h)
    assert drafts.shape == (2, tree.nodes)
    tokens = np.concatenate([np.zeros((2, 1), np.int32), np.asarray(drafts)], axis=1)
    one = jnp.ones((2,), jnp.int32)
    for r in range(tree.rows):
        dep = int(tree.row_depth[r])
        if dep == tree.depth:
            continue
        hid, tmp = h, state
        for j in range(1, dep + 1):  # chain along r's path
            tok = jnp.asarray(tokens[:, tree.path[r, j]])[:, None]
            _, hid, tmp = _MTP_STEP(config, params, tmp, hid, tok, one)
        logits = _LM_LOGITS(config, params, hid)[:, 0]
        want = jax.lax.top_k(logits, tree.branching[dep])[1]
        children = [c for c in range(tree.rows) if tree.parent[c] == r]
        np.testing.assert_array_equal(tokens[:, children], np.asarray(want), err_msg=str(r))


@pytest.fixture(scope="module")
def small_vocab_model():
    config = C.tiny_hybrid(vocab_size=8, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2)
    return config, models.init_params(config, jax.random.key(8), norm_scale=0.1)


LOOP_PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3], [7]]


@pytest.mark.parametrize(
    "proposer, shape, commits",
    [
        ("mtp", (2, 2), COMMIT_STRATEGIES),
        ("mtp", (3, 1, 1), ("replay",)),
        ("mtp", (2,), ("scan",)),
        ("ngram", (2, 2), ("states", "replay")),
        ("ngram", (3, 1, 1), ("scan",)),
    ],
)
def test_tree_speculative_greedy_equals_plain_greedy(small_vocab_model, proposer, shape, commits):
    """Token for token, on a ragged batch, with every commit strategy; some steps accept."""
    config, params = small_vocab_model
    plain = mtpspec.generate(config, params, LOOP_PROMPTS, max_new_tokens=24)
    for commit in commits:
        spec = decoding.SpecConfig(proposer, len(shape), commit, tree=shape)
        got = mtpspec.generate(config, params, LOOP_PROMPTS, max_new_tokens=24, speculative=spec)
        assert got.tokens == plain.tokens, commit
        assert got.stats["tau"] > 1.0  # drafts were accepted


@pytest.fixture(scope="module")
def draft_model():
    config = C.tiny_hybrid(
        vocab_size=8, hidden_size=32, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2
    )
    return config, models.init_params(config, jax.random.key(11), norm_scale=0.1)


@pytest.mark.parametrize("shape, commits", [((2, 2), ("scan", "replay")), ((3, 1, 1), ("states",))])
def test_draft_model_trees_emit_plain_greedy_tokens(small_vocab_model, draft_model, shape, commits):
    """The draft model drafts its tree depth by depth and commits its own state to the accepted
    path: tokens equal plain greedy's with every commit strategy (each on one of the two shapes),
    and drafts get accepted."""
    config, params = small_vocab_model
    dconfig, dparams = draft_model
    plain = mtpspec.generate(config, params, LOOP_PROMPTS, max_new_tokens=24)
    for commit in commits:
        spec = decoding.SpecConfig(
            "draft", len(shape), commit, tree=shape, draft_config=dconfig, draft_params=dparams
        )
        got = mtpspec.generate(config, params, LOOP_PROMPTS, max_new_tokens=24, speculative=spec)
        assert got.tokens == plain.tokens, commit
        assert got.stats["tau"] > 1.0


def test_a_draft_model_tree_of_the_target_itself_accepts_every_path_it_can(small_vocab_model):
    """With the target as its own draft, every greedy tree's first branch is the target's own
    continuation: every step accepts the whole depth (τ = d + 1 until the length limit) — which
    only holds when the draft state is committed exactly to each accepted path."""
    config, params = small_vocab_model
    spec = decoding.SpecConfig("draft", 2, tree=(2, 2), draft_config=config, draft_params=params)
    got = mtpspec.generate(config, params, LOOP_PROMPTS, max_new_tokens=22, speculative=spec)
    for row in np.asarray(got.stats["accepted"]).T:
        live = row[row >= 0]
        assert (live[:-1] == 2).all(), row  # the last step may be cut by max_new_tokens


def test_a_one_wide_tree_is_the_chain(small_vocab_model):
    """tree = (1, 1, 1) drafts and accepts exactly what the chain with k = 3 does, step by step."""
    config, params = small_vocab_model
    kw = dict(max_new_tokens=24)
    chain = mtpspec.generate(
        config, params, LOOP_PROMPTS, speculative=decoding.SpecConfig("mtp", 3), **kw
    )
    tree = mtpspec.generate(
        config,
        params,
        LOOP_PROMPTS,
        speculative=decoding.SpecConfig("mtp", 3, tree=(1, 1, 1)),
        **kw,
    )
    assert tree.tokens == chain.tokens
    np.testing.assert_array_equal(tree.stats["accepted"], chain.stats["accepted"])


def test_tree_settings_are_checked_before_device_work(small_vocab_model):
    config, params = small_vocab_model
    gen = lambda spec, **kw: mtpspec.generate(  # noqa: E731
        config, params, [[1, 2]], max_new_tokens=4, speculative=spec, **kw
    )
    with pytest.raises(ValueError, match="depth 2; it must equal num_draft=3"):
        gen(decoding.SpecConfig("mtp", 3, tree=(2, 2)))
    with pytest.raises(ValueError, match="tree speculation runs with the proposers"):
        gen(decoding.SpecConfig("nonsense", 2, tree=(2, 2)))
    with pytest.raises(ValueError, match="tree branching"):
        gen(decoding.SpecConfig("mtp", 2, tree=(2, 0)))
    with pytest.raises(ValueError, match="does not apply to a tree"):
        gen(decoding.SpecConfig("mtp", 2, tree=(2, 2), verify_method="chunk"))


# ---- sampling: lossless multi-candidate verification -------------------------------------------

V = sampling_tests.V


def _first_token_counts(tree, residual, n=20_000, deterministic=False):
    """The first emitted token of one tree step, over n keys: the drafted child on the accepted
    path, or the new token when nothing was accepted. Per-row target and draft distributions are
    random; children are drawn i.i.d. from q at their parent, or (``deterministic``) are fixed
    distinct tokens with q one-hot on each (n-gram candidates)."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.standard_normal((tree.rows, V)) * 1.5, jnp.float32)
    q = jax.nn.softmax(jnp.asarray(rng.standard_normal((tree.rows, V)), jnp.float32), -1)
    q = q[jnp.asarray(np.maximum(tree.parent, 0))]  # siblings share their parent's q: i.i.d.
    fixed = jnp.asarray((np.arange(tree.rows) * 3) % V, jnp.int32)  # distinct among siblings

    def one(key):
        k1, k2 = jax.random.split(key)
        drafts = jax.random.categorical(k1, jnp.log(q), axis=-1).astype(jnp.int32)
        qs = q
        if deterministic:
            drafts, qs = fixed, jax.nn.one_hot(fixed, V, dtype=jnp.float32)
        node, token = sampling.tree_speculative_accept(
            k2[None], logits[None], drafts[None], qs[None, 1:], tree, 1.0, residual=residual
        )
        m = jnp.asarray(tree.row_depth)[node] + 1
        path = jnp.asarray(tree.path)[node[0]]
        return jnp.where(m[0] > 1, drafts[path[1]], token[0]), m[0]

    first, m = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), n))
    counts = np.bincount(np.asarray(first), minlength=V)
    return counts, np.asarray(jax.nn.softmax(logits[0])), np.asarray(m)


@pytest.mark.parametrize("shape, deterministic", [((2, 2), False), ((3, 1), False), ((3, 1), True)])
def test_tree_rejection_sampling_keeps_the_target_law(shape, deterministic):
    """The first emitted token follows the target's p at the root exactly, and deeper paths are
    reached (the test exercises acceptance at depth 1 and 2), for i.i.d. sampled children and for
    distinct deterministic candidates; the rule without the residual update fails the same test
    (negative control)."""
    tree = TreeShape(shape)
    counts, p, m = _first_token_counts(tree, True, deterministic=deterministic)
    assert sampling_tests.chi_square_p_value(counts, p) > 1e-3
    assert (m == 3).mean() > 0.01 and (m == 1).mean() > 0.01
    wrong, _, _ = _first_token_counts(tree, False, deterministic=deterministic)
    assert sampling_tests.chi_square_p_value(wrong, p) < 1e-6


@pytest.mark.slow(30)
def test_generate_tree_sampling_matches_the_target_distribution():
    """End to end through the loop: 10^4 copies of one prompt sampled with a (2, 1) MTP tree; the
    joint law of the first three tokens is the target's (chi-square)."""
    config = C.tiny_moe(vocab_size=V, **C.TWO_LAYERS)
    params = models.init_params(config, jax.random.key(3), norm_scale=0.1)
    T, TOP_K, TOP_P = sampling_tests.T, sampling_tests.TOP_K, sampling_tests.TOP_P
    spec = decoding.SpecConfig("mtp", 2, tree=(2, 1))
    result = mtpspec.generate(
        config, params, [sampling_tests.PROMPT] * 10_000, max_new_tokens=3, speculative=spec,
        temperature=T, top_k=TOP_K, top_p=TOP_P, seed=0,
    )  # fmt: skip
    seqs = np.asarray(result.tokens)
    assert result.stats["tau"] > 1.2
    counts = np.zeros((V, V, V))
    np.add.at(counts, (seqs[:, 0], seqs[:, 1], seqs[:, 2]), 1)
    want = sampling_tests.exact_probs(config, params, sampling_tests.PROMPT, 3)
    assert sampling_tests.chi_square_p_value(counts, want) > 1e-3


def test_ngram_tree_drafts_the_distinct_continuations_most_recent_first():
    from mtpspec.decoding.proposers.ngram import ngram_propose, ngram_tree_propose

    hist = jnp.asarray([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 0, 0]], jnp.int32)
    length = jnp.array([11])
    # "1 2" was followed by 3, 4, 5 (5 latest); after "1 2 5" came 1, after "1 2 4" came 1
    got = ngram_tree_propose(hist, length, TreeShape((2, 1)), 1, 3)
    assert got.tolist() == [[5, 4, 1, 1]]
    three = ngram_tree_propose(hist, length, TreeShape((4,)), 1, 3)
    assert three.tolist() == [[5, 4, 3, 2]]  # three continuations, then the last token
    chain = ngram_propose(hist, length, 2, 1, 3)
    assert ngram_tree_propose(hist, length, TreeShape((1, 1)), 1, 3).tolist() == chain.tolist()


@pytest.mark.parametrize("proposer", ["mtp", "ngram"])
def test_greedy_rows_of_a_sampled_tree_batch_stay_greedy(small_vocab_model, proposer):
    """Rows at temperature 0 inside a sampled batch emit plain greedy's tokens (their tree holds
    distinct top-b candidates with one-hot q), and accept drafts."""
    config, params = small_vocab_model
    plain = mtpspec.generate(config, params, LOOP_PROMPTS, max_new_tokens=24)
    spec = decoding.SpecConfig(proposer, 2, tree=(2, 2))
    got = mtpspec.generate(
        config, params, LOOP_PROMPTS, max_new_tokens=24, speculative=spec,
        temperature=[0.0, 0.9, 0.0], seed=4,
    )  # fmt: skip
    assert got.tokens[0] == plain.tokens[0] and got.tokens[2] == plain.tokens[2]
    assert len(got.tokens[1]) == 24  # the sampled row ran beside them
    assert got.stats["tau"] > 1.0
