"""Train a hybrid GDN + attention model with an MTP head (optax), checkpoint and resume (orbax).

Loss: next-token cross-entropy of the trunk plus ``mtp_weight`` × the MTP head's cross-entropy
(row i: final-normed hidden h_i with token i+1 predicts token i+2 — the same pairing the
speculative proposer uses). ``phase="mtp_only"`` freezes the trunk (and the shared embedding /
head: gradients are taken for ``params["mtp"]`` only, and the optimizer — an optax
``multi_transform`` with ``set_to_zero`` for the rest — keeps moments for the head alone) and
trains the MTP module against it, with ``loss="distill"`` (KL from the trunk's own next-token
distribution at row i+1, i.e. the base model's law of token i+2: what greedy acceptance asks the
head to match) or ``loss="ce"`` (the data's token i+2). Every MTP run also reports ``mtp_agree``:
how often the head's argmax equals the trunk's at the same token — the greedy acceptance rate of
the first draft. ``mtp_depth`` d > 1 unrolls the head on its own output as the proposer drafts
2..k (``decoder.mtp_chain_impl``, teacher-forced on the data's tokens) and averages the loss over
the d depths; depth j's metrics are ``mtp_kl_dj``, ``mtp_agree_dj``, ... (a head trained at depth
1 only sees the trunk's hidden, never its own output, and its later drafts are accepted far less
often).

Resume: an orbax ``CheckpointManager`` keeps the last checkpoints of {params, opt_state}; batches
are a pure function of (seed, step) (``data.batch_at``), so a run killed at any point and started
again with the same arguments continues with the same data order and the same loss curve.
``metrics.jsonl`` in the work directory holds one line per step (rewound on resume). Started again
with a larger ``steps``, a run continues to the new total on its own schedule (``resume``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mtpspec import sharding
from mtpspec.checkpoints import save_params
from mtpspec.config import ModelConfig
from mtpspec.models import init_params
from mtpspec.models.inference import check_finite
from mtpspec.models.params import check_param_tree, param_shapes
from mtpspec.training import data as data_lib
from mtpspec.training import resume
from mtpspec.training.losses import losses, mtp_loss

# where they were defined before resume.py
RESUMABLE_CHANGES, TRAIN_CONFIG_FILE = resume.RESUMABLE_CHANGES, resume.TRAIN_CONFIG_FILE


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    clip: float = 1.0
    mtp_weight: float = 0.5
    mtp_depth: int = 1  # MTP loss over this many chained drafts (decoder.mtp_chain_impl)
    phase: str = "joint"  # "joint" | "mtp_only"
    loss: str = "ce"  # the MTP head's loss: "ce" (data) | "distill" (mtp_only: the trunk's law)
    seed: int = 0
    decay_steps: int | None = None  # the cosine decay's end; None: ``steps`` (resume.py)
    save_every: int = 100
    eval_every: int = 100
    eval_batches: int = 4
    log_every: int = 10

    def __post_init__(self):
        if self.phase not in ("joint", "mtp_only"):
            raise ValueError(f"phase must be 'joint' or 'mtp_only', got {self.phase!r}")
        if self.loss not in ("ce", "distill"):
            raise ValueError(f"loss must be 'ce' or 'distill', got {self.loss!r}")
        if self.loss == "distill" and self.phase != "mtp_only":
            raise ValueError(
                "loss='distill' needs phase='mtp_only' (the target is the trunk's own "
                "distribution, which must be frozen)"
            )
        names = ("steps", "batch", "seq_len", "save_every", "eval_every", "log_every", "mtp_depth")
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("warmup", "eval_batches", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        # a NaN rate trains and saves NaN checkpoints; a negative one trains by ascent
        for name in ("lr", "weight_decay", "clip", "mtp_weight"):
            value = getattr(self, name)
            number = isinstance(value, int | float | np.integer | np.floating)
            if isinstance(value, bool) or not number or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise ValueError("lr must be > 0 (a zero learning rate trains nothing)")
        decay = self.decay_steps
        if decay is not None and (
            isinstance(decay, bool) or not isinstance(decay, int | np.integer) or decay < 1
        ):
            raise ValueError(f"decay_steps must be None or an int >= 1, got {decay!r}")
        if self.mtp_depth >= self.seq_len:
            raise ValueError(f"mtp_depth ({self.mtp_depth}) must be below seq_len ({self.seq_len})")


def learning_rate(tc: TrainConfig):
    """The schedule: linear warm-up to ``lr``, cosine decay to 5 % of it at ``decay_steps``
    (``steps`` unless set: a resumed run with a larger ``steps`` keeps its first total, and
    trains on at 5 %), constant after."""
    decay = tc.decay_steps or tc.steps
    return optax.warmup_cosine_decay_schedule(
        0.0, tc.lr, warmup_steps=tc.warmup, decay_steps=max(decay, tc.warmup + 1),
        end_value=tc.lr * 0.05,
    )  # fmt: skip


def _labels(params):
    """ "train" for the MTP head, "frozen" for everything else (mtp_only)."""
    return {k: jax.tree.map(lambda _, k=k: "train" if k == "mtp" else "frozen", v)
            for k, v in params.items()}  # fmt: skip


def make_optimizer(tc: TrainConfig):
    """AdamW with global-norm clipping. ``mtp_only``: the same on the MTP head alone, through
    ``optax.multi_transform``; the rest gets ``set_to_zero`` (no updates, no optimizer state)."""
    adamw = optax.chain(
        optax.clip_by_global_norm(tc.clip),
        optax.adamw(learning_rate(tc), b1=0.9, b2=0.95, weight_decay=tc.weight_decay),
    )
    if tc.phase == "joint":
        return adamw
    return optax.multi_transform({"train": adamw, "frozen": optax.set_to_zero()}, _labels)


def make_train_step(config: ModelConfig, tc: TrainConfig, optimizer, *, mesh=None):
    """jitted (params, opt_state, batch) -> (params, opt_state, metrics). With ``mesh``, the
    program is compiled for params / optimizer moments placed by ``mtpspec.sharding`` rules and
    the batch split on ``data`` (inputs are placed so on the way in); metrics come back
    replicated."""
    if mesh is not None:
        mesh = sharding.check_mesh(mesh)

    def loss_fn(params, batch):
        parts = losses(
            config, params, batch, detach_trunk=tc.phase == "mtp_only", mtp_depth=tc.mtp_depth
        )
        if tc.phase == "mtp_only":
            total = mtp_loss(parts, "mtp_kl" if tc.loss == "distill" else "mtp", tc.mtp_depth)
        else:
            head = mtp_loss(parts, "mtp", tc.mtp_depth) if "mtp" in parts else 0.0
            total = parts["main"] + tc.mtp_weight * head
        return total, parts

    def step(params, opt_state, batch):
        if tc.phase == "mtp_only":  # gradients of the head only; the trunk gets zeros (unused)
            (total, parts), g_mtp = jax.value_and_grad(
                lambda m: loss_fn({**params, "mtp": m}, batch), has_aux=True
            )(params["mtp"])
            grads = {**jax.tree.map(jnp.zeros_like, params), "mtp": g_mtp}
        else:
            (total, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": total, **parts}

    if mesh is None:
        return jax.jit(step)
    p_sh = sharding.param_shardings(config, mesh)
    o_sh = opt_state_shardings(config, optimizer, mesh)
    b_sh = sharding.batch_sharding(mesh, 2)
    jitted = jax.jit(
        step, in_shardings=(p_sh, o_sh, b_sh), out_shardings=(p_sh, o_sh, NamedSharding(mesh, P()))
    )

    def train_step(params, opt_state, batch):  # placing is a no-op from the second step on
        params = jax.tree.map(sharding.place, params, p_sh)
        opt_state = jax.tree.map(sharding.place, opt_state, o_sh)
        if not isinstance(batch, jax.Array) or batch.sharding != b_sh:
            batch = _place_batch(batch, mesh)
        return jitted(params, opt_state, batch)

    train_step.jitted = jitted
    return train_step


def opt_state_shardings(config: ModelConfig, optimizer, mesh):
    """Shardings of ``optimizer.init(params)``: every parameter-shaped moment like its
    parameter, every other leaf (step counts) replicated."""
    mesh = sharding.check_mesh(mesh)
    p_sh = sharding.param_shardings(config, mesh)
    abstract_params = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s, jnp.dtype(config.dtype)),
        param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x),
    )
    abstract = jax.eval_shape(optimizer.init, abstract_params)
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(
        optimizer,
        lambda _, sh: sh,
        abstract,
        p_sh,
        transform_non_params=lambda _: replicated,
    )


def init_opt_state(config: ModelConfig, optimizer, params, *, mesh=None):
    """``optimizer.init(params)``, created directly in its sharded layout under ``mesh``."""
    if mesh is None:
        return optimizer.init(params)
    o_sh = opt_state_shardings(config, optimizer, mesh)
    params = sharding.shard_params(config, params, mesh)
    return jax.jit(optimizer.init, out_shardings=o_sh)(params)


def _place_batch(batch, mesh) -> jax.Array:
    """A global [b, t + 1] batch (the same on every process: batches are a pure function of
    (seed, step)) split on ``data``; each process places only its own devices' rows."""
    batch = np.asarray(batch)
    d = mesh.shape[sharding.DATA]
    if batch.shape[0] % d:
        raise ValueError(f"batch size {batch.shape[0]} does not divide by the data axis ({d})")
    return sharding.place_host_array(batch, sharding.batch_sharding(mesh, batch.ndim))


def evaluate(
    config: ModelConfig, params: dict, batches: list[np.ndarray], *, mesh=None, mtp_depth: int = 1
) -> dict:
    fn = jax.jit(lambda p, b: losses(config, p, b, mtp_depth=mtp_depth))
    if mesh is not None:
        mesh = sharding.check_mesh(mesh)
        params = sharding.shard_params(config, params, mesh)
        put = functools.partial(_place_batch, mesh=mesh)
    else:
        put = jnp.asarray
    parts = [jax.tree.map(sharding.to_host, fn(params, put(b))) for b in batches]
    return {k: float(np.mean([p[k] for p in parts])) for k in parts[0]}


def _no_log(*_):
    pass


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _log_progress(log, step: int, steps: int, m: dict, rate: float, eta: float) -> None:
    nan = float("nan")
    log(
        f"step {step}/{steps} loss {m['loss']:.4f} main {m['main']:.4f} "
        f"mtp {m.get('mtp', nan):.4f} agree {m.get('mtp_agree', nan):.3f} "
        f"lr {m['lr']:.2e} {rate:,.0f} tok/s eta {_duration(eta)}"
    )


def _log_eval(log, writer, step: int, ev: dict) -> None:
    nan = float("nan")
    log(
        f"  held-out: main {ev['main']:.4f} nats/token, mtp {ev.get('mtp', nan):.4f}, "
        f"mtp KL {ev.get('mtp_kl', nan):.4f}, mtp top-1 {ev.get('mtp_acc', nan):.3f}, "
        f"agrees with the trunk {ev.get('mtp_agree', nan):.3f}"
        + "".join(
            f", at depth {k[11:]} {v:.3f}" for k, v in ev.items() if k.startswith("mtp_agree_d")
        )
    )
    if writer is not None:
        for k, v in ev.items():
            writer.add_scalar(f"eval/{k}", v, step)
        writer.flush()


def _metric_writer(logdir: pathlib.Path):
    """TensorBoard event files (tensorboardX) beside metrics.jsonl; None without the package."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:  # pragma: no cover - a dependency; only metrics.jsonl then
        return None
    return SummaryWriter(logdir=str(logdir))


def _progress(start: int, total: int, primary: bool):
    """A tqdm bar with ETA on an interactive terminal (None elsewhere: logs get the lines)."""
    import sys

    if not primary or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)


def _check_mesh_batch(mesh, tc: TrainConfig):
    if mesh is None:
        return None
    mesh = sharding.check_mesh(mesh)
    d = mesh.shape[sharding.DATA]
    if tc.batch % d:
        raise ValueError(f"batch size {tc.batch} does not divide by the data axis ({d})")
    return mesh


def _initial_params(config: ModelConfig, tc: TrainConfig, init, mesh) -> dict:
    """``init`` checked (tree, finite), or a fresh model; placed on ``mesh``."""
    if init is None:
        params = init_params(config, jax.random.key(tc.seed))
        params["embed"] = params["embed"] * 0.04  # std 0.02: tied logits start near uniform
    else:
        check_param_tree(config, init, name="init")
        check_finite(init)  # training from NaN weights trains and saves NaN
        params = init
    if mesh is not None:
        params = sharding.shard_params(config, params, mesh)
    return params


def _resume(workdir: pathlib.Path, tc: TrainConfig, manager, params, opt_state, primary, log):
    """(params, opt_state, start) from the newest checkpoint that restores; ``tc`` recorded and
    metrics.jsonl rewound to ``start`` (process 0). ValueError when the run is past ``tc.steps``."""
    params, opt_state, start = resume.restore_latest(manager, params, opt_state, log)
    try:
        resume.check_start(workdir, start, tc, log)
    except ValueError:
        manager.close()
        raise
    if primary:
        resume.record_config(workdir, tc)
        metrics_path = workdir / "metrics.jsonl"
        kept = resume.read_metrics(metrics_path, start, log)
        resume.rewrite(metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
    return params, opt_state, start


def train(
    config: ModelConfig,
    tc: TrainConfig,
    corpus: data_lib.Corpus,
    workdir: str | os.PathLike,
    *,
    init: dict | None = None,
    log=print,
    kill_at_step: int | None = None,
    mesh=None,
    allow_config_change: bool = False,
) -> tuple[dict, dict]:
    """Train (or resume) in ``workdir``; returns (params, last eval metrics).

    ``workdir/checkpoints``: orbax checkpoints; ``metrics.jsonl``: per-step metrics (``tb/``: the
    same as TensorBoard events); ``final``: the final params (``checkpoints.load``).
    ``kill_at_step`` (a test hook) SIGKILLs this process right after that step's metrics line,
    before any checkpoint of that step: the hardest place to resume from.
    ``mesh``: train sharded over a (data, model) mesh (``mtpspec.sharding``); checkpoints are
    written and restored in that layout (orbax, per shard).
    Resuming: from the newest checkpoint that restores (an unreadable one is skipped, and said);
    ``workdir/train_config.json`` records ``tc``, and a resume with other hyper-parameters
    (besides the intervals in ``RESUMABLE_CHANGES``) is refused unless ``allow_config_change``;
    a changed ``steps`` continues on the run's own schedule (``resume``, logged and recorded).
    metrics.jsonl is rewound atomically; a torn last line is dropped. ValueError before any
    device work when a split of ``corpus`` holds no ``tc.seq_len`` window."""
    mesh = _check_mesh_batch(mesh, tc)  # before any device work
    data_lib.check_split(corpus.train, "training", tc.seq_len)
    data_lib.check_split(corpus.eval, "held-out", tc.seq_len)
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    tc = resume.check_resume_config(workdir, tc, allow_config_change, log, learning_rate)
    optimizer = make_optimizer(tc)
    params = _initial_params(config, tc, init, mesh)
    opt_state = init_opt_state(config, optimizer, params, mesh=mesh)
    # Multi-host: every process trains; only process 0 writes metrics.jsonl and logs.
    primary = jax.process_index() == 0
    if not primary:
        log = _no_log
    manager = ocp.CheckpointManager(
        workdir / "checkpoints",
        options=ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False),
    )
    params, opt_state, start = _resume(workdir, tc, manager, params, opt_state, primary, log)
    metrics_path = workdir / "metrics.jsonl"
    train_step = make_train_step(config, tc, optimizer, mesh=mesh)
    held = data_lib.eval_batches(
        corpus.eval, batch=tc.batch, seq_len=tc.seq_len, count=tc.eval_batches
    )
    last_eval: dict[str, Any] = {}
    schedule = learning_rate(tc)
    writer = _metric_writer(workdir / "tb") if primary else None
    bar = _progress(start, tc.steps, primary)
    timed_s, timed_steps, window_s, window_tokens = 0.0, 0, 0.0, 0
    with metrics_path.open("a") if primary else open(os.devnull, "w") as metrics:
        for step in range(start + 1, tc.steps + 1):
            batch = data_lib.batch_at(
                corpus.train, step, batch=tc.batch, seq_len=tc.seq_len, seed=tc.seed
            )
            t0 = time.perf_counter()
            params, opt_state, m = train_step(params, opt_state, batch)
            m = {k: float(sharding.to_host(v)) for k, v in m.items()}  # waits for the step
            dt = time.perf_counter() - t0
            if step > start + 1:  # this process's first step compiles: not a rate
                timed_s, timed_steps = timed_s + dt, timed_steps + 1
                window_s, window_tokens = window_s + dt, window_tokens + tc.batch * tc.seq_len
            m["lr"] = float(schedule(step - 1))  # the rate this step's update used
            metrics.write(json.dumps({"step": step, **m}) + "\n")
            metrics.flush()
            if kill_at_step == step:
                os.kill(os.getpid(), signal.SIGKILL)
            rate = window_tokens / window_s if window_s > 0 else float("nan")
            if writer is not None:
                for k, v in m.items():
                    writer.add_scalar(f"train/{k}", v, step)
                if window_s > 0:
                    writer.add_scalar("train/tokens_per_s", rate, step)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{m['loss']:.4f}", lr=f"{m['lr']:.2e}", refresh=False)
            if step % tc.log_every == 0 or step == tc.steps:
                eta = (tc.steps - step) * timed_s / timed_steps if timed_steps else float("nan")
                _log_progress(log, step, tc.steps, m, rate, eta)
                window_s, window_tokens = 0.0, 0
            if step % tc.eval_every == 0 or step == tc.steps:
                last_eval = evaluate(config, params, held, mesh=mesh, mtp_depth=tc.mtp_depth)
                _log_eval(log, writer, step, last_eval)
            if step % tc.save_every == 0 or step == tc.steps:
                manager.save(step, args=ocp.args.StandardSave({"params": params, "opt": opt_state}))
                manager.wait_until_finished()
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()
    manager.close()
    final = workdir / "final"
    save_params(final, config, params, overwrite=True)
    return params, last_eval
