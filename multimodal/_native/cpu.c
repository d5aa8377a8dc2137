#include "cpu.h"

static int allowed = CPU_AVX512;

int cpu_best(void)
{
#ifdef MMGATE_X86
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = CPU_GENERIC;
        if (__builtin_cpu_supports("avx2")) {
            known = CPU_AVX2;
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                __builtin_cpu_supports("avx512vnni"))
                known = CPU_AVX512;
        }
    }
    return known;
#else
    return CPU_GENERIC;
#endif
}

static int level(void)
{
    const int best = cpu_best();
    return allowed < best ? allowed : best;
}

int cpu_has_avx2(void)
{
    return level() >= CPU_AVX2;
}

int cpu_has_avx512(void)
{
    return level() >= CPU_AVX512;
}

int cpu_allow(int wanted)
{
    if (wanted < CPU_GENERIC || wanted > cpu_best())
        return -1;
    allowed = wanted;
    return 0;
}
