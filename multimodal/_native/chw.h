/* HWC uint8 images to CHW planes: what LLaVA-style processors hand the engine (one plane per
 * channel), from the rows a resize or a crop leaves (interleaved RGB). */
#ifndef MMGATE_CHW_H
#define MMGATE_CHW_H

#include <stddef.h>
#include <stdint.h>

/* An h x w x 3 image, rows `row_stride` bytes apart, to 3 planes of h * w bytes at `out`.
 * Safe to call without the GIL. */
void chw_planes(const uint8_t *src, int h, int w, size_t row_stride, uint8_t *out);

/* `planes` uint8 planes of `plane` values each, channels 0, 1, 2 in turn (images' or tiles'
 * CHW planes one after another), to float32 (x - mean[c]) / std[c] at `out`: `mean_std` holds
 * the 3 means, then the 3 stds. One pass where numpy makes three. Safe without the GIL. */
void chw_normalize(const uint8_t *src, size_t planes, int plane, const float *mean_std,
                   float *out);

#endif
