/* Qwen-VL's patch layout, written band by band as the resize produces the image.
 *
 * An h x w x 3 image becomes (h/patch)*(w/patch) rows of 3*temporal*patch*patch elements:
 * patches in merge x merge groups (group rows, group columns, row in group, column in group),
 * each flattened as (channel, temporal copy, row, column), the same pixels in every temporal
 * copy. As multimodal/processors/qwen_vl.py's numpy _patchify does, element for element;
 * normalized floats are float32 (x - mean[c]) / std[c], the two operations numpy does.
 *
 * Rows arrive as channel planes (resample.h's planar rows; normalized if asked); once patch*merge
 * rows (one row of merge groups) are in, their patches are written out in order, so the output
 * is written sequentially, once.
 */
#ifndef MMGATE_QWEN_PATCHES_H
#define MMGATE_QWEN_PATCHES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int width;                 /* of the resized image, 3 channels */
    int patch, merge, temporal;
    void *out;                 /* uint8, or float32 if `normalize` is set */
    const float *normalize;    /* NULL, or mean[3] then std[3] */
    size_t plane;              /* set by qwen_patches_open: the row_sink's plane (resample.h) */
    uint8_t *band;             /* internal: patch*merge rows of 3 uint8 planes each, or 3
                                * float32 planes of patch*merge rows */
    uint8_t *row;              /* internal: float32 only, where the resize writes a row */
} qwen_patches;

/* n uint8 values to float32 (x - mean) / std at `out`: numpy's two float32 operations, 8 values
 * at a time with AVX2. Safe to call without the GIL (chw_normalize uses it too). */
void normalize_u8(const uint8_t *values, int n, float mean, float std, float *out);

/* Allocates the buffers. Returns 0, or -1 if memory ran out. */
int qwen_patches_open(qwen_patches *q);
void qwen_patches_close(qwen_patches *q);

/* row_sink callbacks (see resample.h), ctx being a qwen_patches. */
uint8_t *qwen_patches_target(void *ctx, int y);
void qwen_patches_row(void *ctx, int y, const uint8_t *row);

#endif
