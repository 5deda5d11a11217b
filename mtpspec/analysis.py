"""Speculative-decoding analysis: cost pieces, the ideal speed-up, the acceptance model, plots.

Shared by ``experiments/bench_speculative.py`` and the notebooks, so that a figure in a notebook
and a number in the benchmark come from the same code.

Definitions (../shared/DESIGN.md, "Performance physics"):
  * t_step: one jitted 1-token decode step of the target (the work plain decoding does per token);
  * t_verify(k): one jitted (k+1)-token verify window of the target;
  * t_draft(k): one jitted proposal of k drafts (MTP catch-up over a full window + chain; n-gram
    lookup; a draft model's k+1 one-token steps);
  * ideal speed-up = τ · t_step / (t_verify + t_draft): commit, bookkeeping and loop overhead are
    deliberately not in it; ``efficiency`` = measured speed-up ÷ ideal exposes them.
  * The i.i.d. acceptance model: each draft is accepted with probability α independently, so
    P(at least i accepted) = α^i and E[τ] = (1 − α^{k+1}) / (1 − α).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.config import ModelConfig
from mtpspec.decoding.commit import COMMIT_STRATEGIES, commit_window
from mtpspec.decoding.proposers import draft_model_propose, mtp_catch_up_and_draft, ngram_propose
from mtpspec.models.decoder import window_step_impl
from mtpspec.models.state import DecodeState, init_decode_state

# ---- timing -------------------------------------------------------------------------------------


def median_seconds(fn: Callable, *args, repeats: int = 20, warmup: int = 2) -> float:
    """Median wall time of ``fn(*args)`` (blocked until ready) over ``repeats`` calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(max(warmup, 1)):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class CompileCounter:
    """Counts XLA backend compilations while active (``with CompileCounter() as c: ...; c.count``).

    Listens to JAX's own compile event, so it sees every compile in the process (jit caches, AOT
    ``lower().compile()``, anything), not only the generate-program cache."""

    EVENT = "/jax/core/compile/backend_compile_duration"
    _active: list[CompileCounter] = []
    _registered = False

    def __init__(self):
        self.count = 0

    @classmethod
    def _on_duration(cls, event: str, duration: float, **kwargs) -> None:
        if event == cls.EVENT:
            for counter in cls._active:
                counter.count += 1

    def __enter__(self):
        if not CompileCounter._registered:
            jax.monitoring.register_event_duration_secs_listener(CompileCounter._on_duration)
            CompileCounter._registered = True
        CompileCounter._active.append(self)
        return self

    def __exit__(self, *exc):
        CompileCounter._active.remove(self)
        return False


# ---- cost pieces --------------------------------------------------------------------------------


def _tree_bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def loop_job(body: Callable, consts, carry, *, iters: int = 64) -> Callable[[], None]:
    """A zero-argument callable running ``carry = body(consts, carry)`` ``iters`` times inside one
    jitted ``lax.fori_loop`` (compiled and run once here), blocking until done.

    This is how the generate loop pays for a piece: on device, without a Python dispatch per call
    (which alone costs more than a whole step of a small model on CPU). ``consts`` (weights, saved
    window data) are arguments, never baked-in constants. ``body`` must make the next iteration's
    inputs depend on this one's outputs, so that XLA can neither hoist the work out of the loop
    nor drop it as dead."""
    run = jax.jit(lambda x, c: jax.lax.fori_loop(0, iters, lambda i, c: body(x, c), c))
    jax.block_until_ready(run(consts, carry))

    def call():
        jax.block_until_ready(run(consts, carry))

    return call


def interleaved_medians(jobs: dict[str, Callable[[], None]], *, repeats: int = 7) -> dict:
    """Median wall seconds of each zero-argument job, timed round-robin (every repeat runs every
    job once), so slow phases of a shared machine (we saw the same program drift between 1.4 and
    0.7 ms per call within one second) hit all jobs alike instead of whichever ran then."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, job in jobs.items():
            t0 = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def _pin(new: DecodeState, old: DecodeState) -> DecodeState:
    """``new`` with the lengths of ``old``: every cache write stays live (it is carried), but the
    loop keeps writing the same rows, so N iterations need no extra capacity."""
    return new._replace(lengths=old.lengths, mtp_lengths=old.mtp_lengths)


def piece_costs(
    config: ModelConfig,
    params,
    prompt: Sequence[int],
    k: int,
    *,
    proposers: Sequence[str] = ("mtp", "ngram"),
    commits: Sequence[str] = COMMIT_STRATEGIES,
    verify_method: str = "auto",
    draft: tuple[ModelConfig, dict] | None = None,
    iters: int = 64,
    repeats: int = 9,
    capacity: int | None = None,
) -> dict:
    """Cost of each piece of one speculative step, on the post-prefill state of ``prompt``, each
    timed in its own jitted on-device loop (``loop_job``), as generate's loop runs it, all pieces
    round-robin (``interleaved_medians``).

    Returns seconds per call: ``step`` (1-token target step), ``verify`` ((k+1)-token window, GDN
    form ``verify_method``), ``commit_<strategy>`` (committing 1 + k//2 of the k+1 positions),
    ``draft_<proposer>`` (``mtp``: catch-up over a full window + the chain; ``ngram``: the lookup;
    ``draft``: the draft model's k+1 one-token steps); and bytes: ``state_bytes`` (the target
    DecodeState), ``commit_data_bytes_<strategy>`` (what the verify window keeps for the commit;
    "states" also keeps every per-position GDN state), ``step_temp_bytes_<strategy>`` (XLA's temp
    buffer of verify + commit, ``compiled.memory_analysis()``; None where the backend can't say).
    ``capacity``: KV-cache slots per sequence; pass generate's (every step attends over all of
    them, masked), or the pieces are timed on a cheaper state than the loop runs on."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    tokens = jnp.asarray([list(prompt)], jnp.int32)
    b, p = tokens.shape
    vocab = config.vocab_size
    capacity = capacity or p + 2 * (k + 1) + 16
    state0 = init_decode_state(config, b, capacity)
    out = jax.jit(lambda prm, s, t: window_step_impl(config, prm, s, t, jnp.full((b,), p), "auto"))(
        params, state0, tokens
    )
    state = out.state
    window = jnp.tile(tokens[:, -1:], (1, k + 1))
    full = jnp.full((b,), k + 1, jnp.int32)
    one = jnp.ones((b,), jnp.int32)
    res: dict = {"k": k, "iters": iters}

    def next_tokens(logits, t):  # data dependence: the next input comes from this output
        return ((jnp.argmax(logits, -1) + t) % vocab).astype(jnp.int32)

    def step_body(prm, c):
        s, t = c
        o = window_step_impl(config, prm, s, t, one, "auto")
        return _pin(o.state, s), next_tokens(o.logits, t)

    jobs: dict[str, Callable[[], None]] = {}
    jobs["step"] = loop_job(step_body, params, (state, window[:, :1]), iters=iters)

    def verify_body(prm, c):
        s, t = c
        o = window_step_impl(config, prm, s, t, full, verify_method)
        return _pin(o.state, s), next_tokens(o.logits, t)

    jobs["verify"] = loop_job(verify_body, params, (state, window), iters=iters)
    res["state_bytes"] = _tree_bytes(state)
    n = jnp.full((b,), 1 + k // 2, jnp.int32)
    verify_keep = jax.jit(
        lambda prm, s, t, keep: window_step_impl(config, prm, s, t, full, verify_method, keep),
        static_argnums=3,
    )  # one compile per value of keep (only "states" keeps per-position states)
    for strategy in commits:
        keep = strategy == "states"
        verified = verify_keep(params, state, window, keep)
        res[f"commit_data_bytes_{strategy}"] = _tree_bytes(verified.commit)

        def commit_body(v, c, st=strategy):
            return _pin(commit_window(c, v.state, v.commit, n, st), c)

        jobs[f"commit_{strategy}"] = loop_job(commit_body, verified, state, iters=iters)

        def verify_commit(prm, s, t, n, st=strategy, keep=keep):
            v = window_step_impl(config, prm, s, t, full, verify_method, keep)
            return v.logits, commit_window(s, v.state, v.commit, n, st)

        mem = jax.jit(verify_commit).lower(params, state, window, n).compile().memory_analysis()
        res[f"step_temp_bytes_{strategy}"] = None if mem is None else int(mem.temp_size_in_bytes)

    def greedy(logits, salt):
        return jnp.argmax(logits, -1).astype(jnp.int32), jnp.zeros(logits.shape[:-1] + (0,))

    if "mtp" in proposers and config.mtp_num_layers and "mtp" in params:
        hid = out.hidden[:, -(k + 1) :]

        def mtp_body(x, c):
            prm, h = x
            s, t = c
            drafts, _, s2 = mtp_catch_up_and_draft(config, prm, s, h, t, full, k, greedy)
            return _pin(s2, s), jnp.concatenate([t[:, :1], drafts], axis=1)

        jobs["draft_mtp"] = loop_job(mtp_body, (params, hid), (state, window), iters=iters)
    if "ngram" in proposers:
        hist = jnp.zeros((b, capacity + 1), jnp.int32).at[:, :p].set(tokens)
        hist_len = jnp.full((b,), p, jnp.int32)

        def ngram_body(n_len, h):
            d = ngram_propose(h, n_len, k, 1, 3)
            return h.at[:, p - 1].set(d[:, 0])  # the next lookup depends on this one

        jobs["draft_ngram"] = loop_job(ngram_body, hist_len, hist, iters=iters)
    if "draft" in proposers and draft is not None:
        dconfig, dparams = draft
        dstate = init_decode_state(dconfig, b, capacity)
        dstate = jax.jit(
            lambda prm, s, t: window_step_impl(dconfig, prm, s, t, jnp.full((b,), p), "auto").state
        )(dparams, dstate, tokens)
        active = jnp.ones((b,), bool)

        def draft_body(prm, c):
            s, t = c
            d, _, s2, _ = draft_model_propose(dconfig, prm, s, t, active, k, greedy, False)
            return _pin(s2, s), d[:, -1]

        jobs["draft_draft"] = loop_job(draft_body, dparams, (dstate, tokens[:, -1]), iters=iters)
    # every piece is timed round-robin with the others (see interleaved_medians)
    res.update({k: v / iters for k, v in interleaved_medians(jobs, repeats=repeats).items()})
    return res


def matmul_row_scaling(
    d_in: int, d_out: int, rows: Sequence[int], *, iters: int = 300, repeats: int = 15
) -> dict[int, float]:
    """Seconds per [t, d_in] @ [d_in, d_out] @ [d_out, d_in] pair for each t in ``rows``, run in a
    jitted loop (fastest of ``repeats``, interleaved across t so noise hits all alike).

    The physics behind ``verify_over_step``: when the weights sit in cache, a product with t rows
    costs ~t times a 1-row one (compute-bound), and a (k+1)-token window cannot be nearly free as
    it is on a memory-bound accelerator."""
    w1 = jax.random.normal(jax.random.key(0), (d_in, d_out), jnp.float32) / np.sqrt(d_in)
    w2 = jax.random.normal(jax.random.key(1), (d_out, d_in), jnp.float32) / np.sqrt(d_out)
    hi = jax.lax.Precision.HIGHEST

    def body(w, x):
        return jnp.tanh(jnp.matmul(jnp.matmul(x, w[0], precision=hi), w[1], precision=hi))

    run = jax.jit(lambda w, x: jax.lax.fori_loop(0, iters, lambda i, x: body(w, x), x))
    xs = {t: jnp.full((1, t, d_in), 0.1, jnp.float32) for t in rows}
    for x in xs.values():
        jax.block_until_ready(run((w1, w2), x))
    best = {t: float("inf") for t in rows}
    for _ in range(repeats):
        for t, x in xs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run((w1, w2), x))
            best[t] = min(best[t], (time.perf_counter() - t0) / iters)
    return best


def ideal_speedup(tau: float, t_step: float, t_verify: float, t_draft: float) -> float:
    """τ · t_step / (t_verify + t_draft): the speed-up if commit, bookkeeping and loop were free."""
    return tau * t_step / (t_verify + t_draft)


# ---- acceptance model ---------------------------------------------------------------------------


def expected_tau(alpha: float | np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """E[tokens per verify step] = (1 − α^{k+1}) / (1 − α) under i.i.d. acceptance α (k+1 at 1)."""
    alpha = np.asarray(alpha, np.float64)
    k = np.asarray(k, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return np.where(np.isclose(alpha, 1.0), k + 1, tau)


def fit_alpha(position_acceptance: Sequence[Sequence[float]]) -> float:
    """Least-squares α for P(at least i drafts accepted) = α^i, pooled over runs.

    ``position_acceptance``: one list per run (any k), entry i−1 = measured fraction of verify
    steps that accepted ≥ i drafts (``GenerateResult.stats["position_acceptance"]``)."""
    pairs = [(i + 1, float(r)) for run in position_acceptance for i, r in enumerate(run)]
    if not pairs:
        raise ValueError("fit_alpha needs at least one measured acceptance rate")
    if any(not 0.0 <= r <= 1.0 for _, r in pairs):
        raise ValueError(f"acceptance rates must lie in [0, 1], got {[r for _, r in pairs]}")
    i = np.array([p[0] for p in pairs], np.float64)
    r = np.array([p[1] for p in pairs], np.float64)
    grid = np.linspace(0.0, 1.0, 100001)
    err = ((grid[:, None] ** i[None, :] - r[None, :]) ** 2).sum(axis=1)
    return float(grid[int(np.argmin(err))])


# ---- plots --------------------------------------------------------------------------------------


def plot_sweep(rows: Sequence[dict], alpha: dict[str, float], path: str, *, title: str = ""):
    """Speed-up and τ vs k per proposer (best commit strategy per k), against the theory curve
    (1 − α^{k+1}) / (1 − α) and the ideal speed-up it implies with the measured costs.

    ``rows``: sweep rows with keys proposer, num_draft, commit, speedup, tau, ideal,
    verify_over_step, draft_over_step (and optionally decode_speedup). Writes a PNG to ``path``
    and returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"mtp": "tab:blue", "ngram": "tab:orange", "draft": "tab:green"}
    for proposer in sorted({r["proposer"] for r in rows}):
        best: dict[int, dict] = {}
        for r in rows:
            if r["proposer"] == proposer:
                k = r["num_draft"]
                if k not in best or r["speedup"] > best[k]["speedup"]:
                    best[k] = r
        ks = sorted(best)
        c = colors.get(proposer, None)
        ax_s.plot(ks, [best[k]["speedup"] for k in ks], "o-", color=c,
                  label=f"{proposer} measured (end to end)")  # fmt: skip
        if all("decode_speedup" in best[k] for k in ks):
            ax_s.plot(ks, [best[k]["decode_speedup"] for k in ks], "^-", color=c, alpha=0.7,
                      label=f"{proposer} measured (decode only)")  # fmt: skip
        ax_s.plot(ks, [best[k]["ideal"] for k in ks], "s--", color=c, alpha=0.6,
                  label=f"{proposer} ideal (measured τ, costs)")  # fmt: skip
        ax_t.plot(ks, [best[k]["tau"] for k in ks], "o-", color=c, label=f"{proposer} measured τ")
        if proposer in alpha:
            a = alpha[proposer]
            kk = np.arange(1, max(ks) + 1)
            ax_t.plot(kk, expected_tau(a, kk), ":", color=c, label=f"{proposer} theory α={a:.2f}")
            theory_speed = [
                float(expected_tau(a, k))
                / (best[k]["verify_over_step"] + best[k]["draft_over_step"])
                for k in ks
            ]
            ax_s.plot(ks, theory_speed, ":", color=c, label=f"{proposer} theory α={a:.2f}")
    ax_s.axhline(1.0, color="gray", lw=0.8)
    ax_s.set_xlabel("k (drafts per verify)")
    ax_s.set_ylabel("speed-up over plain greedy")
    ax_s.legend(fontsize=7)
    ax_t.set_xlabel("k (drafts per verify)")
    ax_t.set_ylabel("τ (tokens per verify step)")
    ax_t.legend(fontsize=7)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_s, ax_t):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig
