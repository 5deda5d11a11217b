"""What opt-in int8 weights change, against a checkpoint's own (stored) weights:
``weights_report`` (the numbers ``experiments/int8_report.py`` prints)."""

from __future__ import annotations

import numpy as np


def weights_report(path, prompts, num_draft=(1, 2, 3), new_tokens: int = 48) -> dict:
    """The checkpoint at ``path`` loaded for decoding twice, stored and ``weights="int8"``:

    bytes           the two DecodingWeights' bytes and their ratio
    kl              KL(stored ‖ int8) of the next-token distributions, nats per position
                    (mean, median, p99), teacher-forced over ``prompts`` (token-id lists, or a
                    function of the checkpoint's config giving them) cut to the shortest
                    one's length, as one batch
    top1_agreement  share of positions where both predict the same next token
    tau             per k in ``num_draft``: MTP acceptance (tokens per verify step) on the
                    prompts' first 64 tokens, stored and int8, and whether int8 speculative
                    greedy emits int8 plain greedy's tokens (``num_draft=()``: none run)
    """
    import jax
    import jax.numpy as jnp

    import mtpspec
    from mtpspec import checkpoints
    from mtpspec.models import state
    from mtpspec.models.decoder import window_step_impl
    from mtpspec.models.inference import compute_config

    # the head as stored, no int8 screen beside it (which greedy_head "auto" adds for a large
    # vocabulary): the bytes compared are the weights'
    config, stored = checkpoints.load(path, for_decoding=True, greedy_head="full")
    if callable(prompts):
        prompts = prompts(config)
    if not prompts or min(len(p) for p in prompts) < 2:
        raise ValueError("weights_report needs prompts of at least 2 tokens")
    _, int8 = checkpoints.load(path, for_decoding=True, weights="int8")
    compute = compute_config(config, stored.linear)

    @jax.jit
    def log_probs(tree, ids):
        b, n = ids.shape
        s = state.init_decode_state(compute, b, n)
        out = window_step_impl(compute, tree, s, ids, jnp.full((b,), n, jnp.int32), "chunk")
        return jax.nn.log_softmax(out.logits, axis=-1)

    n = min(len(p) for p in prompts)  # one batch (one compile per tree)
    ids = jnp.asarray([p[:n] for p in prompts], jnp.int32)
    a = np.asarray(log_probs(stored.tree, ids), np.float64).reshape(-1, config.vocab_size)
    b = np.asarray(log_probs(int8.tree, ids), np.float64).reshape(-1, config.vocab_size)
    kl = (np.exp(a) * (a - b)).sum(-1)
    agree = a.argmax(-1) == b.argmax(-1)
    short = [p[:64] for p in prompts]
    tau = {}
    if num_draft:
        plain8 = mtpspec.generate(config, int8, short, max_new_tokens=new_tokens).tokens
    for k in num_draft:
        spec = mtpspec.SpecConfig(num_draft=k)
        runs = {
            name: mtpspec.generate(config, w, short, max_new_tokens=new_tokens, speculative=spec)
            for name, w in (("stored", stored), ("int8", int8))
        }
        tau[str(k)] = {
            "stored": runs["stored"].stats["tau"],
            "int8": runs["int8"].stats["tau"],
            "int8_spec_equals_plain": runs["int8"].tokens == plain8,
        }
    return {
        "checkpoint": str(path),
        "bytes": {
            "stored": stored.nbytes,
            "int8": int8.nbytes,
            "ratio": int8.nbytes / stored.nbytes,
        },
        "positions": int(kl.size),
        "kl": {
            "mean": float(kl.mean()),
            "median": float(np.median(kl)),
            "p99": float(np.percentile(kl, 99)),
        },
        "top1_agreement": float(agree.mean()),
        "tau": tau,
    }
