"""transformers' reference for a real-size checkpoint directory (``make_real_size``'s output).

    /path/to/torch-venv/bin/python experiments/real_size_oracle.py DIR [--prompt_len=32 --new=32]

Runs with torch + transformers (5.x) and safetensors only (no mtpspec, no JAX), so it can live in
its own environment (never install triton beside transformers on CPU). The bf16 weights are
widened to float32 and the text model runs in float32 (``Qwen3_5ForCausalLM`` built from the
directory's ``text_config``; ``model.language_model.*`` read as ``model.*``; ``mtp.*`` and any
vision tower ignored, as transformers does). Writes ``DIR/reference.npz``:

  input_ids      [1, P] the prompt (seeded random ids)
  logits         [P, V] float32 logits over the prompt
  greedy         [N] transformers' greedy continuation (generate, cached, do_sample=False)
  greedy_logp    [N] log-softmax of each greedy token under the float32 model

``experiments/bench_real_size.py`` compares mtpspec's own decoding against it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402


def text_state_dict(d: pathlib.Path) -> dict:
    index = d / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    out = {}
    for fn in files:
        with safe_open(str(d / fn), "pt") as f:
            for k in f.keys():
                if k.startswith("mtp.") or k.startswith("model.visual."):
                    continue
                name = k.replace("model.language_model.", "model.", 1)
                out[name] = f.get_tensor(k).to(torch.float32)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("--prompt_len", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = json.loads((a.dir / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    config = transformers.Qwen3_5TextConfig(
        **{k: v for k, v in text.items() if k != "architectures"}
    )
    config._attn_implementation = "eager"
    t0 = time.perf_counter()
    model = transformers.Qwen3_5ForCausalLM(config)  # (its buffers, e.g. rotary, are not weights)
    sd = text_state_dict(a.dir)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(
            f"error: weights do not match the model: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    model.tie_weights()
    model = model.float().eval()
    print(f"loaded in {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(a.seed)
    ids = rng.integers(0, config.vocab_size, (1, a.prompt_len), dtype=np.int64)
    x = torch.from_numpy(ids)
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits[0].float().numpy()
        t0 = time.perf_counter()
        out = model.generate(
            x,
            max_new_tokens=a.new,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
        gen_s = time.perf_counter() - t0
    greedy = out.sequences[0, a.prompt_len :].numpy()
    logp = np.array(
        [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, greedy)]
    )
    np.savez(
        a.dir / "reference.npz",
        input_ids=ids.astype(np.int32),
        logits=logits,
        greedy=greedy.astype(np.int32),
        greedy_logp=logp.astype(np.float32),
    )
    print(
        f"greedy {a.new} tokens in {gen_s:.1f} s ({a.new / gen_s:.2f} tok/s, transformers "
        f"f32); wrote {a.dir / 'reference.npz'}"
    )


if __name__ == "__main__":
    main()
