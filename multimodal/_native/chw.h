/* HWC uint8 images to CHW planes: what LLaVA-style processors hand the engine (one plane per
 * channel), from the rows a resize or a crop leaves (interleaved RGB). */
#ifndef MMGATE_CHW_H
#define MMGATE_CHW_H

#include <stddef.h>
#include <stdint.h>

/* An h x w x 3 image, rows `row_stride` bytes apart, to 3 planes of h * w bytes at `out`.
 * Safe to call without the GIL. */
void chw_planes(const uint8_t *src, int h, int w, size_t row_stride, uint8_t *out);

#endif
