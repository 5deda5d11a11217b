"""Resuming a training run (``train.train``): the recorded hyper-parameters, a longer or shorter
run, the newest checkpoint that restores, and the metrics rewound to it.

``workdir/train_config.json`` records the run's ``TrainConfig``. A resume with other
hyper-parameters is refused (it would mix two runs in one), naming each changed one, unless the
caller allows it; the intervals in ``RESUMABLE_CHANGES`` may change freely. ``steps`` may change
too: a run is continued to the new total from its newest intact checkpoint. The learning-rate
schedule stays the run's own — warm-up, then cosine decay to the step the run was first started
with (``decay_steps``, recorded in train_config.json), then the schedule's final rate — so the
steps already trained keep the rates they were trained with, and a longer run trains on at the
final rate. One log line says so; a fresh run with the recorded ``--steps`` and
``--decay_steps`` reproduces the whole run. A total below the step already trained is a
ValueError (nothing to train); a total equal to it trains nothing and says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import orbax.checkpoint as ocp

# Fields a resumed run may change (they do not change what is trained); ``steps`` may change
# too (``check_resume_config``); any other change is refused unless allowed.
RESUMABLE_CHANGES = frozenset({"save_every", "eval_every", "log_every", "eval_batches"})
TRAIN_CONFIG_FILE = "train_config.json"


def _no_log(*_):
    pass


def read_metrics(path: pathlib.Path, upto: int, log=_no_log) -> list[dict]:
    """The metrics rows of steps <= ``upto``. A torn last line (a crash mid-write) is dropped and
    said; an unreadable line before it is a ValueError naming the file and line."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row")
        except ValueError as e:
            if i == len(lines) - 1:
                log(f"dropped a torn last line of {path} ({line[:40]!r}...)")
                break
            raise ValueError(
                f"{path} line {i + 1} is not a metrics row ({e}): {line[:80]!r}"
            ) from e
        rows.append(row)
    return [r for r in rows if r["step"] <= upto]


def rewrite(path: pathlib.Path, text: str) -> None:
    """Replace ``path``'s contents atomically (write beside, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _recorded(workdir: pathlib.Path, tc) -> dict | None:
    """The recorded config (fields added since counted at their defaults), or None."""
    path = workdir / TRAIN_CONFIG_FILE
    if not path.exists():
        return None
    try:
        before = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); remove it to resume anyway") from e
    # a field added since the directory was recorded counts as its default (an older run of this
    # code trained with it)
    return {**{f.name: f.default for f in dataclasses.fields(type(tc))}, **before}


def check_resume_config(workdir: pathlib.Path, tc, allow: bool, log, schedule):
    """``tc`` as this run in ``workdir`` trains it. A first run: ``tc``. A resume: a changed
    hyper-parameter is a ValueError naming it (unless ``allow``: then logged); a changed
    ``steps`` keeps the recorded schedule (``decay_steps``, filled in when ``tc`` leaves it
    None) and logs one line saying what that means (``schedule(tc)``: the learning rate)."""
    before = _recorded(workdir, tc)
    if before is None:
        return tc
    before_decay = before.get("decay_steps") or before.get("steps")
    if tc.decay_steps is None and before_decay != tc.steps:
        tc = dataclasses.replace(tc, decay_steps=before_decay)
    now = {**dataclasses.asdict(tc), "decay_steps": tc.decay_steps or tc.steps}
    before = {**before, "decay_steps": before_decay}
    changed = sorted(k for k in now.keys() | before.keys() if now.get(k) != before.get(k))
    changed = [k for k in changed if k not in RESUMABLE_CHANGES and k != "steps"]
    if changed and not allow:
        diffs = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ValueError(
            f"resuming {workdir} with changed hyper-parameters ({diffs}); pass "
            "allow_config_change=True (--allow_config_change) to continue anyway, or use a new "
            "work directory (steps alone may change on a resume)"
        )
    if changed:
        log(f"resuming with changed hyper-parameters: {', '.join(changed)}")
    if before.get("steps") != tc.steps:
        log(_steps_line(before.get("steps"), tc, schedule))
    return tc


def _steps_line(old: int, tc, schedule) -> str:
    decay = tc.decay_steps or tc.steps
    final = float(schedule(tc)(decay))
    how = (
        f"a longer run: it continues from the newest checkpoint to step {tc.steps}"
        if tc.steps > old
        else f"a shorter run: it stops at step {tc.steps}"
    )
    after = (
        f", then stays at its final rate {final:.2e}"
        if tc.steps > decay
        else f" (step {tc.steps} trains at {float(schedule(tc)(tc.steps - 1)):.2e}, above the "
        f"final {final:.2e})"
    )
    return (
        f"resuming with changed hyper-parameters: steps {old} -> {tc.steps} ({how}; the "
        f"learning-rate schedule is the run's own: warm-up {tc.warmup}, cosine decay to step "
        f"{decay}{after}; recorded as decay_steps={decay} in {TRAIN_CONFIG_FILE}: a fresh run "
        f"with --steps={tc.steps} --decay_steps={decay} trains the same)"
    )


def check_start(workdir: pathlib.Path, start: int, tc, log) -> None:
    """After the restore: a run already past ``tc.steps`` is a ValueError; one at it, said."""
    if start > tc.steps:
        raise ValueError(
            f"{workdir} has trained to step {start} (its newest checkpoint that restores), past "
            f"steps={tc.steps}: there is nothing to train; pass steps >= {start} to continue "
            "this run, or a new work directory for a shorter run"
        )
    if start == tc.steps:
        log(f"already at step {start} of {tc.steps}: nothing to train (a larger steps continues)")


def record_config(workdir: pathlib.Path, tc) -> None:
    rewrite(workdir / TRAIN_CONFIG_FILE, json.dumps(dataclasses.asdict(tc), indent=2) + "\n")


def restore_latest(manager, params, opt_state, log):
    """(params, opt_state, step) from the newest checkpoint that restores; an unreadable one is
    skipped and said (the previous one is used). (params, opt_state, 0) when there is none."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": params, "opt": opt_state})
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: fall back, loudly
            log(f"checkpoint at step {step} cannot be restored ({type(e).__name__}: {e}); "
                "trying the previous one")  # fmt: skip
            continue
        log(f"resumed from step {step}")
        return restored["params"], restored["opt"], step
    return params, opt_state, 0
