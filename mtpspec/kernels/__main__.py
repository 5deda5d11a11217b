"""``python -m mtpspec.kernels``: whether the C++ CPU kernels are built and usable here, each FFI
target's status, this CPU's instruction set and the settings decoding would use. Exit status 0
when the library is available, 1 when it is not (the line says why)."""

from __future__ import annotations

import sys

from mtpspec.kernels import cpu_attention, cpu_gdn, cpu_linear, library, settings


def report() -> tuple[bool, list[str]]:
    """(available, the lines ``python -m mtpspec.kernels`` prints)."""
    ok, why = library.status()
    lines = [f"library: {why}"]
    if not ok:
        lines.append(f"without them: {library.MISSING_COST}")
        return False, lines
    targets = [
        *cpu_linear.LINEAR_KERNELS.values(), *cpu_linear.ARGMAX_KERNELS.values(),
        *cpu_linear.SCREEN_KERNELS.values(), cpu_gdn.KERNEL, cpu_gdn.TREE_KERNEL,
        cpu_gdn.COMMIT_KERNEL, cpu_attention.KERNEL, cpu_attention.TREE_KERNEL,
    ]  # fmt: skip
    for target in targets:
        t_ok, t_why = target.status()
        lines.append(f"  {target.name}: {'ok' if t_ok else t_why}")
    isa = "AVX-512F" if settings.has_avx512() else "AVX2 + FMA (no AVX-512F)"
    lines.append(f"cpu: {isa}")
    lines.append(f"settings: {settings.from_environment()} (MTPSPEC_CPU_* variables)")
    return True, lines


def main() -> int:
    ok, lines = report()
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
