/* HWC to CHW: each row's w pixels of 3 bytes become w bytes in each of 3 planes, by the width
 * pass's own row split (resample_split_rgb: AVX-512 byte permutations, AVX2 shuffles, or byte by
 * byte), with the image's planes as its planes. */
#include "chw.h"

#include "qwen_patches.h"
#include "resample.h"

void chw_planes(const uint8_t *src, int h, int w, size_t row_stride, uint8_t *out)
{
    const size_t plane = (size_t)h * w;
    for (int y = 0; y < h; y++)
        resample_split_rgb(src + (size_t)y * row_stride, w, out + (size_t)y * w, plane);
}

void chw_normalize(const uint8_t *src, size_t planes, int plane, const float *mean_std,
                   float *out)
{
    for (size_t p = 0; p < planes; p++) {
        const int c = (int)(p % 3);
        const size_t at = p * (size_t)plane;
        normalize_u8(src + at, plane, mean_std[c], mean_std[3 + c], out + at);
    }
}
