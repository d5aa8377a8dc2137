/* torchvision's uint8 antialiased resize (int16 fixed-point weights, int32 sums), in C.
 *
 * The weights come from Python (multimodal/resize_weights.py, the same integers ATen computes);
 * these kernels only apply them: out = clamp((sum(w * x) + 2**(p-1)) >> p, 0, 255), width pass
 * first, the intermediate rounded to uint8, exactly as ATen's UpSampleKernelAVXAntialias.h.
 */
#ifndef MMGATE_RESAMPLE_H
#define MMGATE_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* The weights of one axis. */
typedef struct {
    const int32_t *starts;  /* first input index of each output */
    const int32_t *sizes;   /* number of inputs of each output (<= stride) */
    const int16_t *weights; /* n_out rows of `stride` weights, zero past `sizes` */
    int stride;             /* even, so taps can be read in pairs */
    int precision;          /* weights are scaled by 2**precision, 1..22 */
} axis_plan;

/* Receives the output rows of a resize, top to bottom. */
typedef struct {
    /* Where output row y is to be written (w_out * channels bytes, or 3 * plane); NULL: no copy
     * wanted. */
    uint8_t *(*target)(void *ctx, int y);
    /* Called once row y is complete, with the row; may be NULL. */
    void (*done)(void *ctx, int y, const uint8_t *row);
    void *ctx;
    /* 0: rows are w_out * channels interleaved bytes. Else (3 channels only): rows are 3 channel
     * planes, `plane` bytes apart (at least w_out rounded up to 16; the bytes past w_out are
     * scratch), so a row is 3 * plane bytes. */
    size_t plane;
} row_sink;

/* Resize an h_in x w_in x channels image (rows contiguous); a NULL plan skips that axis.
 * Returns 0, or -1 if memory ran out. Safe to call without the GIL. */
int resample_image(const uint8_t *src, int h_in, int w_in, int channels, int h_out, int w_out,
                   const axis_plan *horizontal, const axis_plan *vertical, const row_sink *sink);

/* One interleaved RGB row of `width` pixels to 3 planes `plane` bytes apart (out, out + plane,
 * out + 2 * plane), with the best kernels this CPU runs. Writes nothing past `width` in a
 * plane, so planes may follow each other directly. */
void resample_split_rgb(const uint8_t *row, int width, uint8_t *out, size_t plane);

/* Which kernels resample_image uses on this CPU: "avx512", "avx2" or "generic". */
const char *resample_kernels(void);

#endif
