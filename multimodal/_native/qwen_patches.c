/* Qwen-VL patches from resized rows: rows are split into the channel planes of a band of
 * patch*merge rows; each full band is written out patch after patch (uint8 runs copied, or
 * float32 through the per-channel table), every temporal copy a copy of the first. */
#include "qwen_patches.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define ROW_PAD 32

static int band_rows(const qwen_patches *q)
{
    return q->patch * q->merge;
}

int qwen_patches_open(qwen_patches *q)
{
    q->band = malloc((size_t)3 * band_rows(q) * q->width);
    q->row = malloc((size_t)3 * q->width + ROW_PAD);
    return q->band && q->row ? 0 : -1;
}

void qwen_patches_close(qwen_patches *q)
{
    free(q->band);
    free(q->row);
    q->band = NULL;
    q->row = NULL;
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

/* ---- a band of planes to patches ---------------------------------------------------------- */

/* Constant sizes for the common patch sizes let the compiler inline the copies. */
static inline void copy_run(uint8_t *to, const uint8_t *from, int bytes)
{
    switch (bytes) {
    case 14: memcpy(to, from, 14); break;
    case 16: memcpy(to, from, 16); break;
    default: memcpy(to, from, (size_t)bytes);
    }
}

/* One channel of one patch: patch x patch values from the plane, starting at `from`. */
static uint8_t *patch_plane_u8(const qwen_patches *q, const uint8_t *from, uint8_t *out)
{
    const int p = q->patch;
    for (int py = 0; py < p; py++, out += p)
        copy_run(out, from + (size_t)py * q->width, p);
    return out;
}

static uint8_t *patch_plane_f32(const qwen_patches *q, const uint8_t *from, const float *table,
                                uint8_t *out)
{
    const int p = q->patch;
    float *o = (float *)out;
    for (int py = 0; py < p; py++, o += p) {
        const uint8_t *v = from + (size_t)py * q->width;
        for (int px = 0; px < p; px++)
            o[px] = table[v[px]];
    }
    return (uint8_t *)o;
}

static void write_band(const qwen_patches *q, int band)
{
    const int p = q->patch, m = q->merge, t = q->temporal, w = q->width;
    const size_t element = q->table ? sizeof(float) : 1;
    const size_t plane_bytes = (size_t)p * p * element, rows = (size_t)band_rows(q);
    const size_t patches_per_band = (size_t)(w / p) * m;
    uint8_t *out = (uint8_t *)q->out + band * patches_per_band * 3 * t * plane_bytes;
    for (int gx = 0; gx < w / p / m; gx++) {
        for (int my = 0; my < m; my++) {
            for (int mx = 0; mx < m; mx++) {
                const size_t corner = (size_t)my * p * w + (size_t)(gx * m + mx) * p;
                for (int c = 0; c < 3; c++) {
                    const uint8_t *from = q->band + c * rows * w + corner;
                    uint8_t *first = out;
                    out = q->table ? patch_plane_f32(q, from, q->table + 256 * c, out)
                                   : patch_plane_u8(q, from, out);
                    for (int copy = 1; copy < t; copy++, out += plane_bytes)
                        memcpy(out, first, plane_bytes);
                }
            }
        }
    }
}

void qwen_patches_row(void *ctx, int y, const uint8_t *row)
{
    const qwen_patches *q = ctx;
    const int rows = band_rows(q), r = y % rows;
    const size_t plane = (size_t)rows * q->width;
    uint8_t *at = q->band + (size_t)r * q->width;
    split(row, q->width, at, at + plane, at + 2 * plane);
    if (r == rows - 1)
        write_band(q, y / rows);
}
