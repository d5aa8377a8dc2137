/* Canvas rows to tile planes: a canvas row crosses `cols` tiles, so each of its channels is
 * copied (or zeroed) in up to `cols` runs, one per tile it crosses. */
#include "tiles.h"

#include <stdlib.h>
#include <string.h>

#define ROW_PAD 64 /* the resize's SIMD stores may touch bytes past a row's last plane */

/* Bytes x0 .. x1 - 1 of channel c of canvas row y: copied from `from` (canvas byte x0 first),
 * or zeroed when `from` is NULL. */
static void canvas_span(const tiles *t, int y, int c, int x0, int x1, const uint8_t *from)
{
    const size_t plane = (size_t)t->tile * t->tile, tile_bytes = 3 * plane;
    uint8_t *row = t->out + (size_t)(y / t->tile) * t->cols * tile_bytes + c * plane +
                   (size_t)(y % t->tile) * t->tile;
    while (x0 < x1) {
        const int column = x0 / t->tile, end = x1 < (column + 1) * t->tile ? x1
                                                                         : (column + 1) * t->tile;
        uint8_t *to = row + column * tile_bytes + (x0 - column * t->tile);
        if (from) {
            memcpy(to, from, (size_t)(end - x0));
            from += end - x0;
        } else
            memset(to, 0, (size_t)(end - x0));
        x0 = end;
    }
}

static void zero_row(const tiles *t, int y)
{
    for (int c = 0; c < 3; c++)
        canvas_span(t, y, c, 0, t->cols * t->tile, NULL);
}

int tiles_open(tiles *t)
{
    t->plane = ((size_t)t->width + 15) / 16 * 16;
    t->row = malloc(3 * t->plane + ROW_PAD);
    if (!t->row)
        return -1;
    for (int y = 0; y < t->top; y++)
        zero_row(t, y);
    for (int y = t->top + t->height; y < t->rows * t->tile; y++)
        zero_row(t, y);
    return 0;
}

void tiles_close(tiles *t)
{
    free(t->row);
    t->row = NULL;
}

uint8_t *tiles_target(void *ctx, int y)
{
    (void)y;
    return ((tiles *)ctx)->row;
}

void tiles_row(void *ctx, int y, const uint8_t *row)
{
    const tiles *t = ctx;
    const int right = t->left + t->width;
    for (int c = 0; c < 3; c++) {
        canvas_span(t, t->top + y, c, 0, t->left, NULL);
        canvas_span(t, t->top + y, c, t->left, right, row + c * t->plane);
        canvas_span(t, t->top + y, c, right, t->cols * t->tile, NULL);
    }
}
