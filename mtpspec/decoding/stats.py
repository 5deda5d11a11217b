"""Acceptance statistics: the one definition of τ and per-position acceptance, used by
``generate``'s results, the CLI, the benchmarks and the notebooks.

τ (tokens per verify step) = the tokens a sequence's verify steps emitted ÷ their number: Σ (a + 1)
over its steps, where a is the number of drafts a step accepted, less any tokens cut at EOS or
max_new_tokens (those are not emitted); the prefill token is not from a verify step and is not
counted. Position acceptance i = fraction of verify steps that accepted at least i drafts (what
the verifier accepted, cut or not).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def acceptance(
    accepted: Iterable[Sequence[int]], k: int, emitted: Sequence[int] | None = None
) -> dict:
    """Pooled statistics of per-sequence accepted-draft lists (−1 entries: the sequence was not
    active at that step and are ignored). ``emitted``: per sequence, the tokens its verify steps
    emitted (the count without the prefill token); without it every accepted token counts as
    emitted. Returns ``tau``, ``position_acceptance`` (k entries), ``steps`` (verify steps, all
    sequences) and ``tau_per_sequence``."""
    rows = [np.asarray([a for a in seq if a >= 0], np.int64) for seq in accepted]
    flat = np.concatenate(rows) if rows else np.zeros((0,), np.int64)
    steps = len(flat)
    if emitted is None:
        emitted = [int((r + 1).sum()) for r in rows]
    if len(emitted) != len(rows):
        raise ValueError(f"emitted has {len(emitted)} entries for {len(rows)} sequences")
    return {
        "tau": float(sum(emitted) / max(steps, 1)),
        "tau_per_sequence": [float(e / max(len(r), 1)) for e, r in zip(emitted, rows)],
        "position_acceptance": [float((flat >= i).sum() / max(steps, 1)) for i in range(1, k + 1)],
        "steps": steps,
    }


def by_context_position(
    prompt_lengths: Sequence[int],
    accepted: Iterable[Sequence[int]],
    k: int,
    bucket: int,
    drafted: Iterable[Sequence[int]] | None = None,
) -> list[dict]:
    """Acceptance by where in the context each verify step ran: a step of a sequence whose prompt
    had P tokens and whose earlier steps accepted a_1..a_{j-1} starts at context position
    P + 1 + Σ (a_i + 1) (the prefill token included). Steps are grouped into ``bucket``-token
    ranges of that position; per range: ``start``, ``steps``, ``tau`` (accepted + 1 per step:
    what the verifier accepted, cuts at EOS / max_new_tokens not subtracted) and
    ``position_acceptance`` (k entries); with ``drafted`` (the result's ``stats["drafted"]``:
    drafts in each step's window, what an adapting draft length chose) also ``mean_drafted``.
    Ranges with no step are left out."""
    if not isinstance(bucket, int) or isinstance(bucket, bool) or bucket < 1:
        raise ValueError(f"bucket must be an int >= 1, got {bucket!r}")
    accepted = [list(seq) for seq in accepted]
    if len(accepted) != len(prompt_lengths):
        raise ValueError(
            f"{len(prompt_lengths)} prompt lengths for {len(accepted)} sequences of steps"
        )
    if drafted is not None:
        drafted = [list(seq) for seq in drafted]
        if [len(s) for s in drafted] != [len(s) for s in accepted]:
            raise ValueError("drafted must have one entry per step of each sequence, as accepted")
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, (p, seq) in enumerate(zip(prompt_lengths, accepted, strict=True)):
        pos = int(p) + 1
        for j, a in enumerate(seq):
            if a < 0:
                continue
            d = k if drafted is None else int(drafted[i][j])
            groups.setdefault(pos // bucket, []).append((int(a), d))
            pos += a + 1
    rows = []
    for g in sorted(groups):
        acc, dra = np.asarray(groups[g]).T
        row = {
            "start": g * bucket,
            "steps": len(acc),
            "tau": float((acc + 1).mean()),
            "position_acceptance": [float((acc >= i).mean()) for i in range(1, k + 1)],
        }
        if drafted is not None:
            row["mean_drafted"] = float(dra.mean())
        rows.append(row)
    return rows


def pooled(stats: Iterable[dict]) -> dict:
    """``acceptance`` over the sequences of several ``generate`` results' stats (e.g. one per
    prompt at batch 1)."""
    stats = list(stats)
    if not stats:
        raise ValueError("pooled() needs at least one result's stats")
    k = stats[0]["num_draft"]
    if any(s["num_draft"] != k for s in stats):
        raise ValueError("pooled() needs results with the same num_draft")
    emitted = (
        [e for s in stats for e in s["emitted"]] if all("emitted" in s for s in stats) else None
    )
    return acceptance([seq for s in stats for seq in s["accepted"]], k, emitted)


def result_stats(
    accepts: np.ndarray, count: np.ndarray, k: int, compile_s, run_s, drafted=None
) -> dict:
    """``GenerateResult.stats`` from the program's per-step accepted counts [steps, b] and the
    drafts each step's window held [steps, b] (−1 entries: not active; None: k every step)."""
    per_seq = accepts.T.tolist()
    if drafted is None:
        drafted = np.where(accepts >= 0, k, -1)
    per_seq_drafted = np.asarray(drafted).T.tolist()
    live = np.asarray(drafted)[np.asarray(drafted) >= 0]
    steps = (accepts >= 0).sum(axis=0)
    # the prefill emitted one token; a sequence that never ran a verify step emitted no more
    emitted = [int(c) - 1 if n else 0 for c, n in zip(np.asarray(count).tolist(), steps.tolist())]
    summary = acceptance(per_seq, k, emitted)
    return {
        "steps": steps.tolist(),
        "accepted": per_seq,
        "drafted": per_seq_drafted,
        "mean_drafted": float(live.mean()) if live.size else 0.0,
        "emitted": emitted,
        "tau": summary["tau"],
        "tau_per_sequence": summary["tau_per_sequence"],
        "position_acceptance": summary["position_acceptance"],
        "num_draft": k,
        "compile_s": compile_s,
        "run_s": run_s,
        "tokens_per_s": float(count.sum() / run_s) if run_s > 0 else float("nan"),
    }
