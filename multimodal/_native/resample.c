/* Resize kernels: portable C everywhere, AVX2 and AVX-512 on x86-64 CPUs that have them (checked
 * at run time). All compute the same integers: int16 weights times uint8 pixels summed in int32, plus
 * 2**(p-1), arithmetic shift by p, saturation to 0..255. */
#include "resample.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define ROW_PAD 64 /* bytes past every intermediate row: the SIMD loads and stores may touch them */

static inline uint8_t saturate(int32_t value)
{
    return value < 0 ? 0 : value > 255 ? 255 : (uint8_t)value;
}

static inline int32_t rounding(int precision)
{
    return (int32_t)1 << (precision - 1);
}

/* ---- portable kernels --------------------------------------------------------------------- */

static void h_row_generic(const uint8_t *in, uint8_t *out, int w_out, int channels,
                          const axis_plan *plan)
{
    for (int x = 0; x < w_out; x++) {
        const uint8_t *first = in + (size_t)plan->starts[x] * channels;
        const int16_t *w = plan->weights + (size_t)x * plan->stride;
        const int n = plan->sizes[x];
        for (int c = 0; c < channels; c++) {
            int32_t sum = rounding(plan->precision);
            for (int k = 0; k < n; k++)
                sum += w[k] * first[k * channels + c];
            out[x * channels + c] = saturate(sum >> plan->precision);
        }
    }
}

/* An interleaved RGB row to 3 planes, `plane` bytes apart. */
static void split_rgb(const uint8_t *row, int width, uint8_t *out, size_t plane)
{
    uint8_t *r = out, *g = out + plane, *b = out + 2 * plane;
    for (int x = 0; x < width; x++) {
        r[x] = row[3 * x];
        g[x] = row[3 * x + 1];
        b[x] = row[3 * x + 2];
    }
}

#define V_CHUNK 256 /* int32 partial sums per block: they stay in L1, and the loops vectorize */

static void v_row_generic(const uint8_t *const *rows, int n, const int16_t *w, int precision,
                          uint8_t *out, int len)
{
    int32_t sums[V_CHUNK];
    for (int j0 = 0; j0 < len; j0 += V_CHUNK) {
        const int m = len - j0 < V_CHUNK ? len - j0 : V_CHUNK;
        for (int j = 0; j < m; j++)
            sums[j] = rounding(precision);
        for (int k = 0; k < n; k++) {
            const uint8_t *row = rows[k] + j0;
            const int32_t wk = w[k];
            for (int j = 0; j < m; j++)
                sums[j] += wk * row[j];
        }
        for (int j = 0; j < m; j++)
            out[j0 + j] = saturate(sums[j] >> precision);
    }
}

/* ---- AVX2 kernels ------------------------------------------------------------------------- */

#ifdef MMGATE_X86

/* The width pass of 3-channel rows, re-laid for AVX2: output pixels in groups of 4, and for
 * each group 4-tap steps; per step and pixel, 32 bytes of weights (w_k, w_k+1) x 4 in the low
 * lane and (w_k+2, w_k+3) x 4 in the high lane, zero past the pixel's taps. */
typedef struct {
    int groups;           /* groups of 4 outputs */
    int steps;            /* 4-tap steps any group may need: stride / 4, rounded up */
    int32_t *offsets;     /* groups * 4: byte offset of each output's first input pixel */
    int32_t *group_steps; /* the 4-tap steps of each group: its most taps / 4, rounded up */
    __m256i *weights;     /* per group, per step, per output */
} rgb_plan;

/* Bytes rgb_plan kernels may read past the end of a row. */
static size_t rgb_overread(const axis_plan *plan)
{
    return (size_t)12 * ((plan->stride + 3) / 4) + 16;
}

AVX2 static int rgb_plan_open(rgb_plan *rp, const axis_plan *plan, int w_out)
{
    rp->groups = (w_out + 3) / 4;
    rp->steps = (plan->stride + 3) / 4;
    rp->offsets = calloc((size_t)rp->groups * 4, sizeof *rp->offsets);
    rp->group_steps = calloc((size_t)rp->groups, sizeof *rp->group_steps);
    rp->weights = aligned_alloc(32, (size_t)rp->groups * rp->steps * 4 * sizeof(__m256i));
    if (!rp->offsets || !rp->group_steps || !rp->weights)
        return -1;
    __m256i *out = rp->weights;
    for (int g = 0; g < rp->groups; g++) {
        int most = 1;
        for (int i = 0; i < 4 && 4 * g + i < w_out; i++)
            most = plan->sizes[4 * g + i] > most ? plan->sizes[4 * g + i] : most;
        const int steps = (most + 3) / 4;
        rp->group_steps[g] = steps;
        for (int j = 0; j < steps; j++) {
            for (int i = 0; i < 4; i++) {
                const int x = 4 * g + i;
                int16_t w[4] = {0, 0, 0, 0};
                for (int t = 0; x < w_out && t < 4 && 4 * j + t < plan->sizes[x]; t++)
                    w[t] = plan->weights[(size_t)x * plan->stride + 4 * j + t];
                const int32_t lo = (uint16_t)w[0] | (int32_t)((uint32_t)(uint16_t)w[1] << 16);
                const int32_t hi = (uint16_t)w[2] | (int32_t)((uint32_t)(uint16_t)w[3] << 16);
                *out++ = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
            }
        }
        for (int i = 0; i < 4 && 4 * g + i < w_out; i++)
            rp->offsets[4 * g + i] = 3 * plan->starts[4 * g + i];
    }
    return 0;
}

static void rgb_plan_close(rgb_plan *rp)
{
    free(rp->offsets);
    free(rp->group_steps);
    free(rp->weights);
}

/* One row. Per step and output pixel: one 16-byte load of 4 taps' pixels into both lanes, one
 * shuffle spreading (p0, p1) | (p2, p3) to 16-bit channel pairs, one multiply-add: 8 int32
 * (R, G, B, 0 | R, G, B, 0). Then the lanes of 4 outputs are summed, rounded, shifted,
 * saturated and written as 12 bytes (16 stored: rows need 4 bytes of padding). */
AVX2 static void h_row_rgb_avx2(const uint8_t *in, uint8_t *out, const rgb_plan *rp,
                                int precision)
{
    const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1,
                                            -1, 6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1,
                                            -1, -1, -1);
    const __m256i start = _mm256_set1_epi32(rounding(precision));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m128i shift = _mm_cvtsi32_si128(precision);
    const __m256i *w = rp->weights;
    const int32_t *offsets = rp->offsets;
#define TAPS(p) _mm256_shuffle_epi8(_mm256_broadcastsi128_si256( \
        _mm_loadu_si128((const __m128i *)(p))), spread)
    for (int g = 0; g < rp->groups; g++, offsets += 4) {
        const uint8_t *a = in + offsets[0], *b = in + offsets[1];
        const uint8_t *c = in + offsets[2], *d = in + offsets[3];
        __m256i sa = _mm256_madd_epi16(TAPS(a), w[0]);
        __m256i sb = _mm256_madd_epi16(TAPS(b), w[1]);
        __m256i sc = _mm256_madd_epi16(TAPS(c), w[2]);
        __m256i sd = _mm256_madd_epi16(TAPS(d), w[3]);
        w += 4;
        for (int j = 1; j < rp->group_steps[g]; j++, w += 4) {
            sa = _mm256_add_epi32(sa, _mm256_madd_epi16(TAPS(a + 12 * j), w[0]));
            sb = _mm256_add_epi32(sb, _mm256_madd_epi16(TAPS(b + 12 * j), w[1]));
            sc = _mm256_add_epi32(sc, _mm256_madd_epi16(TAPS(c + 12 * j), w[2]));
            sd = _mm256_add_epi32(sd, _mm256_madd_epi16(TAPS(d + 12 * j), w[3]));
        }
        __m256i ab = _mm256_add_epi32(_mm256_permute2x128_si256(sa, sb, 0x20),
                                      _mm256_permute2x128_si256(sa, sb, 0x31));
        __m256i cd = _mm256_add_epi32(_mm256_permute2x128_si256(sc, sd, 0x20),
                                      _mm256_permute2x128_si256(sc, sd, 0x31));
        ab = _mm256_sra_epi32(_mm256_add_epi32(ab, start), shift);
        cd = _mm256_sra_epi32(_mm256_add_epi32(cd, start), shift);
        /* bytes: low lane a, c; high lane b, d (4 each, the 4th channel 0) */
        __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(ab, cd), _mm256_setzero_si256());
        packed = _mm256_permutevar8x32_epi32(packed, order);
        const __m128i pixels = _mm_shuffle_epi8(_mm256_castsi256_si128(packed), compact);
        _mm_storeu_si128((__m128i *)(out + 12 * g), pixels);
    }
#undef TAPS
}

/* 32 bytes of one output row at a time: two input rows' bytes interleaved to 16-bit pairs and
 * multiplied-added by (w_k, w_k+1) into 4 x 8 int32 sums; the packs at the end undo the
 * in-lane interleaving. The last < 32 bytes go through the portable kernel. */
AVX2 static void v_row_avx2(const uint8_t *const *rows, int n, const int16_t *w, int precision,
                            uint8_t *out, int len)
{
    const __m256i zero = _mm256_setzero_si256();
    const __m256i start = _mm256_set1_epi32(rounding(precision));
    const __m128i shift = _mm_cvtsi32_si128(precision);
    int j = 0;
    for (; j + 32 <= len; j += 32) {
        __m256i s0 = start, s1 = start, s2 = start, s3 = start;
        for (int k = 0; k < n; k += 2) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(rows[k] + j));
            const __m256i b = k + 1 < n ? _mm256_loadu_si256((const __m256i *)(rows[k + 1] + j))
                                        : zero;
            int32_t pair;
            memcpy(&pair, w + k, sizeof pair); /* w[k + 1] is 0 past n: stride is even */
            const __m256i wk = _mm256_set1_epi32(pair);
            const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), wk));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), wk));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), wk));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), wk));
        }
        s0 = _mm256_sra_epi32(s0, shift);
        s1 = _mm256_sra_epi32(s1, shift);
        s2 = _mm256_sra_epi32(s2, shift);
        s3 = _mm256_sra_epi32(s3, shift);
        const __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1),
                                                   _mm256_packs_epi32(s2, s3));
        _mm256_storeu_si256((__m256i *)(out + j), packed);
    }
    if (j < len) {
        const uint8_t *tail[64];
        for (int k = 0; k < n; k++)
            tail[k] = rows[k] + j;
        v_row_generic(tail, n, w, precision, out + j, len - j);
    }
}

/* split_rgb 16 pixels (48 bytes, 3 loads) at a time: each plane's 16 bytes are 3 byte shuffles
 * of the loads, or-ed (bytes a shuffle does not take are zeroed by index -1); the last < 16
 * pixels as split_rgb. */
#define SPLIT_AT(c, s, i) (3 * (i) + (c) - 16 * (s) >= 0 && 3 * (i) + (c) - 16 * (s) < 16 \
                               ? 3 * (i) + (c) - 16 * (s)                             \
                               : -1)
#define SPLIT_MASK(c, s)                                                                       \
    {SPLIT_AT(c, s, 0), SPLIT_AT(c, s, 1), SPLIT_AT(c, s, 2), SPLIT_AT(c, s, 3),                \
     SPLIT_AT(c, s, 4), SPLIT_AT(c, s, 5), SPLIT_AT(c, s, 6), SPLIT_AT(c, s, 7),                \
     SPLIT_AT(c, s, 8), SPLIT_AT(c, s, 9), SPLIT_AT(c, s, 10), SPLIT_AT(c, s, 11),              \
     SPLIT_AT(c, s, 12), SPLIT_AT(c, s, 13), SPLIT_AT(c, s, 14), SPLIT_AT(c, s, 15)}
/* [channel][load]: where each of the plane's 16 bytes is in that load */
static const int8_t split_masks[3][3][16] = {
    {SPLIT_MASK(0, 0), SPLIT_MASK(0, 1), SPLIT_MASK(0, 2)},
    {SPLIT_MASK(1, 0), SPLIT_MASK(1, 1), SPLIT_MASK(1, 2)},
    {SPLIT_MASK(2, 0), SPLIT_MASK(2, 1), SPLIT_MASK(2, 2)},
};
#undef SPLIT_AT
#undef SPLIT_MASK

AVX2 static void split_rgb_avx2(const uint8_t *row, int width, uint8_t *out, size_t plane)
{
    __m128i m[3][3];
    for (int c = 0; c < 3; c++)
        for (int s = 0; s < 3; s++)
            m[c][s] = _mm_loadu_si128((const __m128i *)split_masks[c][s]);
    int x = 0;
    for (; x + 16 <= width; x += 16) {
        const __m128i a = _mm_loadu_si128((const __m128i *)(row + 3 * x));
        const __m128i b = _mm_loadu_si128((const __m128i *)(row + 3 * x + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *)(row + 3 * x + 32));
        for (int ch = 0; ch < 3; ch++)
            _mm_storeu_si128((__m128i *)(out + ch * plane + x),
                             _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m[ch][0]),
                                                       _mm_shuffle_epi8(b, m[ch][1])),
                                          _mm_shuffle_epi8(c, m[ch][2])));
    }
    if (x < width) {
        uint8_t *r = out + x, *g = out + plane + x, *b = out + 2 * plane + x;
        for (; x < width; x++, r++, g++, b++) {
            *r = row[3 * x];
            *g = row[3 * x + 1];
            *b = row[3 * x + 2];
        }
    }
}

/* ---- AVX-512 kernels (F, BW, VL, VBMI, VNNI) ---------------------------------------------- */

/* The width pass of 3-channel rows, re-laid for AVX-512: output pixels in groups of 16, their
 * sums in 3 registers of 16 int32, one per channel. Each group reads a window of 128 input bytes
 * from its first pixel's first tap; per channel, a two-source byte permutation (vpermt2b)
 * gathers each pixel's (tap 2j, tap 2j+1) bytes into 16-bit pairs (the odd bytes zeroed by the
 * mask), and vpdpwssd adds their products with the pixel's (w_2j, w_2j+1), the same weights for
 * the 3 channels. The plan stays small (it is read once per row, and must stay in L1): per group
 * the 16 pixels' byte indexes of tap 0 and 1 of the first channel (+1, +2 for the others, +6 per
 * tap pair), and per tap pair the 16 pixels' weights. Past a pixel's taps the indexes may point
 * anywhere in the window, the weights there being 0. At the end two packs saturate the sums to
 * bytes and one byte permutation interleaves the channels into 48 output bytes. Plans whose
 * pixels' taps do not fit a group's window (downscales by more than about 2.2x bicubic, 2.5x
 * bilinear) use the wide layout below (rgbw_plan), or the AVX2 kernel where that does not fit
 * either. */
typedef struct {
    int groups;          /* groups of 16 outputs; 0: this layout does not fit the plan */
    int quads;           /* 1: steps of 4 taps (see h_row_rgb_avx512_quads), 0: tap pairs */
    int scaled;          /* quads: 1 if some weights split by a multiplier other than 256; each
                          * group's vectors then hold its 16 multipliers after the indexes */
    int32_t *windows;    /* groups: byte offset of each group's window in the row */
    int32_t *pairs;      /* groups: steps the group needs (its most taps / 2 or 4, rounded up) */
    __m512i *vectors;    /* per group: the indexes, then the weights of each step */
    size_t in_row;       /* bytes per input row: windows past its end are read masked */
} rgb512_plan;

#define WINDOW 128

static int32_t pair16(int lo, int hi)
{
    return (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
}

/* Whether int16 weight w splits into s8 halves: w = 256 * high + low. */
static int splits(int w)
{
    return w >= -128 * 256 - 128 && w <= 127 * 256 + 127;
}

/* The high half of w split by multiplier m >= 256: floor((w + 128) / m), so that the low half
 * w - m * high is the least >= -128. */
static int high_half(int w, int m)
{
    const int a = w + 128;
    if (m == 256) /* nearly always: divisions by a constant, i.e. shifts */
        return a >= 0 ? a / 256 : -((-a + 255) / 256);
    return a >= 0 ? a / m : -((-a + m - 1) / m);
}

/* Whether w = m * high + low with both halves signed bytes. */
static int splits_by(int w, int m)
{
    const int high = high_half(w, m), low = w - m * high;
    return high >= -128 && high <= 127 && low <= 127;
}

/* The multiplier for output x's weights: 256 if they all split by it, else the least above
 * that they all split by (weights of 32640 and up do not split by 256: 32767 = 258 * 127 + 1);
 * 0 if none up to 511 does. */
static int pixel_multiplier(const axis_plan *plan, int x)
{
    const int16_t *w = plan->weights + (size_t)x * plan->stride;
    for (int m = 256; m < 512; m++) {
        int all = 1;
        for (int k = 0; k < plan->sizes[x] && all; k++)
            all = splits_by(w[k], m);
        if (all)
            return m;
    }
    return 0;
}

static int32_t quad8(const int8_t b[4])
{
    return (int32_t)((uint32_t)(uint8_t)b[0] | (uint32_t)(uint8_t)b[1] << 8 |
                     (uint32_t)(uint8_t)b[2] << 16 | (uint32_t)(uint8_t)b[3] << 24);
}

/* 0, or 1 if the plan does not fit (rp->groups stays 0), or -1 if memory ran out. Steps of 4
 * taps when every output's weights split into s8 halves by some multiplier (256 for nearly
 * all plans), else of 2. */
static int rgb512_plan_open(rgb512_plan *rp, const axis_plan *plan, int w_out, size_t in_row)
{
    if (w_out <= 0)
        return 1;
    /* every weight, those past an output's taps too (0 there, or only more cautious): one
     * branchless pass the compiler vectorizes */
    int quads = 1, scaled = 0;
    for (size_t i = 0; i < (size_t)w_out * plan->stride; i++)
        quads &= splits(plan->weights[i]);
    int *multipliers = NULL;
    if (!quads) { /* weights of 32640 and up: each output its own multiplier */
        multipliers = malloc(sizeof *multipliers * (size_t)w_out);
        if (!multipliers)
            return -1;
        quads = 1;
        for (int x = 0; x < w_out && quads; x++)
            quads = (multipliers[x] = pixel_multiplier(plan, x)) != 0;
        scaled = quads;
    }
    const int taps = quads ? 4 : 2; /* per step */
    const size_t groups = ((size_t)w_out + 15) / 16;
    size_t vectors = 0;
    for (int g = 0; g < (int)groups; g++) {
        const int x0 = 16 * g;
        int most = 1;
        for (int x = x0; x < x0 + 16 && x < w_out; x++) {
            if (3 * ((size_t)plan->starts[x] + plan->sizes[x] - plan->starts[x0]) > WINDOW) {
                free(multipliers);
                return 1;
            }
            most = plan->sizes[x] > most ? plan->sizes[x] : most;
        }
        vectors += 1 + (size_t)scaled + (size_t)(quads + 1) * ((most + taps - 1) / taps);
    }
    rp->windows = calloc(groups, sizeof *rp->windows);
    rp->pairs = calloc(groups, sizeof *rp->pairs);
    rp->vectors = aligned_alloc(64, vectors * 64);
    if (!rp->windows || !rp->pairs || !rp->vectors) {
        free(multipliers);
        return -1;
    }
    int32_t *v = (int32_t *)rp->vectors;
    for (int g = 0; g < (int)groups; g++) {
        const int x0 = 16 * g;
        const int32_t window = 3 * plan->starts[x0];
        int most = 1;
        for (int x = x0; x < x0 + 16 && x < w_out; x++)
            most = plan->sizes[x] > most ? plan->sizes[x] : most;
        const int steps = (most + taps - 1) / taps;
        rp->windows[g] = window;
        rp->pairs[g] = steps;
        for (int i = 0; i < 16; i++, v++) {
            const int x = x0 + i, first = x < w_out ? 3 * plan->starts[x] - window : 0;
            if (quads) {
                const int8_t at[4] = {(int8_t)first, (int8_t)(first + 3), (int8_t)(first + 6),
                                      (int8_t)(first + 9)};
                *v = quad8(at);
            } else {
                *v = pair16(first, first + 3);
            }
        }
        int m[16];
        for (int i = 0; i < 16; i++)
            m[i] = scaled && x0 + i < w_out ? multipliers[x0 + i] : 256;
        if (scaled)
            for (int i = 0; i < 16; i++, v++)
                *v = m[i];
        for (int j = 0; j < steps; j++) {
            int16_t w[16][4] = {{0}};
            for (int i = 0; i < 16; i++)
                for (int t = 0; t < taps && x0 + i < w_out; t++)
                    if (taps * j + t < plan->sizes[x0 + i])
                        w[i][t] = plan->weights[(size_t)(x0 + i) * plan->stride + taps * j + t];
            if (!quads) {
                for (int i = 0; i < 16; i++, v++)
                    *v = pair16(w[i][0], w[i][1]);
                continue;
            }
            int8_t high[16][4], low[16][4];
            for (int i = 0; i < 16; i++)
                for (int t = 0; t < 4; t++) {
                    high[i][t] = (int8_t)high_half(w[i][t], m[i]);
                    low[i][t] = (int8_t)(w[i][t] - m[i] * high[i][t]);
                }
            for (int i = 0; i < 16; i++, v++)
                *v = quad8(high[i]);
            for (int i = 0; i < 16; i++, v++)
                *v = quad8(low[i]);
        }
    }
    free(multipliers);
    rp->in_row = in_row;
    rp->quads = quads;
    rp->scaled = scaled;
    rp->groups = (int)groups;
    return 0;
}

static void rgb512_plan_close(rgb512_plan *rp)
{
    free(rp->windows);
    free(rp->pairs);
    free(rp->vectors);
}

/* Shared by the AVX-512 width kernels below (inlined into each). */
#define AVX512_INLINE AVX512 static inline __attribute__((always_inline))

/* The 128-byte window of a row at `offset`: two loads, masked at the row's end so that nothing
 * past it is read. */
AVX512_INLINE void load_window(const uint8_t *row, size_t offset, size_t in_row, __m512i *lo,
                               __m512i *hi)
{
    const size_t left = in_row - offset;
    if (left >= WINDOW) {
        *lo = _mm512_loadu_si512(row + offset);
        *hi = _mm512_loadu_si512(row + offset + 64);
        return;
    }
    *lo = _mm512_maskz_loadu_epi8(left >= 64 ? ~0ULL : (1ULL << left) - 1, row + offset);
    *hi = _mm512_maskz_loadu_epi8(left > 64 ? (1ULL << (left - 64)) - 1 : 0, row + offset + 64);
}

/* After the packs of store_rgb, 128-bit lane k holds bytes 4k..4k+3 of R, G, B, B: output byte
 * 3i + c is channel c's byte i. */
AVX512_INLINE __m512i rgb_order(void)
{
    uint8_t order_bytes[64] = {0};
    for (int i = 0; i < 16; i++)
        for (int c = 0; c < 3; c++)
            order_bytes[3 * i + c] = (uint8_t)(16 * (i / 4) + 4 * c + i % 4);
    return _mm512_loadu_si512(order_bytes);
}

/* 16 pixels' shifted 32-bit sums per channel to bytes: into 3 planes `plane` bytes apart
 * (negative sums to 0, then an unsigned saturating narrowing), or, with plane 0, as 48
 * interleaved RGB bytes (3 packs, 1 byte permutation, 1 masked store). */
AVX512_INLINE void store_rgb(uint8_t *out, size_t plane, __m512i sr, __m512i sg, __m512i sb,
                             __m512i order)
{
    if (plane) {
        const __m512i zero = _mm512_setzero_si512();
        _mm_storeu_si128((__m128i *)out, _mm512_cvtusepi32_epi8(_mm512_max_epi32(sr, zero)));
        _mm_storeu_si128((__m128i *)(out + plane),
                         _mm512_cvtusepi32_epi8(_mm512_max_epi32(sg, zero)));
        _mm_storeu_si128((__m128i *)(out + 2 * plane),
                         _mm512_cvtusepi32_epi8(_mm512_max_epi32(sb, zero)));
        return;
    }
    const __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(sr, sg),
                                              _mm512_packs_epi32(sb, sb));
    _mm512_mask_storeu_epi8(out, (1ULL << 48) - 1, _mm512_permutexvar_epi8(order, bytes));
}

/* One row: per group, 2 loads of the window (masked at the row's end); per tap pair and channel one byte permutation of
 * the window and one dot product; then 3 shifts, 3 packs, 1 byte permutation, 1 masked store. */
AVX512 static void h_row_rgb_avx512(const uint8_t *in, uint8_t *out, const rgb512_plan *rp,
                                    int precision, size_t plane)
{
    const __m512i order = rgb_order();
    const __m512i start = _mm512_set1_epi32(rounding(precision));
    const __m512i one = _mm512_set1_epi8(1), six = _mm512_set1_epi8(6);
    const __m128i shift = _mm_cvtsi32_si128(precision);
    const __mmask64 even = 0x5555555555555555ULL;
    const __m512i *v = rp->vectors;
    for (int g = 0; g < rp->groups; g++, out += plane ? 16 : 48) {
        __m512i lo, hi;
        load_window(in, (size_t)rp->windows[g], rp->in_row, &lo, &hi);
        __m512i ir = v[0];
        __m512i ig = _mm512_add_epi8(ir, one);
        __m512i ib = _mm512_add_epi8(ig, one);
        __m512i sr = start, sg = start, sb = start;
        v++;
        for (int j = 0; j < rp->pairs[g]; j++, v++) {
            const __m512i w = *v;
            sr = _mm512_dpwssd_epi32(sr, _mm512_maskz_permutex2var_epi8(even, lo, ir, hi), w);
            sg = _mm512_dpwssd_epi32(sg, _mm512_maskz_permutex2var_epi8(even, lo, ig, hi), w);
            sb = _mm512_dpwssd_epi32(sb, _mm512_maskz_permutex2var_epi8(even, lo, ib, hi), w);
            ir = _mm512_add_epi8(ir, six);
            ig = _mm512_add_epi8(ig, six);
            ib = _mm512_add_epi8(ib, six);
        }
        store_rgb(out, plane, _mm512_sra_epi32(sr, shift), _mm512_sra_epi32(sg, shift),
                  _mm512_sra_epi32(sb, shift), order);
    }
}

/* The high sums times their multipliers: 256 (a shift), or each pixel's own (scaled plans). */
AVX512_INLINE __m512i join_high(__m512i high, __m512i multipliers, const int scaled)
{
    return scaled ? _mm512_mullo_epi32(high, multipliers) : _mm512_slli_epi32(high, 8);
}

/* h_row_rgb_avx512 with steps of 4 taps: per step and channel one byte permutation gathers
 * each pixel's 4 tap bytes into its 32-bit lane, and two vpdpbusd add their products with the
 * weights' high and low signed bytes (w = m * high + low, exact: the plan checked every weight
 * splits), into separate sums joined at the end as m * high sum + low sum: half the
 * permutations of the pair kernel for the same number of dot products. m is 256 (a shift) but
 * in plans with weights of 32640 and up, where each pixel has its own (`scaled`, a multiply). */
AVX512_INLINE void h_row_rgb_avx512_quads_n(const uint8_t *in, uint8_t *out,
                                            const rgb512_plan *rp, int precision, size_t plane,
                                            const int scaled)
{
    const __m512i order = rgb_order();
    const __m512i start = _mm512_set1_epi32(rounding(precision));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i one = _mm512_set1_epi8(1), twelve = _mm512_set1_epi8(12);
    const __m128i shift = _mm_cvtsi32_si128(precision);
    const __m512i *v = rp->vectors;
    for (int g = 0; g < rp->groups; g++, out += plane ? 16 : 48) {
        __m512i lo, hi;
        load_window(in, (size_t)rp->windows[g], rp->in_row, &lo, &hi);
        __m512i ir = v[0];
        __m512i ig = _mm512_add_epi8(ir, one);
        __m512i ib = _mm512_add_epi8(ig, one);
        __m512i hr = zero, hg = zero, hb = zero, sr = start, sg = start, sb = start;
        const __m512i mul = scaled ? v[1] : zero;
        v += 1 + scaled;
        for (int j = 0; j < rp->pairs[g]; j++, v += 2) {
            const __m512i high = v[0], low = v[1];
            const __m512i pr = _mm512_permutex2var_epi8(lo, ir, hi);
            const __m512i pg = _mm512_permutex2var_epi8(lo, ig, hi);
            const __m512i pb = _mm512_permutex2var_epi8(lo, ib, hi);
            hr = _mm512_dpbusd_epi32(hr, pr, high);
            sr = _mm512_dpbusd_epi32(sr, pr, low);
            hg = _mm512_dpbusd_epi32(hg, pg, high);
            sg = _mm512_dpbusd_epi32(sg, pg, low);
            hb = _mm512_dpbusd_epi32(hb, pb, high);
            sb = _mm512_dpbusd_epi32(sb, pb, low);
            ir = _mm512_add_epi8(ir, twelve);
            ig = _mm512_add_epi8(ig, twelve);
            ib = _mm512_add_epi8(ib, twelve);
        }
        sr = _mm512_sra_epi32(_mm512_add_epi32(sr, join_high(hr, mul, scaled)), shift);
        sg = _mm512_sra_epi32(_mm512_add_epi32(sg, join_high(hg, mul, scaled)), shift);
        sb = _mm512_sra_epi32(_mm512_add_epi32(sb, join_high(hb, mul, scaled)), shift);
        store_rgb(out, plane, sr, sg, sb, order);
    }
}

AVX512 static void h_row_rgb_avx512_quads(const uint8_t *in, uint8_t *out, const rgb512_plan *rp,
                                          int precision, size_t plane)
{
    if (rp->scaled)
        h_row_rgb_avx512_quads_n(in, out, rp, precision, plane, 1);
    else
        h_row_rgb_avx512_quads_n(in, out, rp, precision, plane, 0);
}

/* Rows this far below the two being resampled are prefetched meanwhile (`ahead`, and the row
 * after it), a cache line per group each; not for images of at most PREFETCH_ABOVE bytes (about
 * an L2 cache: measured, the prefetches only cost there, 20 us at 640x480). */
#define PREFETCH_ROWS 4
#define PREFETCH_ABOVE ((size_t)1 << 20)

/* h_row_rgb_avx512_quads on two rows at once, planar output only: the plan's vectors, the
 * index steps and the loop are shared by both rows. */
AVX512_INLINE void h_rows2_rgb_avx512_quads_n(const uint8_t *in0, const uint8_t *in1,
                                              uint8_t *out0, uint8_t *out1,
                                              const rgb512_plan *rp, int precision, size_t plane,
                                              const uint8_t *ahead, const int scaled)
{
    /* sums biased by -128 << precision: each shifted sum is its byte - 128, narrowed with
     * signed saturation (no clamp at 0 first), the bias undone on the 16 bytes */
    const __m512i start = _mm512_set1_epi32(rounding(precision) - (int32_t)(128u << precision));
    const __m128i flip = _mm_set1_epi8((char)0x80);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i one = _mm512_set1_epi8(1), twelve = _mm512_set1_epi8(12);
    const __m128i shift = _mm_cvtsi32_si128(precision);
    const __m512i *v = rp->vectors;
    for (int g = 0; g < rp->groups; g++, out0 += 16, out1 += 16) {
        __m512i lo0, hi0, lo1, hi1;
        load_window(in0, (size_t)rp->windows[g], rp->in_row, &lo0, &hi0);
        load_window(in1, (size_t)rp->windows[g], rp->in_row, &lo1, &hi1);
        if (ahead) {
            _mm_prefetch((const char *)ahead + rp->windows[g] + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)ahead + rp->in_row + rp->windows[g] + 64, _MM_HINT_T0);
        }
        __m512i ir = v[0];
        __m512i ig = _mm512_add_epi8(ir, one);
        __m512i ib = _mm512_add_epi8(ig, one);
        __m512i hr0 = zero, hg0 = zero, hb0 = zero, sr0 = start, sg0 = start, sb0 = start;
        __m512i hr1 = zero, hg1 = zero, hb1 = zero, sr1 = start, sg1 = start, sb1 = start;
        const __m512i mul = scaled ? v[1] : zero;
        v += 1 + scaled;
        for (int j = 0; j < rp->pairs[g]; j++, v += 2) {
            if (j) { /* the next 4 taps, 12 bytes on (not after the last step) */
                ir = _mm512_add_epi8(ir, twelve);
                ig = _mm512_add_epi8(ig, twelve);
                ib = _mm512_add_epi8(ib, twelve);
            }
            const __m512i high = v[0], low = v[1];
            __m512i p = _mm512_permutex2var_epi8(lo0, ir, hi0);
            hr0 = _mm512_dpbusd_epi32(hr0, p, high);
            sr0 = _mm512_dpbusd_epi32(sr0, p, low);
            p = _mm512_permutex2var_epi8(lo1, ir, hi1);
            hr1 = _mm512_dpbusd_epi32(hr1, p, high);
            sr1 = _mm512_dpbusd_epi32(sr1, p, low);
            p = _mm512_permutex2var_epi8(lo0, ig, hi0);
            hg0 = _mm512_dpbusd_epi32(hg0, p, high);
            sg0 = _mm512_dpbusd_epi32(sg0, p, low);
            p = _mm512_permutex2var_epi8(lo1, ig, hi1);
            hg1 = _mm512_dpbusd_epi32(hg1, p, high);
            sg1 = _mm512_dpbusd_epi32(sg1, p, low);
            p = _mm512_permutex2var_epi8(lo0, ib, hi0);
            hb0 = _mm512_dpbusd_epi32(hb0, p, high);
            sb0 = _mm512_dpbusd_epi32(sb0, p, low);
            p = _mm512_permutex2var_epi8(lo1, ib, hi1);
            hb1 = _mm512_dpbusd_epi32(hb1, p, high);
            sb1 = _mm512_dpbusd_epi32(sb1, p, low);
        }
#define STORE(to, h, s)                                                                      \
    _mm_storeu_si128((__m128i *)(to),                                                         \
                     _mm_xor_si128(_mm512_cvtsepi32_epi8(_mm512_sra_epi32(                     \
                                       _mm512_add_epi32(s, join_high(h, mul, scaled)), shift)), \
                                   flip))
        STORE(out0, hr0, sr0);
        STORE(out0 + plane, hg0, sg0);
        STORE(out0 + 2 * plane, hb0, sb0);
        STORE(out1, hr1, sr1);
        STORE(out1 + plane, hg1, sg1);
        STORE(out1 + 2 * plane, hb1, sb1);
#undef STORE
    }
}

AVX512 static void h_rows2_rgb_avx512_quads(const uint8_t *in0, const uint8_t *in1, uint8_t *out0,
                                            uint8_t *out1, const rgb512_plan *rp, int precision,
                                            size_t plane, const uint8_t *ahead)
{
    if (rp->scaled)
        h_rows2_rgb_avx512_quads_n(in0, in1, out0, out1, rp, precision, plane, ahead, 1);
    else
        h_rows2_rgb_avx512_quads_n(in0, in1, out0, out1, rp, precision, plane, ahead, 0);
}

/* ---- AVX-512 width pass for downscales beyond the 128-byte window ------------------------- */

/* Downscales of more than about 2.2x (bicubic) spread a group's taps over more than the 128
 * interleaved bytes (42 pixels) one two-source byte permutation reads from. This layout first
 * splits the row into 3 channel planes (split_rgb_avx512), so that 128 bytes hold 128 pixels of
 * one channel, and slides each group's window along the taps: step j reads the 128 bytes from
 * the group's first pixel's first tap + 4 * lanes * j, so the byte indexes are the same at every
 * step and the window only has to cover the spread of the group's first taps plus one step.
 * Each output pixel has `lanes` 32-bit lanes (1, 2 or 4: the fewest that fit), each of 4 taps a
 * step, so a group has 16 / lanes outputs, output i in lanes i, i + 16 / lanes, ...; fewer
 * outputs per group spread less: 1 lane fits downscales to about 8x, 2 to about 17x, 4 to about
 * 30x. Per step and channel: 2 loads, 1 permutation (shared indexes), 2 vpdpbusd with the
 * weights' high and low signed-byte halves as in h_row_rgb_avx512_quads; the loop is bound by
 * the permutations and dot products (here 1 a cycle, together). At the end the high sums are
 * joined to the low ones (the rounding term started each output's first lane), the lanes of each
 * output added up (folding the register in halves) and the sums shifted, saturated and stored,
 * planar or interleaved. Plans whose
 * weights do not all split into signed-byte halves, or whose groups do not fit even with 4 lanes
 * (downscales by more than about 30x), use the AVX2 kernel. Within the old layout's reach this one
 * is slower (measured 450 against 525 us at 1280x960 -> 644x476: the split costs), so it only
 * takes the plans that do not fit there. */
typedef struct {
    int groups;        /* groups of 16 / lanes outputs; 0: this layout is not in use */
    int lanes;         /* 32-bit lanes per output, 4 taps each a step */
    int scaled;        /* as in rgb512_plan: some output's multiplier is not 256 */
    int slide;         /* 1: some group's taps reach past its window at step 0, so the windows
                        * move along; 0: each group's window is loaded once */
    int w_in;          /* pixels per input row */
    int32_t *firsts;   /* groups: the pixel each group's window starts at in step 0 */
    int32_t *steps;    /* groups: steps of 4 * lanes taps the group needs */
    __m512i *vectors;  /* per group: the byte indexes, the multipliers if scaled, then per step
                        * the high and the low halves of the weights (0 past an output's taps) */
    uint8_t *planes;   /* the row being resampled as 3 planes `plane` bytes apart; windows read
                        * up to 127 bytes past w_in (with weight 0), into the plane's padding */
    size_t plane;
} rgbw_plan;

/* 0, or 1 if the plan does not fit (rp->groups stays 0), or -1 if memory ran out. */
static int rgbw_plan_open(rgbw_plan *rp, const axis_plan *plan, int w_out, int w_in)
{
    if (w_out <= 0)
        return 1;
    int *multipliers = malloc(sizeof *multipliers * (size_t)w_out);
    if (!multipliers)
        return -1;
    /* nearly always every weight splits by 256 (one branchless pass, as in rgb512_plan_open);
     * else each output its own multiplier */
    int all256 = 1, scaled = 0;
    for (size_t i = 0; i < (size_t)w_out * plan->stride; i++)
        all256 &= splits(plan->weights[i]);
    for (int x = 0; x < w_out; x++) {
        multipliers[x] = all256 ? 256 : pixel_multiplier(plan, x);
        if (!multipliers[x]) {
            free(multipliers);
            return 1;
        }
        scaled |= multipliers[x] != 256;
    }
    /* The lanes per output: of 1, 2 and 4, those with which every group's window holds its last
     * output's first step (its first tap's pixel + 4 * lanes <= the group's first pixel +
     * WINDOW), the one of least estimated cost, in halves of a cycle: 18 a step (3 permutations
     * and 6 dot products), 9 more when windows move (6 more loads), and per group 28, 40 or 52
     * to finish 1, 2 or 4 lanes. Measured, against the fewest lanes that fit: 2000 -> 270
     * bicubic 1 lane moving 338-345 us, 2 fixed 308-310; 3000 -> 200 bicubic 2 moving 513-523,
     * 4 fixed 479-481; and the other way round for their bilinear (fewer taps, so more of the
     * wider steps go unused): 1 lane 166, 2 lanes 217. */
    int lanes = 0, slide = 0;
    long best = 0;
    for (int l = 1; l <= 4; l *= 2) {
        const int n = 16 / l;
        int fits = 1, moves = 0;
        long steps = 0;
        for (int x0 = 0; x0 < w_out && fits; x0 += n) {
            const int last = x0 + n - 1 < w_out ? x0 + n - 1 : w_out - 1;
            int most = 1;
            for (int x = x0; x <= last; x++) {
                most = plan->sizes[x] > most ? plan->sizes[x] : most;
                /* a window loaded once must hold every tap of weight other than 0 (the indexes
                 * of the others may wrap around it) */
                moves |= plan->starts[x] - plan->starts[x0] + plan->sizes[x] > WINDOW;
            }
            fits = plan->starts[last] - plan->starts[x0] + 4 * l <= WINDOW;
            steps += (most + 4 * l - 1) / (4 * l);
        }
        const long cost =
            steps * (18 + 9 * moves) + (long)((w_out + n - 1) / n) * (l == 1 ? 28 : l == 2 ? 40 : 52);
        if (fits && (!lanes || cost < best)) {
            lanes = l;
            slide = moves;
            best = cost;
        }
    }
    if (!lanes) {
        free(multipliers);
        return 1;
    }
    const int n = 16 / lanes, taps = 4 * lanes; /* outputs per group, taps per step */
    const int groups = (w_out + n - 1) / n;
    size_t vectors = 0;
    for (int x0 = 0; x0 < w_out; x0 += n) {
        int most = 1;
        for (int x = x0; x < x0 + n && x < w_out; x++)
            most = plan->sizes[x] > most ? plan->sizes[x] : most;
        vectors += 1 + (size_t)scaled + 2 * (size_t)((most + taps - 1) / taps);
    }
    rp->plane = ((size_t)w_in + 63) / 64 * 64 + WINDOW;
    rp->firsts = calloc((size_t)groups, sizeof *rp->firsts);
    rp->steps = calloc((size_t)groups, sizeof *rp->steps);
    rp->vectors = aligned_alloc(64, vectors * 64);
    rp->planes = aligned_alloc(64, 3 * rp->plane);
    if (!rp->firsts || !rp->steps || !rp->vectors || !rp->planes) {
        free(multipliers);
        return -1;
    }
    memset(rp->planes, 0, 3 * rp->plane);
    uint8_t *v = (uint8_t *)rp->vectors;
    for (int g = 0; g < groups; g++) {
        const int x0 = n * g;
        int most = 1;
        for (int x = x0; x < x0 + n && x < w_out; x++)
            most = plan->sizes[x] > most ? plan->sizes[x] : most;
        const int steps = (most + taps - 1) / taps;
        rp->firsts[g] = plan->starts[x0];
        rp->steps[g] = steps;
        /* lane k: output x0 + k % n, its taps 4 * (k / n) .. + 3 of each step */
        for (int k = 0; k < 16; k++) {
            const int x = x0 + k % n;
            const int first = (x < w_out ? plan->starts[x] - plan->starts[x0] : 0) + 4 * (k / n);
            for (int t = 0; t < 4; t++)
                *v++ = (uint8_t)(first + t);
        }
        if (scaled)
            for (int k = 0; k < 16; k++, v += 4) {
                const int32_t m = x0 + k % n < w_out ? multipliers[x0 + k % n] : 256;
                memcpy(v, &m, 4);
            }
        for (int j = 0; j < steps; j++, v += 128) {
            for (int k = 0; k < 16; k++)
                for (int t = 0; t < 4; t++) {
                    const int x = x0 + k % n, tap = taps * j + 4 * (k / n) + t;
                    const int w = x < w_out && tap < plan->sizes[x]
                                      ? plan->weights[(size_t)x * plan->stride + tap]
                                      : 0;
                    const int m = x < w_out ? multipliers[x] : 256, high = high_half(w, m);
                    v[4 * k + t] = (uint8_t)(int8_t)high;
                    v[64 + 4 * k + t] = (uint8_t)(int8_t)(w - m * high);
                }
        }
    }
    free(multipliers);
    rp->w_in = w_in;
    rp->lanes = lanes;
    rp->scaled = scaled;
    rp->slide = slide;
    rp->groups = groups;
    return 0;
}

static void rgbw_plan_close(rgbw_plan *rp)
{
    free(rp->firsts);
    free(rp->steps);
    free(rp->vectors);
    free(rp->planes);
}

/* An interleaved RGB row of `width` pixels to 3 planes `plane` bytes apart, 64 pixels (192
 * bytes, 3 loads) at a time: per plane a two-source byte permutation takes the bytes within the
 * first 128, a masked one-source one the rest from the last 64 (the same indexes: 3i + c, whose
 * low 7 bits, or 6 bits past 127, are what each reads). The last < 64 pixels are loaded and
 * stored masked: nothing past the row is read, nothing past `width` written (split_rgb's
 * contract: a plane's last bytes may be the next plane's first).
 * `ahead` (a row WIDE_PREFETCH_ROWS below, in images above PREFETCH_ABOVE bytes) its bytes are
 * prefetched meanwhile into L2: measured, 10-15% off the width pass of 3840x2160 images (the
 * hardware prefetchers alone stall it at each page); into L1, or further ahead, less. */
#define WIDE_PREFETCH_ROWS 2
#define THIRDS4(i) 3 * (i), 3 * (i) + 3, 3 * (i) + 6, 3 * (i) + 9
#define THIRDS16(i) THIRDS4(i), THIRDS4(i + 4), THIRDS4(i + 8), THIRDS4(i + 12)
static const uint8_t thirds[64] = {THIRDS16(0), THIRDS16(16), THIRDS16(32), THIRDS16(48)};
#undef THIRDS4
#undef THIRDS16

AVX512_INLINE void split_rgb_avx512(const uint8_t *row, int width, uint8_t *out, size_t plane,
                                    const uint8_t *ahead)
{
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i ir = _mm512_loadu_si512(thirds), ig = _mm512_add_epi8(ir, one),
                  ib = _mm512_add_epi8(ig, one);
    /* pixels whose byte is in the last 64: 3i + c >= 128 */
    const __mmask64 past_r = ~0ULL << 43, past_g = ~0ULL << 43, past_b = ~0ULL << 42;
    for (int x = 0; x < width; x += 64, row += 192, out += 64) {
        if (ahead) {
            _mm_prefetch((const char *)ahead + 3 * x, _MM_HINT_T1);
            _mm_prefetch((const char *)ahead + 3 * x + 64, _MM_HINT_T1);
            _mm_prefetch((const char *)ahead + 3 * x + 128, _MM_HINT_T1);
        }
#define PLANE(a, b, c, i, past) \
    _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(a, i, b), past, i, c)
        if (width - x >= 64) {
            const __m512i a = _mm512_loadu_si512(row), b = _mm512_loadu_si512(row + 64),
                          c = _mm512_loadu_si512(row + 128);
            _mm512_storeu_si512(out, PLANE(a, b, c, ir, past_r));
            _mm512_storeu_si512(out + plane, PLANE(a, b, c, ig, past_g));
            _mm512_storeu_si512(out + 2 * plane, PLANE(a, b, c, ib, past_b));
            continue;
        }
        const int left = 3 * (width - x); /* < 192 bytes */
        const __mmask64 all = ~0ULL, pixels = (1ULL << (width - x)) - 1;
        const __m512i a = _mm512_maskz_loadu_epi8(left >= 64 ? all : (1ULL << left) - 1, row);
        const __m512i b = _mm512_maskz_loadu_epi8(
            left >= 128 ? all : left > 64 ? (1ULL << (left - 64)) - 1 : 0, row + 64);
        const __m512i c = _mm512_maskz_loadu_epi8(left > 128 ? (1ULL << (left - 128)) - 1 : 0,
                                                  row + 128);
        _mm512_mask_storeu_epi8(out, pixels, PLANE(a, b, c, ir, past_r));
        _mm512_mask_storeu_epi8(out + plane, pixels, PLANE(a, b, c, ig, past_g));
        _mm512_mask_storeu_epi8(out + 2 * plane, pixels, PLANE(a, b, c, ib, past_b));
#undef PLANE
    }
}

/* split_rgb with AVX-512, for the rows that other kernels (or none) resample. */
AVX512 static void split_rgb_avx512_row(const uint8_t *row, int width, uint8_t *out,
                                        size_t plane)
{
    split_rgb_avx512(row, width, out, plane, NULL);
}

/* The sums of an output's lanes (i, i + 16 / lanes, ...) into lane i: the register folded in
 * halves, then quarters. */
AVX512_INLINE __m512i fold_lanes(__m512i s, const int lanes)
{
    if (lanes >= 2) /* 256-bit halves swapped */
        s = _mm512_add_epi32(s, _mm512_shuffle_i64x2(s, s, _MM_SHUFFLE(1, 0, 3, 2)));
    if (lanes >= 4) /* 128-bit quarters swapped in pairs */
        s = _mm512_add_epi32(s, _mm512_shuffle_i64x2(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    return s;
}

/* acc = _mm512_dpbusd_epi32(acc, p, w), written out: GCC otherwise copies every accumulator to
 * another register each step. KEEP(x) keeps x in a register: GCC otherwise reloads the weights
 * for each of their 3 uses (as memory operands); the loads, not the arithmetic, then bound the
 * loop. */
#define DPBUSD(acc, p, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(p), "v"(w))
#define KEEP(x) __asm__("" : "+v"(x))
AVX512_INLINE void h_row_rgb_wide_n(const uint8_t *in, uint8_t *out, const rgbw_plan *rp,
                                    int precision, size_t plane, const uint8_t *ahead,
                                    const int lanes, const int scaled, const int slide)
{
    const int n = 16 / lanes; /* outputs per group */
    const __m512i advance = _mm512_set1_epi8((char)(4 * lanes));
    split_rgb_avx512(in, rp->w_in, rp->planes, rp->plane, ahead);
    const uint8_t *r = rp->planes, *gr = r + rp->plane, *b = gr + rp->plane;
    /* the rounding term, in each output's first lane only (the lanes are added up at the end) */
    const __m512i start = _mm512_maskz_set1_epi32((__mmask16)((1u << n) - 1), rounding(precision));
    const __m512i zero = _mm512_setzero_si512();
    const __m128i shift = _mm_cvtsi32_si128(precision);
    /* interleaved output: byte 3i + c is byte i of channel c, in 128-bit lane c */
    uint8_t order_bytes[64] = {0};
    for (int i = 0; i < n; i++)
        for (int c = 0; c < 3; c++)
            order_bytes[3 * i + c] = (uint8_t)(16 * c + i);
    const __m512i order = _mm512_loadu_si512(order_bytes);
    const __m512i pack_order = rgb_order();
    const __mmask64 row_bytes = (1ULL << (3 * n)) - 1;
    const __mmask16 plane_bytes = (__mmask16)((1u << n) - 1);
    const __m512i *v = rp->vectors;
    for (int g = 0; g < rp->groups; g++, out += plane ? n : 3 * n) {
        const __m512i idx = v[0];
        const __m512i mul = scaled ? v[1] : zero;
        v += 1 + scaled;
        __m512i hr = zero, hg = zero, hb = zero, sr = start, sg = start, sb = start;
        const uint8_t *at = r + rp->firsts[g];
        if (slide) { /* the window moves along, the indexes stay */
            for (int j = 0; j < rp->steps[g]; j++, v += 2, at += 4 * lanes) {
                __m512i high = v[0], low = v[1];
                KEEP(high);
                KEEP(low);
                __m512i p = _mm512_permutex2var_epi8(_mm512_loadu_si512(at), idx,
                                                     _mm512_loadu_si512(at + 64));
                DPBUSD(hr, p, high);
                DPBUSD(sr, p, low);
                p = _mm512_permutex2var_epi8(_mm512_loadu_si512(at + (gr - r)), idx,
                                             _mm512_loadu_si512(at + (gr - r) + 64));
                DPBUSD(hg, p, high);
                DPBUSD(sg, p, low);
                p = _mm512_permutex2var_epi8(_mm512_loadu_si512(at + (b - r)), idx,
                                             _mm512_loadu_si512(at + (b - r) + 64));
                DPBUSD(hb, p, high);
                DPBUSD(sb, p, low);
            }
        } else { /* the window holds every step: loaded once, the indexes move along */
            const __m512i rlo = _mm512_loadu_si512(at), rhi = _mm512_loadu_si512(at + 64);
            const __m512i glo = _mm512_loadu_si512(at + (gr - r)),
                          ghi = _mm512_loadu_si512(at + (gr - r) + 64);
            const __m512i blo = _mm512_loadu_si512(at + (b - r)),
                          bhi = _mm512_loadu_si512(at + (b - r) + 64);
            __m512i i = idx;
            for (int j = 0; j < rp->steps[g]; j++, v += 2, i = _mm512_add_epi8(i, advance)) {
                __m512i high = v[0], low = v[1];
                KEEP(high);
                KEEP(low);
                __m512i p = _mm512_permutex2var_epi8(rlo, i, rhi);
                DPBUSD(hr, p, high);
                DPBUSD(sr, p, low);
                p = _mm512_permutex2var_epi8(glo, i, ghi);
                DPBUSD(hg, p, high);
                DPBUSD(sg, p, low);
                p = _mm512_permutex2var_epi8(blo, i, bhi);
                DPBUSD(hb, p, high);
                DPBUSD(sb, p, low);
            }
        }
        /* the high sums joined, each output's lanes added up, shifted */
#define FINISH(h, s)                                                                      \
    _mm512_sra_epi32(fold_lanes(_mm512_add_epi32(s, join_high(h, mul, scaled)), lanes), shift)
        sr = FINISH(hr, sr);
        sg = FINISH(hg, sg);
        sb = FINISH(hb, sb);
#undef FINISH
        if (n == 16 && !plane) { /* as store_rgb, its 16 bytes too many land in the row's padding
                                  * or are overwritten by the next group */
            const __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(sr, sg),
                                                      _mm512_packs_epi32(sb, sb));
            _mm512_storeu_si512(out, _mm512_permutexvar_epi8(pack_order, bytes));
            continue;
        }
        const __m128i br = _mm512_cvtusepi32_epi8(_mm512_max_epi32(sr, zero));
        const __m128i bg = _mm512_cvtusepi32_epi8(_mm512_max_epi32(sg, zero));
        const __m128i bb = _mm512_cvtusepi32_epi8(_mm512_max_epi32(sb, zero));
        if (plane && n == 16) {
            _mm_storeu_si128((__m128i *)out, br);
            _mm_storeu_si128((__m128i *)(out + plane), bg);
            _mm_storeu_si128((__m128i *)(out + 2 * plane), bb);
        } else if (plane) { /* masked: a plane's last group may end past the plane */
            _mm_mask_storeu_epi8(out, plane_bytes, br);
            _mm_mask_storeu_epi8(out + plane, plane_bytes, bg);
            _mm_mask_storeu_epi8(out + 2 * plane, plane_bytes, bb);
        } else {
            const __m512i all = _mm512_inserti32x4(
                _mm512_inserti32x4(_mm512_castsi128_si512(br), bg, 1), bb, 2);
            _mm512_mask_storeu_epi8(out, row_bytes, _mm512_permutexvar_epi8(order, all));
        }
    }
}

AVX512 static void h_row_rgb_wide(const uint8_t *in, uint8_t *out, const rgbw_plan *rp,
                                  int precision, size_t plane, const uint8_t *ahead)
{
#define CASE(l)                                                                         \
    if (rp->lanes == (l)) {                                                             \
        if (rp->scaled)                                                                 \
            h_row_rgb_wide_n(in, out, rp, precision, plane, ahead, l, 1, rp->slide);           \
        else if (rp->slide)                                                             \
            h_row_rgb_wide_n(in, out, rp, precision, plane, ahead, l, 0, 1);                   \
        else                                                                            \
            h_row_rgb_wide_n(in, out, rp, precision, plane, ahead, l, 0, 0);                   \
        return;                                                                         \
    }
    CASE(1)
    CASE(2)
    CASE(4)
#undef CASE
}

/* The height pass as v_row_avx2, 64 bytes at a time, the last < 64 loaded and stored masked.
 * Inlined with a constant n for the common tap counts: the loop over taps unrolled, its row
 * pointers and weight pairs kept in registers. */
AVX512 static inline __attribute__((always_inline)) void
v_row_avx512_n(const uint8_t *const *rows, const int n, const int16_t *w, int precision,
               uint8_t *out, int len)
{
    const __m512i zero = _mm512_setzero_si512();
    const __m512i start = _mm512_set1_epi32(rounding(precision));
    const __m128i shift = _mm_cvtsi32_si128(precision);
    int j = 0;
    for (; j + 64 <= len; j += 64) {
        __m512i s0 = start, s1 = start, s2 = start, s3 = start;
        for (int k = 0; k < n; k += 2) {
            const __m512i a = _mm512_loadu_si512(rows[k] + j);
            const __m512i b = k + 1 < n ? _mm512_loadu_si512(rows[k + 1] + j) : zero;
            int32_t pair;
            memcpy(&pair, w + k, sizeof pair); /* w[k + 1] is 0 past n: stride is even */
            const __m512i wk = _mm512_set1_epi32(pair);
            const __m512i lo = _mm512_unpacklo_epi8(a, b), hi = _mm512_unpackhi_epi8(a, b);
            s0 = _mm512_dpwssd_epi32(s0, _mm512_unpacklo_epi8(lo, zero), wk);
            s1 = _mm512_dpwssd_epi32(s1, _mm512_unpackhi_epi8(lo, zero), wk);
            s2 = _mm512_dpwssd_epi32(s2, _mm512_unpacklo_epi8(hi, zero), wk);
            s3 = _mm512_dpwssd_epi32(s3, _mm512_unpackhi_epi8(hi, zero), wk);
        }
        s0 = _mm512_sra_epi32(s0, shift);
        s1 = _mm512_sra_epi32(s1, shift);
        s2 = _mm512_sra_epi32(s2, shift);
        s3 = _mm512_sra_epi32(s3, shift);
        const __m512i packed = _mm512_packus_epi16(_mm512_packs_epi32(s0, s1),
                                                   _mm512_packs_epi32(s2, s3));
        _mm512_storeu_si512(out + j, packed);
    }
    if (j < len) { /* the same on the last < 64 bytes, loaded and stored masked */
        const __mmask64 mask = (1ULL << (len - j)) - 1;
        __m512i s0 = start, s1 = start, s2 = start, s3 = start;
        for (int k = 0; k < n; k += 2) {
            const __m512i a = _mm512_maskz_loadu_epi8(mask, rows[k] + j);
            const __m512i b = k + 1 < n ? _mm512_maskz_loadu_epi8(mask, rows[k + 1] + j) : zero;
            int32_t pair;
            memcpy(&pair, w + k, sizeof pair);
            const __m512i wk = _mm512_set1_epi32(pair);
            const __m512i lo = _mm512_unpacklo_epi8(a, b), hi = _mm512_unpackhi_epi8(a, b);
            s0 = _mm512_dpwssd_epi32(s0, _mm512_unpacklo_epi8(lo, zero), wk);
            s1 = _mm512_dpwssd_epi32(s1, _mm512_unpackhi_epi8(lo, zero), wk);
            s2 = _mm512_dpwssd_epi32(s2, _mm512_unpacklo_epi8(hi, zero), wk);
            s3 = _mm512_dpwssd_epi32(s3, _mm512_unpackhi_epi8(hi, zero), wk);
        }
        s0 = _mm512_sra_epi32(s0, shift);
        s1 = _mm512_sra_epi32(s1, shift);
        s2 = _mm512_sra_epi32(s2, shift);
        s3 = _mm512_sra_epi32(s3, shift);
        const __m512i packed = _mm512_packus_epi16(_mm512_packs_epi32(s0, s1),
                                                   _mm512_packs_epi32(s2, s3));
        _mm512_mask_storeu_epi8(out + j, mask, packed);
    }
}

AVX512 static void v_row_avx512(const uint8_t *const *rows, int n, const int16_t *w,
                                int precision, uint8_t *out, int len)
{
    switch (n) {
    case 4: v_row_avx512_n(rows, 4, w, precision, out, len); break;
    case 5: v_row_avx512_n(rows, 5, w, precision, out, len); break;
    case 6: v_row_avx512_n(rows, 6, w, precision, out, len); break;
    default: v_row_avx512_n(rows, n, w, precision, out, len);
    }
}

#endif

const char *resample_kernels(void)
{
    return cpu_has_avx512() ? "avx512" : cpu_has_avx2() ? "avx2" : "generic";
}

static void v_row(const uint8_t *const *rows, int n, const int16_t *w, int precision,
                  uint8_t *out, int len)
{
#ifdef MMGATE_X86
    if (cpu_has_avx512() && n <= 64) {
        v_row_avx512(rows, n, w, precision, out, len);
        return;
    }
    if (cpu_has_avx2() && n <= 64) {
        v_row_avx2(rows, n, w, precision, out, len);
        return;
    }
#endif
    v_row_generic(rows, n, w, precision, out, len);
}

void resample_split_rgb(const uint8_t *row, int width, uint8_t *out, size_t plane)
{
#ifdef MMGATE_X86
    if (cpu_has_avx512()) {
        split_rgb_avx512_row(row, width, out, plane);
        return;
    }
    if (cpu_has_avx2()) {
        split_rgb_avx2(row, width, out, plane);
        return;
    }
#endif
    split_rgb(row, width, out, plane);
}

/* ---- the width pass, row by row on demand into a ring of rows ----------------------------- */

typedef struct {
    const uint8_t *src;
    int h_in, channels, w_out;
    size_t in_row;             /* bytes per input row */
    const axis_plan *plan;     /* NULL: no width pass, rows are read from src (or split) */
    size_t plane;              /* 0: ring rows interleaved; else 3 planes this many bytes apart */
    uint8_t *scratch;          /* planar rows from interleaving kernels: the row before its split */
    uint8_t *ring;             /* ring_rows rows of ring_row bytes */
    size_t ring_row;
    int ring_rows;
    uint8_t *tail;             /* the last tail_rows input rows, then zero bytes the kernels may
                                * read: a row's loads can reach past the rows after it */
    int tail_from;             /* first input row read from `tail` */
    int next;                  /* next input row to resample */
#ifdef MMGATE_X86
    rgb_plan rgb;              /* the AVX2 layout of `plan`, when rgb.weights is set */
    rgb512_plan rgb512;        /* the AVX-512 layout of `plan`, when rgb512.groups > 0 */
    rgbw_plan rgbw;            /* else its wide AVX-512 layout, when rgbw.groups > 0 */
#endif
} width_pass;

static const uint8_t *input_row(const width_pass *wp, int r)
{
    if (r >= wp->tail_from)
        return wp->tail + (size_t)(r - wp->tail_from) * wp->in_row;
    return wp->src + (size_t)r * wp->in_row;
}

static uint8_t *ring_row(const width_pass *wp, int r)
{
    return wp->ring + (size_t)(r % wp->ring_rows) * wp->ring_row;
}

static void width_pass_row(width_pass *wp, int r)
{
    if (!wp->plan) { /* planar rows of an image as wide as the output */
        resample_split_rgb(wp->src + (size_t)r * wp->in_row, wp->w_out, ring_row(wp, r), wp->plane);
        return;
    }
#ifdef MMGATE_X86
    if (wp->rgb512.groups) {
        (wp->rgb512.quads ? h_row_rgb_avx512_quads : h_row_rgb_avx512)(
            input_row(wp, r), ring_row(wp, r), &wp->rgb512, wp->plan->precision, wp->plane);
        return;
    }
    if (wp->rgbw.groups) {
        const int ahead = r + WIDE_PREFETCH_ROWS;
        h_row_rgb_wide(input_row(wp, r), ring_row(wp, r), &wp->rgbw, wp->plan->precision,
                       wp->plane,
                       ahead < wp->h_in && (size_t)wp->h_in * wp->in_row > PREFETCH_ABOVE
                           ? input_row(wp, ahead)
                           : NULL);
        return;
    }
#endif
    uint8_t *out = wp->plane ? wp->scratch : ring_row(wp, r);
#ifdef MMGATE_X86
    if (wp->rgb.weights)
        h_row_rgb_avx2(input_row(wp, r), out, &wp->rgb, wp->plan->precision);
    else
#endif
        h_row_generic(input_row(wp, r), out, wp->w_out, wp->channels, wp->plan);
    if (wp->plane)
        resample_split_rgb(out, wp->w_out, ring_row(wp, r), wp->plane);
}

#ifdef MMGATE_X86
/* Whether rows go two at a time: planar rows through the AVX-512 4-tap kernel. */
static int two_rows(const width_pass *wp)
{
    return wp->plane && wp->plan && wp->rgb512.groups && wp->rgb512.quads;
}
#endif

static const uint8_t *source_row(width_pass *wp, int r)
{
    if (!wp->ring)
        return wp->src + (size_t)r * wp->in_row;
    while (wp->next <= r) {
#ifdef MMGATE_X86
        /* rows r and r + 1 at once (the ring has a row more for it) */
        if (two_rows(wp) && wp->next + 1 < wp->h_in) {
            const int ahead = wp->next + PREFETCH_ROWS < wp->h_in - 1 ? wp->next + PREFETCH_ROWS
                                                                      : wp->h_in - 2;
            h_rows2_rgb_avx512_quads(input_row(wp, wp->next), input_row(wp, wp->next + 1),
                                     ring_row(wp, wp->next), ring_row(wp, wp->next + 1),
                                     &wp->rgb512, wp->plan->precision, wp->plane,
                                     (size_t)wp->h_in * wp->in_row > PREFETCH_ABOVE
                                         ? input_row(wp, ahead)
                                         : NULL);
            wp->next += 2;
            continue;
        }
#endif
        width_pass_row(wp, wp->next++);
    }
    return ring_row(wp, r);
}

static int width_pass_open(width_pass *wp, const uint8_t *src, int h_in, int w_in, int channels,
                           int w_out, const axis_plan *plan, int window, size_t plane)
{
    memset(wp, 0, sizeof *wp);
    wp->src = src;
    wp->h_in = h_in;
    wp->channels = channels;
    wp->w_out = w_out;
    wp->in_row = (size_t)w_in * channels;
    wp->plan = plan;
    wp->plane = plane;
    wp->tail_from = h_in;
    if (!plan && !plane)
        return 0;
    wp->ring_rows = window + (plane ? 1 : 0); /* planar: a row more, see source_row */
    wp->ring_row = (plane ? 3 * plane : (size_t)w_out * channels) + ROW_PAD;
    wp->ring = malloc(wp->ring_row * wp->ring_rows);
    if (!wp->ring)
        return -1;
    if (!plan)
        return 0;
    size_t overread = ROW_PAD;
#ifdef MMGATE_X86
    int fits = 1; /* 0: the AVX-512 layout is in use */
    if (cpu_has_avx512() && channels == 3) {
        fits = rgb512_plan_open(&wp->rgb512, plan, w_out, wp->in_row);
        if (fits < 0)
            return -1;
        if (fits) /* downscales beyond its window */
            fits = rgbw_plan_open(&wp->rgbw, plan, w_out, w_in);
        if (fits < 0)
            return -1;
    }
    if (fits && cpu_has_avx2() && channels == 3) {
        if (rgb_plan_open(&wp->rgb, plan, w_out))
            return -1;
        overread = rgb_overread(plan);
    }
    const int planar_kernel = wp->rgb512.groups > 0 || wp->rgbw.groups > 0;
#else
    const int planar_kernel = 0;
#endif
    if (plane && !planar_kernel) { /* other kernels write interleaved rows, then split */
        wp->scratch = malloc((size_t)w_out * channels + ROW_PAD);
        if (!wp->scratch)
            return -1;
    }
    /* Row r's loads end before (r + 1) * in_row + overread: rows within that many bytes of the
     * end of the input are read from a copy followed by zeros. */
    size_t tail_rows = 1 + (overread + wp->in_row - 1) / wp->in_row;
    if (tail_rows > (size_t)h_in)
        tail_rows = (size_t)h_in;
    wp->tail_from = h_in - (int)tail_rows;
    wp->tail = calloc(tail_rows * wp->in_row + overread, 1);
    if (!wp->tail)
        return -1;
    memcpy(wp->tail, src + (size_t)wp->tail_from * wp->in_row, tail_rows * wp->in_row);
    return 0;
}

static void width_pass_close(width_pass *wp)
{
#ifdef MMGATE_X86
    rgb_plan_close(&wp->rgb);
    rgb512_plan_close(&wp->rgb512);
    rgbw_plan_close(&wp->rgbw);
#endif
    free(wp->ring);
    free(wp->scratch);
    free(wp->tail);
}

/* ---- the whole image ---------------------------------------------------------------------- */

static void emit(const row_sink *sink, int y, const uint8_t *row, size_t len)
{
    if (sink->target) {
        uint8_t *to = sink->target(sink->ctx, y);
        memcpy(to, row, len);
        row = to;
    }
    if (sink->done)
        sink->done(sink->ctx, y, row);
}

static int max_taps(const axis_plan *plan, int n_out)
{
    int most = 1;
    for (int i = 0; i < n_out; i++)
        most = plan->sizes[i] > most ? plan->sizes[i] : most;
    return most;
}

int resample_image(const uint8_t *src, int h_in, int w_in, int channels, int h_out, int w_out,
                   const axis_plan *horizontal, const axis_plan *vertical, const row_sink *sink)
{
    const size_t plane = channels == 3 ? sink->plane : 0;
    const size_t len = plane ? 3 * plane : (size_t)w_out * channels;
    const int window = vertical ? max_taps(vertical, h_out) : 1;
    const uint8_t **rows = malloc(sizeof *rows * (size_t)window);
    width_pass wp;
    int status = width_pass_open(&wp, src, h_in, w_in, channels, w_out, horizontal, window,
                                 plane);
    if (!rows || status) {
        status = -1;
        goto out;
    }
    for (int y = 0; y < h_out; y++) {
        if (!vertical) {
            emit(sink, y, source_row(&wp, y), len);
            continue;
        }
        const int first = vertical->starts[y], n = vertical->sizes[y];
        for (int k = 0; k < n; k++)
            rows[k] = source_row(&wp, first + k);
        uint8_t *to = sink->target(sink->ctx, y);
        v_row(rows, n, vertical->weights + (size_t)y * vertical->stride, vertical->precision, to,
              (int)len);
        if (sink->done)
            sink->done(sink->ctx, y, to);
    }
out:
    width_pass_close(&wp);
    free(rows);
    return status;
}
