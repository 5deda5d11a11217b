// The `isa` attribute every CPU kernel takes (0: AVX2 + FMA, 1: AVX-512F), checked the same way
// by each: the Python side resolves "auto" with `mtpspec_cpu_linear_avx512()` (cpu_linear.cc) and
// passes one value to all of them (kernels.settings: KernelSettings.isa / MTPSPEC_CPU_LINEAR_ISA).

#ifndef MTPSPEC_KERNELS_ISA_H_
#define MTPSPEC_KERNELS_ISA_H_

#include <cstdint>

extern "C" int mtpspec_cpu_linear_avx512();  // cpu_linear.cc: whether this CPU has AVX-512F

namespace mtpspec {

// nullptr, or what is wrong with `isa` (0 AVX2, 1 AVX-512 on a CPU that has it).
inline const char* BadIsa(int64_t isa) {
  if (isa != 0 && isa != 1) return "isa must be 0 (AVX2) or 1 (AVX-512)";
  if (isa == 1 && !mtpspec_cpu_linear_avx512()) return "this CPU lacks AVX-512F";
  return nullptr;
}

}  // namespace mtpspec

#endif  // MTPSPEC_KERNELS_ISA_H_
