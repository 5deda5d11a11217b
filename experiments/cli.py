"""The flags the experiment scripts share, each defined here once with one name, plus small helpers
(mesh start-up, tokenizer, the demo prompts).

A script calls the ``define_*`` groups it needs at import time:

    define_checkpoint()            --checkpoint (default: the shipped model)
    define_draft_checkpoint()      --draft_checkpoint
    define_speculation(...)        --proposer, --num_draft, --commit (comma lists; a script that
                                   runs one configuration takes the one value with ``one(...)``)
    define_num_draft(...)          --num_draft alone
    define_tree(...)               --tree (draft trees b1xb2x..., a comma list; ``trees()``)
    define_adaptive()              --p_min (comma list), --adaptive
    define_linear()                --linear
    define_attention()             --attention
    define_json_out()              --json_out
    define_mesh()                  --mesh and the multi-host flags

A tool defines none of these names itself (tests/test_structure.py checks): one vocabulary.

and runs with ``cli.run(main)`` (for ``app.run``): a user's mistake ends in one line on stderr,
``<tool>: error: <message>``, status 2 (usage) or 1, its traceback only with ``--debug``.

Mesh, single host, 8 devices, 2-way data x 4-way model parallel:

    python -m experiments.generate --mesh=2x4 --prompt="def fib(n):"

Multi-host (the same command in every process; process 0's host:port is the coordinator):

    python -m experiments.train --workdir=/shared/run --mesh=2x8 \\
        --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=$RANK

``--distributed`` alone lets JAX detect the cluster (SLURM, Open MPI, Cloud TPU).
"""

from __future__ import annotations

import json
import logging
import pathlib
import sys
import traceback

from absl import app, flags
from absl import logging as absl_logging

# mtpspec is imported inside the functions: gpu_check.py uses this module on a machine where only
# JAX may import (it loads mtpspec.ops alone there).
ROOT = pathlib.Path(__file__).resolve().parent.parent
ASSETS = ROOT / "mtpspec" / "assets"
DEFAULT_MODEL = ASSETS / "default_model"
FLAGS = flags.FLAGS


# The names the define_* groups below own: no tool defines one of these itself.
SHARED_FLAGS = (
    "checkpoint", "draft_checkpoint", "proposer", "num_draft", "commit", "tree", "linear",
    "attention", "json_out", "mesh", "p_min", "adaptive",
)  # fmt: skip


def define_checkpoint(
    help_text: str = "Model directory: an mtpspec checkpoint or an HF one.",
    default: str | None = str(DEFAULT_MODEL),
    required: bool = False,
):
    flags.DEFINE_string("checkpoint", default, help_text, required=required)


def define_draft_checkpoint():
    flags.DEFINE_string(
        "draft_checkpoint", None, "A draft model (same vocabulary) for --proposer=draft."
    )


def define_speculation(proposer: str = "mtp", num_draft: str | None = None):
    from mtpspec.decoding import COMMIT_STRATEGIES, DEFAULT_COMMIT, DEFAULT_NUM_DRAFT
    from mtpspec.decoding.proposers import names as proposer_names

    if num_draft is None:
        num_draft = str(DEFAULT_NUM_DRAFT)
    flags.DEFINE_list(
        "proposer", proposer, f"Draft proposer(s): none (plain decoding) or {proposer_names()}."
    )
    define_num_draft(num_draft)
    flags.DEFINE_list("commit", DEFAULT_COMMIT, f"GDN commit strategy(s), of {COMMIT_STRATEGIES}.")


def define_num_draft(
    default: str, help_text: str = "k: drafts per verify step (comma list to sweep)."
):
    """--num_draft alone (``define_speculation`` includes it), for a tool that fixes the rest."""
    flags.DEFINE_list("num_draft", default, help_text)


def define_adaptive():
    """--p_min and --adaptive: the drafting that adapts, beside the fixed chains
    (``analysis.adaptive_points``)."""
    flags.DEFINE_list(
        "p_min", [],
        "Draft confidences (SpecConfig.p_min) swept for every k and proposer with probabilities "
        "(mtp, draft) beside the fixed chains; with --adaptive also with the policy.",
    )  # fmt: skip
    flags.DEFINE_bool(
        "adaptive", False,
        "Also run the adaptive draft-length policy (SpecConfig.adaptive) at the largest k, alone "
        "and with each --p_min.",
    )  # fmt: skip


def define_linear():
    flags.DEFINE_enum(
        "linear", "auto", ["auto", "xla", "ffi"],
        "How the model's matrices run while decoding: ffi = the C++ CPU kernel, xla = XLA's dots, "
        "auto = ffi on CPU when built (decoding.prepare).",
    )  # fmt: skip


def define_tree(default: list[str] | None = None, help_text: str | None = None):
    flags.DEFINE_list(
        "tree", default or [],
        help_text or "Draft tree(s) b1xb2x... (e.g. 2x2x1: b_i children per node at depth i; "
        "num_draft is its depth), a comma list to sweep; empty: chains only.",
    )  # fmt: skip


def define_attention():
    flags.DEFINE_enum(
        "attention", "auto", ["auto", "xla", "ffi"],
        "How decoding's attention runs: ffi = the C++ CPU kernel over the live cache prefix, "
        "xla = XLA's form, auto = ffi on CPU when built and the cache is float32.",
    )  # fmt: skip


def define_json_out():
    flags.DEFINE_string("json_out", None, "Write the results as JSON here.")


def define_mesh():
    flags.DEFINE_string(
        "mesh", None, "Shard over a DATAxMODEL device mesh, e.g. 1x8 or 2x4 (default: one device)."
    )
    flags.DEFINE_bool("distributed", False, "Multi-host: call jax.distributed.initialize().")
    flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
    flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
    flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


# ---- reading the shared flags -------------------------------------------------------------------


def proposers() -> list[str]:
    from mtpspec.decoding.proposers import names as proposer_names

    known = ("none", *proposer_names())
    bad = [p for p in FLAGS.proposer if p not in known]
    if bad:
        raise app.UsageError(f"--proposer: unknown {bad}; expected some of {known}")
    return list(FLAGS.proposer)


def num_drafts() -> list[int]:
    try:
        ks = [int(k) for k in FLAGS.num_draft]
    except ValueError as e:
        raise app.UsageError(f"--num_draft must be integers, got {FLAGS.num_draft}") from e
    if not ks or min(ks) < 1:
        raise app.UsageError(f"--num_draft must be >= 1, got {FLAGS.num_draft}")
    return ks


def commits() -> list[str]:
    from mtpspec.decoding import COMMIT_STRATEGIES

    bad = [c for c in FLAGS.commit if c not in COMMIT_STRATEGIES]
    if bad:
        raise app.UsageError(f"--commit: unknown {bad}; expected some of {COMMIT_STRATEGIES}")
    return list(FLAGS.commit)


def one(values: list, name: str):
    """The single value of a list flag, for scripts that run one configuration."""
    if len(values) != 1:
        raise app.UsageError(f"--{name} takes one value here, got {values}")
    return values[0]


def setup_mesh():
    """Start multi-host JAX when asked, then build the --mesh mesh (None without --mesh)."""
    from mtpspec import sharding

    explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    if FLAGS.distributed or any(v is not None for v in explicit):
        sharding.initialize_distributed(
            FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id
        )
    if FLAGS.mesh is None:
        return None
    data, model = sharding.parse_mesh(FLAGS.mesh)
    return sharding.make_mesh(data, model)


def write_json(value) -> None:
    """``value`` as JSON to --json_out (when given)."""
    if FLAGS.json_out:
        pathlib.Path(FLAGS.json_out).write_text(json.dumps(value, indent=2) + "\n")
        print(f"json: {FLAGS.json_out}")


# ---- text ---------------------------------------------------------------------------------------


def tokenizer_for(config, path):
    """The checkpoint's tokenizer (``checkpoints.load_tokenizer``): its tokenizer.json, else the
    byte tokenizer for the 256 vocabulary."""
    from mtpspec import checkpoints

    return checkpoints.load_tokenizer(path, config)


def parse_tree(text: str, flag: str) -> tuple[int, ...]:
    """A draft tree written b1xb2x... (``2x2x1``; one level: ``3``) as its branching tuple;
    app.UsageError naming ``flag`` otherwise."""
    try:
        tree = tuple(int(b) for b in text.lower().split("x"))
    except ValueError:
        tree = ()
    if not tree or min(tree) < 1:
        raise app.UsageError(f"{flag} takes tree shapes like 2x2x1 (b_i >= 1), got {text!r}")
    return tree


def trees() -> list[tuple[int, ...]]:
    """--tree as branching tuples (empty entries skipped)."""
    return [parse_tree(t, "--tree") for t in FLAGS.tree if t]


def bench_prompts(config, n: int) -> list[list[int]]:
    """The first ``n`` held-out demo prompts (byte vocabulary), else n deterministic prompts of 40
    random ids repeated twice (n-gram lookup has something to find)."""
    import numpy as np

    from mtpspec.tokenizers import ByteTokenizer

    if not 1 <= n <= 4:
        raise ValueError(f"--num_prompts must be in 1..4, got {n}")
    if config.vocab_size == ByteTokenizer.vocab_size:
        return [ByteTokenizer().encode(t) for t in demo_texts()[:n]]
    rng = np.random.default_rng(0)
    half = rng.integers(0, config.vocab_size, size=(n, 40))
    return np.concatenate([half, half], axis=1).tolist()


def demo_texts() -> list[str]:
    """The held-out demo prompts (``mtpspec/assets/demo_prompts.json``)."""
    spec = json.loads((ASSETS / "demo_prompts.json").read_text())
    return [p["text"] for p in spec["prompts"]]


# ---- running a tool -----------------------------------------------------------------------------

# What a user's mistake raises (a bad flag value, a missing path, an option this checkpoint does
# not support): the library refuses bad inputs with ValueError / TypeError, missing or unreadable
# files with OSError, and the scripts with app.UsageError. Anything else is a bug: its traceback
# stays.
USER_ERRORS = (app.UsageError, flags.Error, ValueError, TypeError, OSError)
USAGE_STATUS = 2  # usage errors (flags, app.UsageError), as argparse
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def tool_name() -> str:
    """``experiments.generate`` for ``python -m experiments.generate``, else the script's name."""
    path = pathlib.Path(sys.argv[0] if sys.argv and sys.argv[0] else "experiments")
    if path.suffix == ".py" and path.resolve().parent == pathlib.Path(__file__).resolve().parent:
        return f"experiments.{path.stem}"
    return path.name


def one_line(error: BaseException) -> str:
    """The error's message on one line (its lines joined), else the exception's type name."""
    text = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text or type(error).__name__


def fail(error: BaseException | str, status: int, debug: bool = False) -> None:
    """``<tool>: error: <message>`` on stderr (after the traceback when ``debug``) and exit."""
    if debug:
        traceback.print_exc()
    message = error if isinstance(error, str) else one_line(error)
    sys.stdout.flush()
    print(f"{tool_name()}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, whose errors (bad value, unknown flag, a required flag missing) end in
    one line and status 2 instead of absl's two-line "FATAL Flags parsing error"."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        fail(e, USAGE_STATUS)


# Libraries whose INFO lines a tool does not print (orbax logs a dozen per checkpoint load, JAX
# that it found no TPU, before any error line of ours); their warnings and errors pass, and
# --debug shows everything. mtpspec's own INFO lines (what "auto" chose) stay.
QUIET_LIBRARIES = ("/orbax/", "/jax/_src/")


class _QuietLibraries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        path = record.pathname.replace("\\", "/")
        return not any(part in path for part in QUIET_LIBRARIES)


def run(main) -> None:
    """``app.run(main)`` for an experiments script, with a user's mistake (``USER_ERRORS``) ending
    in one line ``<tool>: error: <message>`` on stderr and status 2 (usage) or 1, no traceback;
    Ctrl-C in one line and status 130. ``--debug`` prints the traceback before that line; other
    exceptions (bugs) keep theirs. --help and the other absl flags behave as with app.run.
    Orbax's and JAX's INFO lines (``QUIET_LIBRARIES``) are not printed unless ``--debug``.

    Output printed from text that came from bytes (argv, file names; Python decodes them with
    surrogateescape) goes back out as those bytes: stdout's ``strict`` errors (a UTF-8 locale
    other than C) would turn echoing a non-UTF-8 prompt into a UnicodeEncodeError."""
    if "debug" not in FLAGS:
        # listed under the script (--helpshort), not this module
        flags.DEFINE_bool(
            "debug", False, "On an error, print the Python traceback too.", module_name=sys.argv[0]
        )
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="surrogateescape")

    def checked_main(argv):
        if not FLAGS.debug:  # this tool's own process: the user's logging is not touched
            absl_logging.get_absl_handler().addFilter(_QuietLibraries())
        try:
            return main(argv)
        except KeyboardInterrupt:
            fail("interrupted", INTERRUPTED_STATUS, FLAGS.debug)
        except USER_ERRORS as e:
            usage = isinstance(e, (app.UsageError, flags.Error))
            fail(e, USAGE_STATUS if usage else 1, FLAGS.debug)

    app.run(checked_main, flags_parser=_parse_flags)
