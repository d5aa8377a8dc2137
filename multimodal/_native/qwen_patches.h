/* Qwen-VL's patch layout, written band by band as the resize produces the image.
 *
 * An h x w x 3 image becomes (h/patch)*(w/patch) rows of 3*temporal*patch*patch elements:
 * patches in merge x merge groups (group rows, group columns, row in group, column in group),
 * each flattened as (channel, temporal copy, row, column), the same pixels in every temporal
 * copy. As multimodal/processors/qwen_vl.py's numpy _patchify does, element for element.
 *
 * Rows are split into channel planes as they arrive; once patch*merge rows (one row of merge
 * groups) are in, their patches are written out in order, so the output is written
 * sequentially, once.
 */
#ifndef MMGATE_QWEN_PATCHES_H
#define MMGATE_QWEN_PATCHES_H

#include <stdint.h>

typedef struct {
    int width;                 /* of the resized image, 3 channels */
    int patch, merge, temporal;
    void *out;                 /* uint8, or float32 if `table` is set */
    const float *table;        /* NULL, or the float of each value per channel: table[c*256+v] */
    uint8_t *band;             /* internal: 3 planes of patch*merge rows */
    uint8_t *row;              /* internal: where the resize writes the row being done */
} qwen_patches;

/* Allocates the band and row buffers. Returns 0, or -1 if memory ran out. */
int qwen_patches_open(qwen_patches *q);
void qwen_patches_close(qwen_patches *q);

/* row_sink callbacks (see resample.h), ctx being a qwen_patches. */
uint8_t *qwen_patches_target(void *ctx, int y);
void qwen_patches_row(void *ctx, int y, const uint8_t *row);

#endif
