"""Plots of a speculative-decoding sweep (matplotlib, imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtpspec.analysis.model import expected_tau


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
