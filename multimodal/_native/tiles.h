/* A resized image placed on a canvas cut into square tiles, each tile written as 3 channel
 * planes: LLaVA-NeXT's anyres grid (the image fitted, zero-padded around it, cut into tiles)
 * and its base tile, straight from the resize, without the padded canvas or a transposing copy.
 *
 * The canvas is rows x cols tiles of tile x tile pixels; the output holds the tiles row by row,
 * each as 3 planes of tile x tile bytes. The image's height x width pixels lie at (top, left);
 * every other canvas byte is zero. Each output byte is written once.
 */
#ifndef MMGATE_TILES_H
#define MMGATE_TILES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *out;
    int tile, rows, cols;
    int top, left, height, width; /* the image on the canvas, inside it */
    size_t plane;                 /* set by tiles_open: the row_sink's plane (resample.h) */
    uint8_t *row;                 /* internal: where the resize writes a row */
} tiles;

/* Allocates the row and zeroes the canvas rows above and below the image. Returns 0, or -1 if
 * memory ran out. */
int tiles_open(tiles *t);
void tiles_close(tiles *t);

/* row_sink callbacks (see resample.h), ctx being a tiles. */
uint8_t *tiles_target(void *ctx, int y);
void tiles_row(void *ctx, int y, const uint8_t *row);

#endif
