#include "cpu.h"

static int allowed = 1;

static int cpu_reports_avx2(void)
{
#ifdef MMGATE_X86
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
#else
    return 0;
#endif
}

int cpu_has_avx2(void)
{
    return allowed && cpu_reports_avx2();
}

int cpu_allow_avx2(int allow)
{
    if (allow && !cpu_reports_avx2())
        return -1;
    allowed = allow;
    return 0;
}
