"""Offline check of the Pallas GDN kernel's GPU path, with no GPU: Pallas -> Triton IR -> PTX/cubin.

    # 1. with the project's JAX: lower the kernel for CUDA and write its Triton IR (TTIR) files
    .venv/bin/python experiments/investigations/triton_offline.py dump /tmp/gdn_ttir
    # 2. with a separate venv holding the `triton` package (never beside the project's JAX):
    python3 -m venv /tmp/tri && /tmp/tri/bin/pip install triton==3.9.0
    /tmp/tri/bin/python experiments/investigations/triton_offline.py compile /tmp/gdn_ttir \
        [--num_warps=4]

Step 2 compiles each TTIR for sm_90 (Hopper) with the pip Triton's own pipeline and reports the
cubin's resources (registers, stack = spilled/local arrays, shared memory) and whether the float32
products use tensor cores ("mma") or IEEE FMAs. What this shows: the IR that this JAX's Pallas
Triton lowering emits is valid Triton that compiles for Hopper. What it does not show: that the
Triton bundled in the GPU machine's jaxlib (0.11.2) compiles it the same way, or that it runs.
Step 1 imports JAX and mtpspec; step 2 imports only the standard library and triton.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

# (name, t, key_dim, value_dim, chunk, block_v, return_states): realistic heads, bf16 inputs.
CASES = [
    ("prefill_c32_v64", 2048, 128, 128, 32, 64, False),
    ("prefill_c32_v32", 2048, 128, 128, 32, 32, False),
    ("prefill_c64_v64", 2048, 128, 128, 64, 64, False),
    ("prefill_c16_v64", 2048, 128, 128, 16, 64, False),
    ("verify_t9_states", 9, 128, 128, 16, 64, True),
]


def dump(out_dir: pathlib.Path) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository
    import jax
    import jax.numpy as jnp
    from jax._src.pallas.triton import pallas_call_registration as registration

    from mtpspec.ops.gdn import pallas_gpu

    out_dir.mkdir(parents=True, exist_ok=True)
    lower_module = registration.lowering.lower_jaxpr_to_triton_module
    for name, t, dk, dv, chunk, block_v, states in CASES:
        captured = []

        def capture(*args, captured=captured, **kwargs):
            result = lower_module(*args, **kwargs)
            captured.append(result.module.operation.get_asm(enable_debug_info=False))
            return result

        registration.lowering.lower_jaxpr_to_triton_module = capture
        try:
            q = jnp.zeros((1, t, 2, dk), jnp.bfloat16)
            v = jnp.zeros((1, t, 4, dv), jnp.bfloat16)
            g = jnp.zeros((1, t, 4), jnp.float32)
            s0 = jnp.zeros((1, 4, dk, dv), jnp.float32)
            cfg = pallas_gpu.PallasConfig(
                scale=dk**-0.5,
                chunk=pallas_gpu.effective_chunk(t, chunk),
                return_states=states,
                interpret=False,
                block_v=block_v,
            )
            fn = jax.jit(pallas_gpu.gdn_pallas, static_argnums=6)
            fn.trace(q, q, v, g, g, s0, cfg).lower(lowering_platforms=("cuda",))
        finally:
            registration.lowering.lower_jaxpr_to_triton_module = lower_module
        (text,) = captured
        (out_dir / f"{name}.ttir").write_text(text)
        print(f"{name}: {len(text)} chars of TTIR (jax {jax.__version__})")


def compile_all(out_dir: pathlib.Path, num_warps: int) -> None:
    import triton
    from triton.backends.compiler import GPUTarget

    cuobjdump = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    results = {}
    for path in sorted(out_dir.glob("*.ttir")):
        kernel = triton.compile(
            str(path),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": num_warps, "num_stages": 1},
        )
        ptx = kernel.asm["ptx"]
        cubin = path.with_suffix(".cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run(
            [str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True
        ).stdout
        fields = dict(
            item.split(":", 1) for item in usage.split() if item.split(":", 1)[0] in _RES_KEYS
        )
        row = {
            "mma_instructions": sum("mma" in line for line in ptx.splitlines()),
            "fma_f32_instructions": sum("fma.rn.f32" in line for line in ptx.splitlines()),
            "shared_bytes_triton": kernel.metadata.shared,
            **{k.lower(): int(v) for k, v in fields.items()},
        }
        results[path.stem] = row
        print(f"{path.stem}: {row}", flush=True)
    (out_dir / "compile.json").write_text(json.dumps(results, indent=2))
    print(f"triton {triton.__version__}, num_warps {num_warps}; wrote {out_dir / 'compile.json'}")


_RES_KEYS = ("REG", "STACK", "SHARED", "LOCAL")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("dump", "compile"))
    parser.add_argument("dir", type=pathlib.Path)
    parser.add_argument("--num_warps", type=int, default=8, help="Triton warps (compile step).")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    dump(args.dir) if args.step == "dump" else compile_all(args.dir, args.num_warps)


if __name__ == "__main__":
    main()
