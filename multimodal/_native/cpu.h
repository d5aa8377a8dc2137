/* What the CPU can run: the AVX2 and AVX-512 kernels are compiled for x86-64 with GCC/Clang and
 * used only when the CPU reports the features they use at run time, so the extension runs on any
 * x86-64 (and builds on other architectures, with the portable kernels only; -DMMGATE_PORTABLE
 * builds x86-64 that way too, to test it). */
#ifndef MMGATE_CPU_H
#define MMGATE_CPU_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(MMGATE_PORTABLE)
#define MMGATE_X86 1
#define AVX2 __attribute__((target("avx2")))
/* Exactly what the AVX-512 kernels use; cpu.c checks these same features. */
#define AVX512 __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")))
#include <immintrin.h>
#endif

/* Kernel levels, each including the ones below it. */
enum { CPU_GENERIC = 0, CPU_AVX2 = 1, CPU_AVX512 = 2 };

/* Whether to use the AVX2 kernels: the CPU has AVX2 and cpu_allow did not forbid them. */
int cpu_has_avx2(void);

/* Whether to use the AVX-512 kernels: the CPU has AVX-512 F, BW, VL, VBMI and VNNI, and
 * cpu_allow did not forbid them. */
int cpu_has_avx512(void);

/* The highest level this CPU supports. */
int cpu_best(void);

/* Use kernels up to `level` only, e.g. to test the lower ones. Returns 0, or -1 when the CPU
 * lacks that level. Not thread-safe: tests only. */
int cpu_allow(int level);

#endif
