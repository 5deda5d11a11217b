"""One short GPU check of method="pallas": correctness against the reference, then timings.

    experiments/gpu_check.sh                     # the GPU machine (JAX 0.11.2, installs nothing)
    python -m experiments.gpu_check --cpu_smoke  # here: tiny shapes, interpret mode, < 1 min

What it prints (and writes as JSON to --json_out):
1. correctness: pallas vs "recurrent" at every prefill length (o and final state, f32) and every
   verify window (o, final state and the GDNAux: u, per-position states), and the bf16 rule
   (kernel error <= 1.5x the reference's own bf16 error against f32) at the first prefill length;
2. timings (median of --repeats calls, compile and one warm-up excluded) of every method for
   prefill (T = 2048..16384) and verify windows (T = 2..16; "assoc" only up to --assoc_max_t);
3. a small sweep of the kernel's chunk size and value block at the first prefill length.
A time budget (--budget_s) skips what is left rather than overrun the device lease; skipped
entries are marked, never silently dropped. The exit status is 1 if any correctness check failed.
"""

from __future__ import annotations

import importlib
import pathlib
import statistics
import sys
import time
import types

import jax
import jax.numpy as jnp
from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
flags.DEFINE_bool("cpu_smoke", False, "Tiny shapes on CPU (interpret mode): checks the script.")
flags.DEFINE_list("prefill_lengths", ["2048", "4096", "8192", "16384"], "Prefill lengths.")
flags.DEFINE_list("window_lengths", ["2", "3", "5", "9", "16"], "Verify window lengths (k+1).")
flags.DEFINE_list("methods", ["recurrent", "chunk", "assoc", "pallas"], "Methods to time.")
flags.DEFINE_list(
    "sweep", ["16x64x8", "32x64x4", "32x64x8", "64x64x8"], "Pallas chunk x block_v x warps sweep."
)
flags.DEFINE_integer("batch", 1, "Batch size.")
flags.DEFINE_integer("key_heads", 16, "q/k heads.")
flags.DEFINE_integer("value_heads", 32, "v heads (a multiple of key_heads).")
flags.DEFINE_integer("key_dim", 128, "Key head dim.")
flags.DEFINE_integer("value_dim", 128, "Value head dim.")
flags.DEFINE_integer("assoc_max_t", 16, "Time 'assoc' only up to this length (t·h·k² floats).")
flags.DEFINE_integer("repeats", 5, "Timed calls per point (median reported).")
flags.DEFINE_float("budget_s", 240.0, "Skip remaining timings after this many seconds.")
cli.define_json_out()

SMOKE = dict(
    prefill_lengths=[40],  # two chunks of 32, the second one partial
    window_lengths=[5],
    batch=1,
    key_heads=1,
    value_heads=2,
    key_dim=16,
    value_dim=24,
    sweep=[(16, 32, 8)],
    repeats=2,
)
PREFILL_TOL = 1e-4  # long sequences: as the chunk-form test at T = 4096
WINDOW_TOL = 1e-5


def import_ops():
    """``mtpspec.ops`` needs only JAX; the package's __init__ also imports the training and
    checkpoint modules (flax, optax, orbax). If one of those fails on the GPU image, load the ops
    subpackage alone rather than lose the run."""
    try:
        from mtpspec import ops

        return ops
    except ImportError as e:
        root = pathlib.Path(__file__).resolve().parent.parent / "mtpspec"
        for name in [m for m in sys.modules if m == "mtpspec" or m.startswith("mtpspec.")]:
            del sys.modules[name]
        pkg = types.ModuleType("mtpspec")
        pkg.__path__ = [str(root)]
        sys.modules["mtpspec"] = pkg
        print(f"note: importing mtpspec.ops alone ({type(e).__name__}: {e})")
        return importlib.import_module("mtpspec.ops")


def make_inputs(cfg, t, seed=0, dtype=jnp.float32):
    """Layer-like inputs: q, k L2-normalised, g = -softplus, beta = sigmoid, a small state."""
    keys = jax.random.split(jax.random.key(seed), 6)
    names = ("batch", "key_heads", "value_heads", "key_dim", "value_dim")
    b, hk, hv, dk, dv = (cfg[n] for n in names)

    def unit(key, shape):
        x = jax.random.normal(key, shape)
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    q = unit(keys[0], (b, t, hk, dk)).astype(dtype)
    k = unit(keys[1], (b, t, hk, dk)).astype(dtype)
    v = jax.random.normal(keys[2], (b, t, hv, dv)).astype(dtype)
    g = -jax.nn.softplus(jax.random.normal(keys[3], (b, t, hv)) - 1.0)
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (b, t, hv)))
    s0 = 0.1 * jax.random.normal(keys[5], (b, hv, dk, dv))
    return q, k, v, g, beta, s0


def rel_err(a, e) -> float:
    a, e = jnp.asarray(a, jnp.float32), jnp.asarray(e, jnp.float32)
    return float(jnp.max(jnp.abs(a - e)) / jnp.maximum(jnp.max(jnp.abs(e)), 1e-30))


def timed(fn, *args, repeats):
    """(median seconds per call, last output); compile and one warm-up call excluded."""
    out = jax.block_until_ready(fn(*args))
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


class Check:
    """The check for one configuration: ``run()`` returns the JSON-able result."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.ops = import_ops()
        self.started = time.perf_counter()
        self.result = {
            "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind,
            "jax": jax.__version__,
            "config": {k: v for k, v in cfg.items() if k != "sweep"},
            "prefill": [],
            "windows": [],
            "bf16": None,
            "sweep": [],
            "failures": [],
        }

    def over_budget(self) -> bool:
        return time.perf_counter() - self.started > self.cfg["budget_s"]

    def fail(self, what: str, error: Exception | None = None) -> None:
        text = what if error is None else f"{what}: {type(error).__name__}: {error}"
        self.result["failures"].append(text)
        if error is not None:
            print(f"ERROR {text}", flush=True)

    def method_fn(self, method, with_aux):
        ops = self.ops

        @jax.jit
        def fn(q, k, v, g, beta, s0):
            if with_aux:
                return ops.gated_delta_rule_with_aux(
                    q, k, v, g, beta, initial_state=s0, method=method, return_states=True
                )
            return ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method=method)

        return fn

    def time_row(self, kind, t, tol):
        """Every method timed at length t; pallas checked against this run's recurrence."""
        cfg = self.cfg
        inputs = make_inputs(cfg, t)
        row, outs = {"t": t}, {}
        for m in cfg["methods"]:
            if m == "assoc" and t > cfg["assoc_max_t"]:
                row[m] = None
                continue
            if self.over_budget():
                row[m] = "budget"
                continue
            try:
                fn = self.method_fn(m, kind == "window")
                row[m], outs[m] = timed(fn, *inputs, repeats=cfg["repeats"])
            except Exception as e:  # one failing method must not cost the rest of the run
                row[m] = "error"
                self.fail(f"{kind} t={t} {m}", e)
        if "pallas" in outs and "recurrent" in outs:
            got, ref = outs["pallas"], outs["recurrent"]
            errs = {"o": rel_err(got[0], ref[0]), "final": rel_err(got[1], ref[1])}
            if kind == "window":
                errs["u"] = rel_err(got[2].u, ref[2].u)
                errs["states"] = rel_err(got[2].states, ref[2].states)
            row["pallas_err"] = errs
            row["ok"] = all(e <= tol for e in errs.values())
            if not row["ok"]:
                self.fail(f"{kind} t={t}: {errs} > {tol}")
        return row

    def show(self, kind, row):
        def cell(m):
            x = row.get(m)
            if isinstance(x, float):
                return f"{x * 1e3:>13.3f}"
            return f"{'skipped' if x is None else x:>13}"  # None: not timed; else budget/error

        def ratio(a):
            x, p = row.get(a), row.get("pallas")
            ok = isinstance(x, float) and isinstance(p, float)
            return f"{x / p:.2f}x" if ok else "-"

        err = row.get("pallas_err")
        err_txt = f"{max(err.values()):.1e}" if err else "-"
        print(
            f"{kind:>8} {row['t']:>6} " + " ".join(cell(m) for m in self.cfg["methods"])
            + f" {ratio('recurrent'):>10} {ratio('chunk'):>12} {err_txt:>10}",
            flush=True,
        )  # fmt: skip

    def bf16_rule(self, t):
        """At length t: the kernel's bf16 error <= 1.5x the reference's own bf16 error."""
        x16 = make_inputs(self.cfg, t, seed=1, dtype=jnp.bfloat16)
        x32 = tuple(x.astype(jnp.float32) for x in x16)
        exact = self.method_fn("recurrent", False)(*x32)[0]
        ref = self.method_fn("recurrent", False)(*x16)[0]
        got = self.method_fn("pallas", False)(*x16)[0]
        ref_err, got_err = rel_err(ref, exact), rel_err(got, exact)
        ok = got_err <= 1.5 * ref_err + 1e-6
        self.result["bf16"] = {"t": t, "ref_err": ref_err, "pallas_err": got_err, "ok": ok}
        print(f"bf16 t={t}: reference err {ref_err:.2e}, pallas err {got_err:.2e} -> ok={ok}")
        if not ok:
            self.fail(f"bf16 rule: {got_err} > 1.5 x {ref_err}")

    def kernel_sweep(self, t):
        """Chunk size x value block x warps of the kernel at length t."""
        from mtpspec.ops.gdn import pallas_gpu

        inputs = make_inputs(self.cfg, t)
        for chunk, block_v, warps in self.cfg["sweep"]:
            point = {"chunk": chunk, "block_v": block_v, "num_warps": warps}
            if self.over_budget():
                self.result["sweep"].append({**point, "ms": "budget"})
                continue
            pcfg = pallas_gpu.PallasConfig(
                scale=self.cfg["key_dim"] ** -0.5, chunk=chunk, return_states=False,
                interpret=jax.default_backend() == "cpu", block_v=block_v, num_warps=warps,
            )  # fmt: skip
            fn = jax.jit(lambda *a, pcfg=pcfg: pallas_gpu.gdn_pallas(*a, pcfg)[:2])
            try:
                sec, _ = timed(fn, *inputs, repeats=self.cfg["repeats"])
            except Exception as e:
                self.result["sweep"].append({**point, "ms": "error"})
                self.fail(f"sweep {point}", e)
                continue
            self.result["sweep"].append({**point, "ms": sec * 1e3})
            print(f"sweep t={t} {point}: {sec * 1e3:.3f} ms", flush=True)

    def run(self) -> dict:
        cfg, result = self.cfg, self.result
        print(
            f"gpu_check on {result['backend']} ({result['device']}), jax {result['jax']}, "
            f"b={cfg['batch']} hk={cfg['key_heads']} hv={cfg['value_heads']} "
            f"k={cfg['key_dim']} v={cfg['value_dim']}"
        )
        header = f"{'kind':>8} {'T':>6} " + " ".join(f"{m + ' ms':>13}" for m in cfg["methods"])
        print(header + f" {'pallas/rec':>10} {'pallas/chunk':>12} {'pallas err':>10}")
        for kind, lengths, tol, out in (
            ("prefill", cfg["prefill_lengths"], PREFILL_TOL, result["prefill"]),
            ("window", cfg["window_lengths"], WINDOW_TOL, result["windows"]),
        ):
            for t in lengths:
                out.append(self.time_row(kind, t, tol))
                self.show(kind, out[-1])
        print("(pallas/rec, pallas/chunk: speed-up of pallas; window rows return GDNAux w/ states)")
        t = cfg["prefill_lengths"][0]
        if not self.over_budget() and "pallas" in cfg["methods"]:
            self.bf16_rule(t)
        self.kernel_sweep(t)
        result["elapsed_s"] = time.perf_counter() - self.started
        failures = result["failures"]
        status = "FAILED: " + "; ".join(failures) if failures else "all checks ok"
        print(f"{status} ({result['elapsed_s']:.1f} s)")
        return result


def run_check(cfg: dict) -> dict:
    """The whole check for one configuration; returns the JSON-able result."""
    return Check(cfg).run()


def config_from_flags() -> dict:
    cfg = dict(
        prefill_lengths=[int(x) for x in FLAGS.prefill_lengths],
        window_lengths=[int(x) for x in FLAGS.window_lengths],
        methods=list(FLAGS.methods),
        batch=FLAGS.batch,
        key_heads=FLAGS.key_heads,
        value_heads=FLAGS.value_heads,
        key_dim=FLAGS.key_dim,
        value_dim=FLAGS.value_dim,
        assoc_max_t=FLAGS.assoc_max_t,
        repeats=FLAGS.repeats,
        budget_s=FLAGS.budget_s,
        sweep=[tuple(int(n) for n in s.split("x")) for s in FLAGS.sweep],
    )
    if FLAGS.cpu_smoke:
        cfg.update(SMOKE)
    return cfg


def main(argv):
    del argv
    if FLAGS.cpu_smoke:
        jax.config.update("jax_platforms", "cpu")
    result = run_check(config_from_flags())
    cli.write_json(result)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    cli.run(main)
