/* What the CPU can run: the AVX2 kernels are compiled for x86-64 with GCC/Clang and used only
 * when the CPU reports AVX2 at run time, so the extension runs on any x86-64 (and builds on
 * other architectures, with the portable kernels only; -DMMGATE_PORTABLE builds x86-64 that
 * way too, to test it). */
#ifndef MMGATE_CPU_H
#define MMGATE_CPU_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(MMGATE_PORTABLE)
#define MMGATE_X86 1
#define AVX2 __attribute__((target("avx2")))
#include <immintrin.h>
#endif

/* Whether to use the AVX2 kernels: the CPU has AVX2 and cpu_allow_avx2 did not forbid it. */
int cpu_has_avx2(void);

/* Forbid (0) or allow (1) the AVX2 kernels, e.g. to test the portable ones. Returns 0, or -1
 * when allowing them on a CPU without AVX2. Not thread-safe: tests only. */
int cpu_allow_avx2(int allow);

#endif
