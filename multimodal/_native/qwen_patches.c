/* Qwen-VL patches from resized rows: rows are split into the channel planes of a band of
 * patch*merge rows (as uint8, or normalized float32); each full band is written out patch
 * after patch, runs of `patch` elements copied, every temporal copy a copy of the first. */
#include "qwen_patches.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define ROW_PAD 32

static int band_rows(const qwen_patches *q)
{
    return q->patch * q->merge;
}

static size_t element(const qwen_patches *q)
{
    return q->normalize ? sizeof(float) : 1;
}

int qwen_patches_open(qwen_patches *q)
{
    q->band = malloc((size_t)3 * band_rows(q) * q->width * element(q));
    q->row = malloc((size_t)3 * q->width + ROW_PAD);
    q->split = malloc((size_t)3 * q->width);
    return q->band && q->row && q->split ? 0 : -1;
}

void qwen_patches_close(qwen_patches *q)
{
    free(q->band);
    free(q->row);
    free(q->split);
    q->band = q->row = q->split = NULL;
}

uint8_t *qwen_patches_target(void *ctx, int y)
{
    (void)y;
    return ((qwen_patches *)ctx)->row;
}

/* ---- RGB rows to planes ------------------------------------------------------------------- */

static void split_generic(const uint8_t *row, int from, int width, uint8_t *r, uint8_t *g,
                          uint8_t *b)
{
    for (int x = from; x < width; x++) {
        r[x] = row[3 * x];
        g[x] = row[3 * x + 1];
        b[x] = row[3 * x + 2];
    }
}

static void normalize_generic(const uint8_t *values, int from, int n, float mean, float std,
                              float *out)
{
    for (int i = from; i < n; i++)
        out[i] = ((float)values[i] - mean) / std;
}

#ifdef MMGATE_X86
/* 16 pixels (48 bytes) at a time: each plane gathers its bytes from the three 16-byte blocks. */
AVX2 static int split_avx2(const uint8_t *row, int width, uint8_t *r, uint8_t *g, uint8_t *b)
{
#define M(...) _mm_setr_epi8(__VA_ARGS__)
    const __m128i r0 = M(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i r1 = M(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    const __m128i r2 = M(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    const __m128i g0 = M(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i g1 = M(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    const __m128i g2 = M(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    const __m128i b0 = M(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b1 = M(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    const __m128i b2 = M(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
#undef M
    int x = 0;
    for (; x + 16 <= width; x += 16) {
        const __m128i p0 = _mm_loadu_si128((const __m128i *)(row + 3 * x));
        const __m128i p1 = _mm_loadu_si128((const __m128i *)(row + 3 * x + 16));
        const __m128i p2 = _mm_loadu_si128((const __m128i *)(row + 3 * x + 32));
#define PLANE(m0, m1, m2)                                                                  \
    _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(p0, m0), _mm_shuffle_epi8(p1, m1)),       \
                 _mm_shuffle_epi8(p2, m2))
        _mm_storeu_si128((__m128i *)(r + x), PLANE(r0, r1, r2));
        _mm_storeu_si128((__m128i *)(g + x), PLANE(g0, g1, g2));
        _mm_storeu_si128((__m128i *)(b + x), PLANE(b0, b1, b2));
#undef PLANE
    }
    return x;
}

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

static void split(const uint8_t *row, int width, uint8_t *r, uint8_t *g, uint8_t *b)
{
    int done = 0;
#ifdef MMGATE_X86
    if (cpu_has_avx2())
        done = split_avx2(row, width, r, g, b);
#endif
    split_generic(row, done, width, r, g, b);
}

static void normalize(const uint8_t *values, int n, float mean, float std, float *out)
{
    int done = 0;
#ifdef MMGATE_X86
    if (cpu_has_avx2())
        done = normalize_avx2(values, n, mean, std, out);
#endif
    normalize_generic(values, done, n, mean, std, out);
}

/* Row r of the band's planes: uint8 as they are, or normalized to float32. */
static void to_band(const qwen_patches *q, const uint8_t *row, int r)
{
    const int w = q->width;
    const size_t plane = (size_t)band_rows(q) * w;
    if (!q->normalize) {
        uint8_t *at = q->band + (size_t)r * w;
        split(row, w, at, at + plane, at + 2 * plane);
        return;
    }
    split(row, w, q->split, q->split + w, q->split + 2 * w);
    float *at = (float *)q->band + (size_t)r * w;
    for (int c = 0; c < 3; c++)
        normalize(q->split + c * w, w, q->normalize[c], q->normalize[3 + c], at + c * plane);
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

static void write_band(const qwen_patches *q, int band)
{
    const int p = q->patch, m = q->merge, t = q->temporal, w = q->width;
    const size_t run = p * element(q), row = w * element(q), plane = p * run;
    const size_t channel_plane = band_rows(q) * row;
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
    to_band(q, row, y % rows);
    if (y % rows == rows - 1)
        write_band(q, y / rows);
}
