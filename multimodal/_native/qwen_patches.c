/* Qwen-VL patches from resized rows: the resize delivers rows as channel planes, into a band of
 * patch*merge rows (uint8 rows straight into the band, float32 ones normalized into it); each
 * full band is written out patch after patch, runs of `patch` elements copied, every temporal
 * copy a copy of the first. */
#include "qwen_patches.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define ROW_PAD 64

static int band_rows(const qwen_patches *q)
{
    return q->patch * q->merge;
}

int qwen_patches_open(qwen_patches *q)
{
    q->plane = ((size_t)q->width + 15) / 16 * 16;
    if (q->normalize) { /* rows arrive in `row`, normalized into 3 float planes of the band */
        q->band = malloc((size_t)3 * band_rows(q) * q->width * sizeof(float));
        q->row = malloc(3 * q->plane + ROW_PAD);
    } else { /* rows arrive in the band itself, each as 3 planes */
        q->band = malloc(band_rows(q) * 3 * q->plane + ROW_PAD);
        q->row = NULL;
    }
    return q->band && (q->row || !q->normalize) ? 0 : -1;
}

void qwen_patches_close(qwen_patches *q)
{
    free(q->band);
    free(q->row);
    q->band = q->row = NULL;
}

uint8_t *qwen_patches_target(void *ctx, int y)
{
    const qwen_patches *q = ctx;
    if (q->normalize)
        return q->row;
    return q->band + (size_t)(y % band_rows(q)) * 3 * q->plane;
}

/* ---- normalizing ------------------------------------------------------------------------- */

static void normalize_generic(const uint8_t *values, int from, int n, float mean, float std,
                              float *out)
{
    for (int i = from; i < n; i++)
        out[i] = ((float)values[i] - mean) / std;
}

#ifdef MMGATE_X86
/* 8 values at a time, the same IEEE float32 subtraction and division as the scalar code. */
AVX2 static int normalize_avx2(const uint8_t *values, int n, float mean, float std, float *out)
{
    const __m256 m = _mm256_set1_ps(mean), s = _mm256_set1_ps(std);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)(values + i));
        const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
        _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_sub_ps(x, m), s));
    }
    return i;
}
#endif

void normalize_u8(const uint8_t *values, int n, float mean, float std, float *out)
{
    int done = 0;
#ifdef MMGATE_X86
    if (cpu_has_avx2())
        done = normalize_avx2(values, n, mean, std, out);
#endif
    normalize_generic(values, done, n, mean, std, out);
}

/* ---- a band of planes to patches ---------------------------------------------------------- */

/* Constant sizes for the common runs (patch 14 and 16, uint8 and float32) let the compiler
 * inline the copies. */
static inline void copy_run(uint8_t *to, const uint8_t *from, size_t bytes)
{
    switch (bytes) {
    case 14: memcpy(to, from, 14); break;
    case 16: memcpy(to, from, 16); break;
    case 56: memcpy(to, from, 56); break;
    case 64: memcpy(to, from, 64); break;
    default: memcpy(to, from, bytes);
    }
}

#ifdef MMGATE_X86
/* One channel of one uint8 patch, p <= 16 (used for 16): its p runs of p bytes loaded once (16 bytes each:
 * the band has padding past every plane), stored t times. Within a copy, each 16-byte store's
 * extra bytes land where the next run goes and are overwritten by it; the last run is stored
 * masked, so nothing past the copy is touched. */
AVX512 static inline void patch_u8_avx512(uint8_t *out, const uint8_t *from, size_t row,
                                          const int p, int t)
{
    __m128i runs[16];
    for (int py = 0; py < p; py++)
        runs[py] = _mm_loadu_si128((const __m128i *)(from + py * row));
    const __mmask16 last = (__mmask16)((1u << p) - 1);
    for (int copy = 0; copy < t; copy++, out += p * p) {
        for (int py = 0; py < p - 1; py++)
            _mm_storeu_si128((__m128i *)(out + py * p), runs[py]);
        _mm_mask_storeu_epi8(out + (p - 1) * p, last, runs[p - 1]);
    }
}

/* One channel of one uint8 patch of 14 (196 bytes), in 64-byte stores: its 14 runs loaded as
 * the 16-byte lanes of 4 registers, 3 two-source byte permutations pack them into 3 x 64 bytes
 * (the last 4 bytes copied as they are), stored once per temporal copy. */
AVX512 static inline void patch14_u8_avx512(uint8_t *out, const uint8_t *from, size_t row, int t,
                                            const __m512i idx[3])
{
#define RUN(r) _mm_loadu_si128((const __m128i *)(from + (r) * row))
#define LANES(a, b, c, d)                                                                   \
    _mm512_inserti32x4(                                                                     \
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(a), b, 1), c, 2), d, 3)
    const __m512i A = LANES(RUN(0), RUN(1), RUN(2), RUN(3));
    const __m512i B = LANES(RUN(4), RUN(5), RUN(6), RUN(7));
    const __m512i C = LANES(RUN(8), RUN(9), RUN(10), RUN(11));
    const __m512i D = _mm512_inserti32x4(_mm512_castsi128_si512(RUN(12)), RUN(13), 1);
#undef RUN
#undef LANES
    const __m512i o0 = _mm512_permutex2var_epi8(A, idx[0], B);
    const __m512i o1 = _mm512_permutex2var_epi8(B, idx[1], C);
    const __m512i o2 = _mm512_permutex2var_epi8(C, idx[2], D);
    uint32_t tail;
    memcpy(&tail, from + 13 * row + 10, 4);
    for (int copy = 0; copy < t; copy++, out += 196) {
        _mm512_storeu_si512(out, o0);
        _mm512_storeu_si512(out + 64, o1);
        _mm512_storeu_si512(out + 128, o2);
        memcpy(out + 192, &tail, 4);
    }
}

/* write_band for uint8 patches of 14 or 16 (Qwen2/2.5-VL, Qwen3-VL). */
AVX512 static void write_band_u8_avx512(const qwen_patches *q, int band)
{
    const int p = q->patch, m = q->merge, t = q->temporal, w = q->width;
    const size_t row = 3 * q->plane, plane = (size_t)p * p;
    uint8_t *out = (uint8_t *)q->out + (size_t)band * (w / p) * m * 3 * t * plane;
    /* patch of 14: byte b of 64-byte block k is byte (64k + b) % 14 of run r = (64k + b) / 14,
     * found in lane r % 4 of register r / 4, which is register k or k + 1 */
    uint8_t bytes[3][64];
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < 64; b++) {
            const int at = 64 * k + b, r = at / 14, reg = r / 4;
            bytes[k][b] = (uint8_t)((reg - k) * 64 + (r % 4) * 16 + at % 14);
        }
    const __m512i idx[3] = {_mm512_loadu_si512(bytes[0]), _mm512_loadu_si512(bytes[1]),
                            _mm512_loadu_si512(bytes[2])};
    for (int gx = 0; gx < w / p / m; gx++)
        for (int my = 0; my < m; my++)
            for (int mx = 0; mx < m; mx++) {
                const uint8_t *from = q->band + my * p * row + (size_t)(gx * m + mx) * p;
                for (int c = 0; c < 3; c++, from += q->plane, out += t * plane) {
                    if (p == 14)
                        patch14_u8_avx512(out, from, row, t, idx);
                    else
                        patch_u8_avx512(out, from, row, 16, t);
                }
            }
}
#endif

static void write_band(const qwen_patches *q, int band)
{
#ifdef MMGATE_X86
    if (!q->normalize && (q->patch == 14 || q->patch == 16) && cpu_has_avx512()) {
        write_band_u8_avx512(q, band);
        return;
    }
#endif
    const int p = q->patch, m = q->merge, t = q->temporal, w = q->width;
    const size_t element = q->normalize ? sizeof(float) : 1;
    const size_t run = p * element, plane = p * run;
    /* bytes from a band row to the next, and from a channel's plane to the next */
    const size_t row = q->normalize ? w * element : 3 * q->plane;
    const size_t channel_plane = q->normalize ? band_rows(q) * row : q->plane;
    const size_t patches_per_band = (size_t)(w / p) * m;
    uint8_t *out = (uint8_t *)q->out + band * patches_per_band * 3 * t * plane;
    for (int gx = 0; gx < w / p / m; gx++) {
        for (int my = 0; my < m; my++) {
            for (int mx = 0; mx < m; mx++) {
                const uint8_t *from = q->band + my * p * row + (gx * m + mx) * run;
                for (int c = 0; c < 3; c++, from += channel_plane) {
                    const uint8_t *first = out;
                    for (int py = 0; py < p; py++, out += run)
                        copy_run(out, from + py * row, run);
                    for (int copy = 1; copy < t; copy++, out += plane)
                        memcpy(out, first, plane);
                }
            }
        }
    }
}

void qwen_patches_row(void *ctx, int y, const uint8_t *row)
{
    const qwen_patches *q = ctx;
    const int rows = band_rows(q);
    if (q->normalize) {
        const size_t plane = (size_t)rows * q->width;
        float *at = (float *)q->band + (size_t)(y % rows) * q->width;
        for (int c = 0; c < 3; c++)
            normalize_u8(row + c * q->plane, q->width, q->normalize[c], q->normalize[3 + c],
                      at + c * plane);
    }
    if (y % rows == rows - 1)
        write_band(q, y / rows);
}
