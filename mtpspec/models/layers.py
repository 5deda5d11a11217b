"""Layers of the Qwen3-Next / Qwen3.5 hybrid: gated attention, Gated DeltaNet, dense MLP, MoE.

Every layer works on a window of t new tokens per sequence, appended at per-sequence offsets
``start`` [b] with ``valid`` [b] of them real (the rest is padding that must not touch any state).
With ``cache=None`` the layer sees the whole sequence from position 0 (teacher-forced forward).
Math follows tests/fixtures/HF_NOTES.md; matmuls run at ``Precision.HIGHEST``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtpspec import ops
from mtpspec.config import ModelConfig
from mtpspec.kernels import cpu_attention
from mtpspec.models.inference import FUSED, AttentionCore, Linear, fused_name
from mtpspec.models.state import AttentionCache, AttentionCommit, GDNCache, GDNCommit

HIGHEST = jax.lax.Precision.HIGHEST


def linear(x: jax.Array, w, heads: bool = False) -> jax.Array:
    """x [..., in] @ w [in, out], float32 accumulation; ``w`` is a canonical array or an inference
    ``Linear`` (fused / packed, ``models/inference.py``). ``heads``: x is [..., h, d] with
    h · d = in (see ``Linear.__call__``)."""
    if isinstance(w, Linear):
        return w(x, heads=heads)
    if heads:
        x = x.reshape(*x.shape[:-2], -1)
    return jnp.matmul(x, w.astype(x.dtype), precision=HIGHEST, preferred_element_type=jnp.float32)


def projections(x: jax.Array, p: dict, names: tuple[str, ...]) -> list[jax.Array]:
    """The linears ``names`` of block ``p`` applied to the same input: one fused product when the
    inference tree holds them fused, else one product each (canonical trees)."""
    fused = p.get(fused_name(names))
    if fused is None:
        return [linear(x, p[n]) for n in names]
    return fused.split(fused(x))


def norm(config: ModelConfig, x: jax.Array, w: jax.Array) -> jax.Array:
    """(1 + w) RMS norm (decoder, final, q/k and MTP norms)."""
    return ops.rms_norm(x, w, eps=config.rms_norm_eps, unit_offset=True)


# ---- rotary embedding ---------------------------------------------------------------------------


def rope_tables(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin [b, t, 1, rotary_dim] of positions [b, t] (NeoX layout: each half repeated)."""
    rd = config.rotary_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, rd, 2, dtype=jnp.float32) / rd))
    ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, t, rd/2]
    cos = jnp.concatenate([jnp.cos(ang), jnp.cos(ang)], -1)[:, :, None]
    sin = jnp.concatenate([jnp.sin(ang), jnp.sin(ang)], -1)[:, :, None]
    return cos, sin


def rotate(config: ModelConfig, x: jax.Array, tables: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Partial NeoX-style RoPE on the first rotary_dim dims of x [b, t, h, d] (``rope_tables``)."""
    rd = config.rotary_dim
    cos, sin = tables
    xf = x.astype(jnp.float32)
    rot, rest = xf[..., :rd], xf[..., rd:]
    x1, x2 = rot[..., : rd // 2], rot[..., rd // 2 :]
    rotated = rot * cos + jnp.concatenate([-x2, x1], -1) * sin
    return jnp.concatenate([rotated, rest], -1).astype(x.dtype)


# ---- gated full attention -----------------------------------------------------------------------


def grouped_attention(
    q: jax.Array,  # [b, t, hq, d] queries (rotated, normed)
    keys: jax.Array,  # [b, s, g, d]; g = kv heads
    values: jax.Array,  # [b, s, g, d]
    q_pos: jax.Array,  # [b, t] int32 positions of the queries
    key_pos: jax.Array,  # [b, s] int32 positions of the keys
) -> jax.Array:  # [b, t, hq, d] float32
    """Causal softmax attention where query head h reads kv head h // (hq / g) (GQA, as HF's
    ``repeat_interleave``), computed per kv-head group: the queries are reshaped to
    [b, t, g, r, d] and the keys are never repeated or transposed."""
    b, t, hq, d = q.shape
    g = keys.shape[2]
    qg = q.astype(jnp.float32).reshape(b, t, g, hq // g, d) * (d**-0.5)
    kf, vf = keys.astype(jnp.float32), values.astype(jnp.float32)
    scores = jnp.einsum("btgrd,bsgd->bgrts", qg, kf, precision=HIGHEST)
    visible = key_pos[:, None, :] <= q_pos[:, :, None]  # causal, [b, t, s]
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bgrts,bsgd->btgrd", probs, vf, precision=HIGHEST)
    return o.reshape(b, t, hq, d)


def cached_attention(
    q: jax.Array,  # [b, t, hq, d] queries at ``positions``
    k_cache: jax.Array,  # [b, g, n, d] the cache with this window's keys written
    v_cache: jax.Array,  # [b, g, d, n] (transposed: the p·v product reads it in place)
    positions: jax.Array,  # [b, t] int32
) -> jax.Array:  # [b, t, hq, d] float32
    """Causal GQA attention of a window over the cache it has just been written into: query i
    sees slots 0..positions[i] (the committed prefix and the window up to itself; stale slots
    beyond are masked). Reading the *updated* cache gives the cache write a single reader order
    (write, then read), so XLA updates the loop-carried buffer in place; reading the old cache
    beside the write made it copy each K and V buffer twice per step."""
    n = k_cache.shape[2]
    visible = jnp.arange(n)[None, None, :] <= positions[:, :, None]  # [b, t, n]
    return masked_cache_attention(q, k_cache, v_cache, visible)


def masked_cache_attention(
    q: jax.Array,  # [b, t, hq, d]
    k_cache: jax.Array,  # [b, g, n, d]
    v_cache: jax.Array,  # [b, g, d, n] (transposed)
    visible: jax.Array,  # [b, t, n] bool: the cache slots each query row reads
) -> jax.Array:  # [b, t, hq, d] float32
    """GQA attention of query rows over the cache slots ``visible`` to each (one softmax per row;
    ``cached_attention``'s causal prefix, a tree window's ancestor mask)."""
    b, t, hq, d = q.shape
    g = k_cache.shape[1]
    f32 = jnp.float32
    qg = q.astype(f32).reshape(b, t, g, hq // g, d) * (d**-0.5)
    s = jnp.einsum("btgrd,bgsd->bgrts", qg, k_cache.astype(f32), precision=HIGHEST)
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    probs = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bgrts,bgds->btgrd", probs, v_cache.astype(f32), precision=HIGHEST)
    return o.reshape(b, t, hq, d)


def write_kv(cache: AttentionCache, k: jax.Array, v: jax.Array, slots: jax.Array):
    """The cache with a window's keys / values [b, t, g, d] written at ``slots`` [b, t] (in the
    cache's dtype; slots beyond the capacity are dropped, never wrapped)."""
    rows = jnp.arange(k.shape[0])[:, None]
    dtype = cache.k.dtype
    new_k = cache.k.at[rows, :, slots].set(k.astype(dtype), mode="drop")
    new_v = cache.v.at[rows, :, :, slots].set(v.astype(dtype), mode="drop")  # v cache [b, g, d, n]
    return AttentionCache(new_k, new_v)


class Keys(NamedTuple):
    """One segment of keys and values a query block reads (``segment_attention``): the arrays,
    their einsum axes (b batch, g KV heads, d head dim, one key axis of its own — s or m — and t
    where each query row has keys of its own), and which keys each query sees (a mask that
    broadcasts to the scores [b, g, r, t, keys]; None: all)."""

    k: jax.Array
    v: jax.Array
    k_axes: str  # e.g. "bgsd" (a cache), "bsgd" (a window's rows), "btmgd" (each row's own)
    v_axes: str  # e.g. "bgds" (a transposed cache: the p·v product reads it in place)
    visible: jax.Array | None = None


def segment_attention(q: jax.Array, segments: list[Keys]) -> jax.Array:
    """GQA attention of q [b, t, hq, d] over key segments, one softmax over all of them, in
    float32 at HIGHEST precision: the one form of "a cache prefix plus the window's own keys"
    (``step_attention``), "the first depth's keys plus a chain's own" (``chain_attention``) and
    "the MTP cache plus a tree node's ancestors" (``models.mtp_tree``); each caller builds its
    masks. Returns [b, t, hq, d] float32."""
    b, t, hq, d = q.shape
    f32 = jnp.float32
    g = segments[0].k.shape[segments[0].k_axes.index("g")]
    qg = q.astype(f32).reshape(b, t, g, hq // g, d) * (d**-0.5)
    scores, axes = [], []
    for seg in segments:
        (ax,) = set(seg.k_axes) - set("btgd")  # the segment's own key axis
        sc = jnp.einsum(f"btgrd,{seg.k_axes}->bgrt{ax}", qg, seg.k.astype(f32), precision=HIGHEST)
        scores.append(sc if seg.visible is None else jnp.where(seg.visible, sc, -jnp.inf))
        axes.append(ax)
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
    o, start = None, 0
    for seg, sc, ax in zip(segments, scores, axes, strict=True):
        p = probs[..., start : start + sc.shape[-1]]
        start += sc.shape[-1]
        part = jnp.einsum(f"bgrt{ax},{seg.v_axes}->btgrd", p, seg.v.astype(f32), precision=HIGHEST)
        o = part if o is None else o + part
    return o.reshape(b, t, hq, d)


def step_attention(
    q: jax.Array,  # [b, t, hq, d] queries at positions start .. start + t - 1
    k_cache: jax.Array,  # [b, g, n, d] the cache before this window (rows >= start are stale)
    v_cache: jax.Array,  # [b, g, d, n] (transposed: the p·v product reads it in place)
    k_new: jax.Array,  # [b, t, g, d] the window's own keys
    v_new: jax.Array,
    start: jax.Array,  # [b] int32
) -> jax.Array:  # [b, t, hq, d] float32
    """``cached_attention`` read beside the cache write instead of after it: over the committed
    prefix (the cache *before* the write) and the window's own keys, one softmax over both (the
    same keys). The form for one-token steps (see ``attention``)."""
    t, n = q.shape[1], k_cache.shape[2]
    committed = jnp.arange(n)[None, :] < start[:, None]  # [b, n]
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]  # [t (query), t (key)]
    return segment_attention(
        q,
        [
            Keys(k_cache, v_cache, "bgsd", "bgds", committed[:, None, None, None, :]),
            Keys(k_new, v_new, "bsgd", "bsgd", causal),
        ],
    )


def native_attention(p: dict, t: int) -> bool:
    """Whether an attention block of the decoding tree runs the C++ kernel for a t-token window:
    its marker says "ffi" (``decoding``'s ``attention`` option) and t is at most
    ``cpu_attention.MAX_T`` (longer prefills use XLA's form). Same values as XLA's form within
    float32 rounding (tests/test_cpu_attention.py)."""
    core = p.get("core")
    return isinstance(core, AttentionCore) and core.impl == "ffi" and t <= cpu_attention.MAX_T


def attention(
    config: ModelConfig,
    p: dict,
    x: jax.Array,  # [b, t, H] normed input
    start: jax.Array,  # [b] int32: position of x[:, 0]
    valid: jax.Array,  # [b] int32: real tokens in the window
    cache: AttentionCache | None,
) -> tuple[jax.Array, AttentionCache | None]:
    b, t, _ = x.shape
    hd = config.head_dim
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None]  # [b, t]
    q, gate, k, v = attention_inputs(config, p, x, positions)

    if cache is None:  # the window attends to itself
        new_cache = None
        o = grouped_attention(q, k, v, positions, positions)
    else:  # the cache (k [b, g, n, d], v [b, g, d, n]): grouped products read it in place
        dtype = cache.k.dtype
        k, v = k.astype(dtype), v.astype(dtype)  # the window's keys as the cache will hold them
        # Writes beyond capacity are dropped (never wrap around); callers check capacity first.
        new_cache = write_kv(cache, k, v, positions)
        new_k, new_v = new_cache
        # The same keys every way. Decoding's attention="ffi" (the tree's marker) runs the C++
        # kernel over the live prefix of the written cache. Otherwise each form is
        # the one XLA:CPU runs faster in the compiled decode loop (A/B in one process,
        # BUILD_NOTES 2026-12-02): a window read after its write lets XLA update the loop-carried
        # cache in place (reading the old cache beside the write made it copy each K and V buffer
        # twice per step), while a one-token step is faster reading beside the write (its
        # write-first form compiles to more copies, not fewer).
        if native_attention(p, t):
            o = cpu_attention.apply(q, new_k, new_v, positions, hd**-0.5)
        elif t == 1:
            o = step_attention(q, cache.k, cache.v, k, v, start)
        else:
            o = cached_attention(q, new_k, new_v, positions)
    del valid  # padded queries compute garbage that is never used; their KV rows stay stale
    return attention_output(p, o, gate, x.dtype), new_cache


def attention_inputs(config: ModelConfig, p: dict, x: jax.Array, positions: jax.Array):
    """Queries [b, t, hq, d], output gate [b, t, hq * d], keys and values [b, t, g, d] of a
    window at ``positions`` [b, t]: projected, q/k normed and rotated."""
    b, t, _ = x.shape
    hq, hkv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q, gate, k, v = projections(x, p, FUSED["attn"])
    q, k, v = q.reshape(b, t, hq, hd), k.reshape(b, t, hkv, hd), v.reshape(b, t, hkv, hd)
    q, k = norm(config, q, p["q_norm"]), norm(config, k, p["k_norm"])
    # One pair of tables for q and k: with two consumers XLA:CPU keeps cos and sin in their own
    # small fusion; fused into each rotation it evaluates them once per output element, every
    # head (8 us of a 4-row window's rope fusion).
    tables = rope_tables(config, positions)
    return rotate(config, q, tables), gate, rotate(config, k, tables), v


def attention_output(p: dict, o: jax.Array, gate: jax.Array, dtype) -> jax.Array:
    """The attention block's output: heads o [b, t, hq, d] gated by sigmoid(gate), projected."""
    b, t = o.shape[:2]
    o = o.reshape(b, t, -1) * jax.nn.sigmoid(gate)
    return linear(o.astype(dtype), p["w_o"])


def chain_attention(
    q: jax.Array,  # [b, t, hq, d] row i's query
    ctx_k: jax.Array,  # [b, t, g, d] keys of rows 0..t-1, row j visible to query i when j <= i
    ctx_v: jax.Array,
    own_k: jax.Array,  # [b, t, m, g, d] m further keys that only row i's query sees
    own_v: jax.Array,
) -> jax.Array:  # [b, t, hq, d] float32
    """GQA attention of a chained MTP draft, teacher-forced: row i's query reads the first-depth
    keys of rows 0..i (what the MTP cache holds when draft 1 is made from row i) and the keys its
    own chain wrote at the later depths (row i's alone) — one softmax over both, as the cached
    draft step computes it."""
    t = q.shape[1]
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]  # [t (query), t (key)]
    return segment_attention(
        q, [Keys(ctx_k, ctx_v, "bsgd", "bsgd", causal), Keys(own_k, own_v, "btmgd", "btmgd")]
    )


# ---- gated delta net ----------------------------------------------------------------------------


def gdn(
    config: ModelConfig,
    p: dict,
    x: jax.Array,  # [b, t, H] normed input
    valid: jax.Array,  # [b] int32
    cache: GDNCache | None,
    method: str,
    return_states: bool = False,
) -> tuple[jax.Array, GDNCache | None, GDNCommit]:
    """Returns (out [b, t, H], new cache, commit data: ``GDNCommit``, documented field by field
    in ``models/state.py``)."""
    t = x.shape[1]
    real = jnp.arange(t)[None, :] < valid[:, None]  # [b, t]
    # padding: no decay, no update -> state untouched
    mixed, z, g, beta = gdn_inputs(config, p, x, real)
    window = None if cache is None else cache.conv
    conv_out, _ = ops.causal_conv1d(mixed, p["conv"], initial_window=window)
    q, k, v = gdn_qkv(config, conv_out)
    state0 = None if cache is None else cache.state
    o, final, aux = ops.gated_delta_rule_with_aux(
        q, k, v, g, beta, initial_state=state0, method=method, return_states=return_states
    )
    new_cache = None
    if cache is not None:
        new_cache = GDNCache(final, ops.conv_window_after(cache.conv, mixed, valid))
    k_heads = ops.expand_key_heads(k, config.linear_num_value_heads)
    return (
        gdn_output(config, p, o, z, x.dtype),
        new_cache,
        GDNCommit(mixed, k_heads, v, g, beta, aux),
    )


def gdn_inputs(config: ModelConfig, p: dict, x: jax.Array, real: jax.Array):
    """A GDN block's projections of x [b, t, H]: (pre-conv mixed [b, t, c], output gate z
    [b, t, hv, dv], log-decay g and write strength beta [b, t, hv]), with g = beta = 0 where
    ``real`` ([b, t] or [b, 1]) is False, so those rows leave the state untouched."""
    b, t, _ = x.shape
    hv, dv = config.linear_num_value_heads, config.linear_value_head_dim
    mixed, z, b_in, a = projections(x, p, FUSED["gdn"])
    beta = jax.nn.sigmoid(b_in)
    g = -jnp.exp(p["A_log"].astype(jnp.float32)) * jax.nn.softplus(
        a + p["dt_bias"].astype(jnp.float32)
    )
    g = jnp.where(real[..., None], g, 0.0)
    beta = jnp.where(real[..., None], beta, 0.0)
    return mixed.astype(x.dtype), z.reshape(b, t, hv, dv), g, beta


def gdn_qkv(config: ModelConfig, conv_out: jax.Array):
    """q, k (L2-normed, [b, t, hk, dk]) and v [b, t, hv, dv] float32 from the conv output."""
    b, t, _ = conv_out.shape
    hk, dk = config.linear_num_key_heads, config.linear_key_head_dim
    hv, dv = config.linear_num_value_heads, config.linear_value_head_dim
    q, k, v = jnp.split(conv_out.astype(jnp.float32), [hk * dk, 2 * hk * dk], axis=-1)
    q = ops.l2_norm(q.reshape(b, t, hk, dk))
    k = ops.l2_norm(k.reshape(b, t, hk, dk))
    return q, k, v.reshape(b, t, hv, dv)


def gdn_output(config: ModelConfig, p: dict, o: jax.Array, z: jax.Array, dtype) -> jax.Array:
    """The GDN block's output: o [b, t, hv, dv] gated-normed by z, projected to [b, t, H]."""
    o = ops.gated_rms_norm(o, z, p["norm"], eps=config.rms_norm_eps)
    return linear(o.astype(dtype), p["w_out"], heads=True)


# ---- MLPs ---------------------------------------------------------------------------------------


def dense_mlp(p: dict, x: jax.Array) -> jax.Array:
    gate, up = projections(x, p, FUSED["mlp"])
    h = jax.nn.silu(gate) * up
    return linear(h.astype(x.dtype), p["w_down"])


def moe(config: ModelConfig, p: dict, x: jax.Array) -> jax.Array:
    """Softmax router (f32) over all experts, top-k (renormalised when norm_topk_prob), plus a
    sigmoid-gated shared expert. Every expert is evaluated densely and weighted (zero weight when
    not selected): exact, and cheap at the small expert counts used here."""
    logits = linear(x, p["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    top_v, top_i = jax.lax.top_k(probs, config.num_experts_per_tok)
    if config.norm_topk_prob:
        top_v = top_v / jnp.sum(top_v, axis=-1, keepdims=True)
    weights = jnp.sum(
        jax.nn.one_hot(top_i, config.num_experts, dtype=jnp.float32) * top_v[..., None], axis=-2
    )  # [b, t, E]
    xe = x.astype(jnp.float32)
    gate = jnp.einsum("bth,ehi->btei", xe, p["w_gate"].astype(jnp.float32), precision=HIGHEST)
    up = jnp.einsum("bth,ehi->btei", xe, p["w_up"].astype(jnp.float32), precision=HIGHEST)
    expert_out = jnp.einsum(
        "btei,eih->bteh", jax.nn.silu(gate) * up, p["w_down"].astype(jnp.float32), precision=HIGHEST
    )
    out = jnp.einsum("bte,bteh->bth", weights, expert_out, precision=HIGHEST)
    if "shared" in p:
        out = out + jax.nn.sigmoid(linear(x, p["shared_gate"])) * dense_mlp(p["shared"], x)
    return out


def mlp(config: ModelConfig, kind: str, p: dict, x: jax.Array) -> jax.Array:
    return moe(config, p, x) if kind == "moe" else dense_mlp(p, x)


# ---- decoder layer ------------------------------------------------------------------------------


def decoder_layer(
    config: ModelConfig,
    kind: tuple[str, str],  # (layer type, mlp type)
    p: dict,
    x: jax.Array,  # [b, t, H] residual stream
    start: jax.Array,
    valid: jax.Array,
    cache,
    gdn_method: str,
    gdn_states: bool = False,
):
    """Pre-norm residual layer of the causal window (``hybrid_layer``). Returns (x, new cache,
    commit data: ``AttentionCommit`` or ``GDNCommit``)."""
    return hybrid_layer(
        config,
        kind[1],
        p,
        x,
        lambda h, pa: attention(config, pa, h, start, valid, cache),
        lambda h, pg: gdn(config, pg, h, valid, cache, gdn_method, gdn_states),
    )


def hybrid_layer(config: ModelConfig, mlp_type: str, p: dict, x: jax.Array, attend, mix_gdn):
    """One layer of the hybrid trunk in any window form: ``residual_block`` whose mixer is
    ``attend(h, p["attn"]) -> (out, new cache)`` on an attention layer and
    ``mix_gdn(h, p["gdn"]) -> (out, new cache, GDNCommit)`` on a GDN layer (the causal window's
    ``decoder_layer``, a tree window's ``models.tree.tree_layer``). Returns (x, new cache,
    commit data)."""

    def mixer(h):
        if "attn" in p:
            mixed, new = attend(h, p["attn"])
            return mixed, (new, AttentionCommit())
        mixed, new, commit = mix_gdn(h, p["gdn"])
        return mixed, (new, commit)

    x, (cache, commit) = residual_block(config, mlp_type, p, x, mixer)
    return x, cache, commit


def residual_block(config: ModelConfig, mlp_type: str, p: dict, x: jax.Array, mixer):
    """The one pre-norm residual block of every decoder layer (the trunk's windows, a tree
    window, the MTP layer chained or drafting a tree): x + mixer(norm(x)), then
    x + mlp(norm(x)). ``mixer(h) -> (out [b, t, H], aux)`` is the layer's token mixer (attention
    or GDN in whichever form); returns (x, aux)."""
    mixed, aux = mixer(norm(config, x, p["input_norm"]))
    x = x + mixed.astype(x.dtype)
    x = x + mlp(config, mlp_type, p["mlp"], norm(config, x, p["post_norm"])).astype(x.dtype)
    return x, aux
