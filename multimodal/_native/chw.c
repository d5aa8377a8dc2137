/* HWC to CHW, row by row: each row's w pixels of 3 bytes become w bytes in each of 3 planes. */
#include "chw.h"

#include "cpu.h"

static void split_generic(const uint8_t *row, int from, int w, uint8_t *r, uint8_t *g,
                          uint8_t *b)
{
    for (int x = from; x < w; x++) {
        r[x] = row[3 * x];
        g[x] = row[3 * x + 1];
        b[x] = row[3 * x + 2];
    }
}

#ifdef MMGATE_X86
/* 64 pixels a step: their 192 bytes in 3 registers; per channel, one two-source byte
 * permutation gathers the bytes that lie in the first two registers, a one-source permutation
 * those in the third, and a mask picks between them. The rest of a row goes byte by byte. */
AVX512 static void chw_avx512(const uint8_t *src, int h, int w, size_t row_stride, uint8_t *out)
{
    uint8_t index[3][64];
    __mmask64 high[3] = {0, 0, 0}; /* lanes whose byte is in the third register */
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 64; i++) {
            const int at = 3 * i + c;
            index[c][i] = (uint8_t)(at & 127);
            if (at >= 128)
                high[c] |= (__mmask64)1 << i;
        }
    __m512i idx[3];
    for (int c = 0; c < 3; c++)
        idx[c] = _mm512_loadu_si512(index[c]);
    const size_t plane = (size_t)h * w;
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * row_stride;
        uint8_t *planes[3] = {out + (size_t)y * w, out + plane + (size_t)y * w,
                              out + 2 * plane + (size_t)y * w};
        int x = 0;
        for (; x + 64 <= w; x += 64) {
            const uint8_t *p = row + 3 * (size_t)x;
            const __m512i v0 = _mm512_loadu_si512(p), v1 = _mm512_loadu_si512(p + 64),
                          v2 = _mm512_loadu_si512(p + 128);
            for (int c = 0; c < 3; c++) {
                const __m512i low = _mm512_permutex2var_epi8(v0, idx[c], v1);
                _mm512_storeu_si512(planes[c] + x,
                                    _mm512_mask_permutexvar_epi8(low, high[c], idx[c], v2));
            }
        }
        split_generic(row, x, w, planes[0], planes[1], planes[2]);
    }
}
#endif

void chw_planes(const uint8_t *src, int h, int w, size_t row_stride, uint8_t *out)
{
#ifdef MMGATE_X86
    if (cpu_has_avx512()) {
        chw_avx512(src, h, w, row_stride, out);
        return;
    }
#endif
    const size_t plane = (size_t)h * w;
    for (int y = 0; y < h; y++) {
        uint8_t *r = out + (size_t)y * w;
        split_generic(src + (size_t)y * row_stride, 0, w, r, r + plane, r + 2 * plane);
    }
}
