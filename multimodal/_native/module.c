/* multimodal._kernels: the Python face of resample.c, qwen_patches.c, tiles.c and chw.c.
 *
 * Arrays travel as buffers (numpy arrays, C-contiguous); multimodal/native.py builds the
 * arguments. Every size and index is checked here before any pointer is followed, and the GIL
 * is released while pixels are computed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "chw.h"
#include "cpu.h"
#include "qwen_patches.h"
#include "resample.h"
#include "tiles.h"

/* One axis argument: None (axis unchanged) or (starts int32, sizes int32, weights int16,
 * stride, precision). */
typedef struct {
    Py_buffer starts, sizes, weights;
    axis_plan plan;
    int present;
} axis_arg;

static void axis_release(axis_arg *a)
{
    if (a->present) {
        PyBuffer_Release(&a->starts);
        PyBuffer_Release(&a->sizes);
        PyBuffer_Release(&a->weights);
        a->present = 0;
    }
}

static int axis_check(const axis_arg *a, int n_in, int n_out, const char *name)
{
    const axis_plan *p = &a->plan;
    if (p->stride < 2 || p->stride % 2 || p->precision < 1 || p->precision > 22 ||
        a->starts.len < (Py_ssize_t)sizeof(int32_t) * n_out ||
        a->sizes.len < (Py_ssize_t)sizeof(int32_t) * n_out ||
        a->weights.len < (Py_ssize_t)sizeof(int16_t) * n_out * p->stride) {
        PyErr_Format(PyExc_ValueError, "%s weights do not fit %d outputs", name, n_out);
        return -1;
    }
    for (int i = 0; i < n_out; i++) {
        const int32_t start = p->starts[i], size = p->sizes[i];
        if (start < 0 || size < 0 || size > p->stride || start > n_in - size) {
            PyErr_Format(PyExc_ValueError, "%s weights of output %d read outside the input",
                         name, i);
            return -1;
        }
    }
    return 0;
}

/* Parse `obj` into `a`; n_in == n_out requires None and vice versa. */
static int axis_parse(PyObject *obj, int n_in, int n_out, const char *name, axis_arg *a)
{
    memset(a, 0, sizeof *a);
    if (obj == Py_None) {
        if (n_in != n_out) {
            PyErr_Format(PyExc_ValueError, "%s weights missing for %d -> %d", name, n_in, n_out);
            return -1;
        }
        return 0;
    }
    if (!PyArg_ParseTuple(obj, "y*y*y*ii", &a->starts, &a->sizes, &a->weights, &a->plan.stride,
                          &a->plan.precision))
        return -1;
    a->present = 1;
    a->plan.starts = a->starts.buf;
    a->plan.sizes = a->sizes.buf;
    a->plan.weights = a->weights.buf;
    return axis_check(a, n_in, n_out, name);
}

static int check_image(const Py_buffer *b, int h, int w, int c, size_t element, const char *name)
{
    if (h < 1 || w < 1 || c < 1 || (size_t)b->len != (size_t)h * w * c * element) {
        PyErr_Format(PyExc_ValueError, "%s buffer does not hold %dx%dx%d elements", name, h, w,
                     c);
        return -1;
    }
    return 0;
}

/* The resize of src into `sink`, without the GIL. Returns 0, or -1 with MemoryError set. */
static int resize_into(const Py_buffer *src, int h_in, int w_in, int channels, int h_out,
                       int w_out, const axis_arg *h, const axis_arg *v, const row_sink *sink)
{
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = resample_image(src->buf, h_in, w_in, channels, h_out, w_out,
                            h->present ? &h->plan : NULL, v->present ? &v->plan : NULL, sink);
    Py_END_ALLOW_THREADS
    if (status)
        PyErr_NoMemory();
    return status ? -1 : 0;
}

/* ---- resize ------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *out;
    size_t row_bytes;
} image_rows;

static uint8_t *image_row(void *ctx, int y)
{
    const image_rows *rows = ctx;
    return rows->out + (size_t)y * rows->row_bytes;
}

static PyObject *py_resize(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    int h_in, w_in, channels, h_out, w_out, status = -1;
    PyObject *h_obj, *v_obj;
    axis_arg h = {0}, v = {0};
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiw*iiOO", &src, &h_in, &w_in, &channels, &dst, &h_out,
                          &w_out, &h_obj, &v_obj))
        return NULL;
    if (check_image(&src, h_in, w_in, channels, 1, "source") ||
        check_image(&dst, h_out, w_out, channels, 1, "destination") ||
        axis_parse(h_obj, w_in, w_out, "width", &h) ||
        axis_parse(v_obj, h_in, h_out, "height", &v))
        goto out;
    image_rows rows = {dst.buf, (size_t)w_out * channels};
    const row_sink sink = {image_row, NULL, &rows, 0};
    status = resize_into(&src, h_in, w_in, channels, h_out, w_out, &h, &v, &sink);
out:
    axis_release(&h);
    axis_release(&v);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (status)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- resize straight into Qwen-VL patches ------------------------------------------------- */

static int check_patches(const qwen_patches *q, int h, const Py_buffer *dst)
{
    const int p = q->patch, m = q->merge;
    if (p < 1 || m < 1 || q->temporal < 1 || h % (p * m) || q->width % (p * m)) {
        PyErr_Format(PyExc_ValueError, "%dx%d is not a multiple of patch %d x merge %d", h,
                     q->width, p, m);
        return -1;
    }
    const size_t element = q->normalize ? sizeof(float) : 1;
    const size_t want = (size_t)(h / p) * (q->width / p) * 3 * q->temporal * p * p;
    if ((size_t)dst->len != want * element) {
        PyErr_SetString(PyExc_ValueError, "patch buffer has the wrong size");
        return -1;
    }
    return 0;
}

static PyObject *py_qwen_patches(PyObject *self, PyObject *args)
{
    Py_buffer src, dst, normalize = {0};
    int h_in, w_in, h_out, w_out, status = -1;
    PyObject *h_obj, *v_obj, *normalize_obj;
    axis_arg h = {0}, v = {0};
    qwen_patches q = {0};
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiw*iiOOiiiO", &src, &h_in, &w_in, &dst, &h_out, &w_out,
                          &h_obj, &v_obj, &q.patch, &q.merge, &q.temporal, &normalize_obj))
        return NULL;
    q.width = w_out;
    q.out = dst.buf;
    if (normalize_obj != Py_None) {
        if (PyObject_GetBuffer(normalize_obj, &normalize, PyBUF_SIMPLE))
            goto out;
        if (normalize.len != (Py_ssize_t)(6 * sizeof(float))) {
            PyErr_SetString(PyExc_ValueError, "normalize must hold 3 means and 3 stds, float32");
            goto out;
        }
        q.normalize = normalize.buf;
    }
    if (check_image(&src, h_in, w_in, 3, 1, "source") || check_patches(&q, h_out, &dst) ||
        axis_parse(h_obj, w_in, w_out, "width", &h) ||
        axis_parse(v_obj, h_in, h_out, "height", &v))
        goto out;
    if (qwen_patches_open(&q)) {
        PyErr_NoMemory();
        goto out;
    }
    const row_sink sink = {qwen_patches_target, qwen_patches_row, &q, q.plane};
    status = resize_into(&src, h_in, w_in, 3, h_out, w_out, &h, &v, &sink);
out:
    qwen_patches_close(&q);
    axis_release(&h);
    axis_release(&v);
    if (normalize.obj)
        PyBuffer_Release(&normalize);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (status)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- resize onto a canvas of CHW tiles ------------------------------------------------------ */

static int check_tiles(const tiles *t, const Py_buffer *dst)
{
    const int ok = t->tile > 0 && t->rows > 0 && t->cols > 0 && t->top >= 0 && t->left >= 0 &&
                   t->rows <= INT_MAX / t->tile && t->cols <= INT_MAX / t->tile &&
                   t->height <= t->rows * t->tile - t->top &&
                   t->width <= t->cols * t->tile - t->left &&
                   (size_t)dst->len == (size_t)t->rows * t->cols * 3 * t->tile * t->tile;
    if (!ok)
        PyErr_Format(PyExc_ValueError,
                     "a %dx%d image at (%d, %d) does not fit %dx%d tiles of %d, or the tile "
                     "buffer has the wrong size",
                     t->height, t->width, t->top, t->left, t->rows, t->cols, t->tile);
    return ok ? 0 : -1;
}

static PyObject *py_tiles(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    int h_in, w_in, status = -1;
    PyObject *h_obj, *v_obj;
    axis_arg h = {0}, v = {0};
    tiles t = {0};
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiw*iiOOiiiii", &src, &h_in, &w_in, &dst, &t.height,
                          &t.width, &h_obj, &v_obj, &t.tile, &t.rows, &t.cols, &t.top, &t.left))
        return NULL;
    t.out = dst.buf;
    if (check_image(&src, h_in, w_in, 3, 1, "source") || t.height < 1 || t.width < 1 ||
        check_tiles(&t, &dst) || axis_parse(h_obj, w_in, t.width, "width", &h) ||
        axis_parse(v_obj, h_in, t.height, "height", &v))
        goto out;
    if (tiles_open(&t)) {
        PyErr_NoMemory();
        goto out;
    }
    const row_sink sink = {tiles_target, tiles_row, &t, t.plane};
    status = resize_into(&src, h_in, w_in, 3, t.height, t.width, &h, &v, &sink);
out:
    tiles_close(&t);
    axis_release(&h);
    axis_release(&v);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (status)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- HWC to CHW ---------------------------------------------------------------------------- */

static PyObject *py_chw(PyObject *self, PyObject *args)
{
    PyObject *src_obj;
    Py_buffer src = {0}, dst;
    (void)self;
    if (!PyArg_ParseTuple(args, "Ow*", &src_obj, &dst))
        return NULL;
    /* the source may be a strided view (a crop): rows any distance apart, pixels packed */
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_RECORDS_RO)) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    const int ok = src.ndim == 3 && src.itemsize == 1 && src.shape[2] == 3 &&
                   src.strides[2] == 1 && src.strides[1] == 3 && src.shape[0] > 0 &&
                   src.shape[1] > 0 && src.shape[0] <= INT_MAX && src.shape[1] <= INT_MAX &&
                   src.strides[0] >= 3 * src.shape[1] &&
                   dst.len == src.shape[0] * src.shape[1] * 3;
    if (!ok)
        PyErr_SetString(PyExc_ValueError,
                        "chw takes an HxWx3 uint8 array with packed pixels and an HxWx3-byte "
                        "output");
    else {
        const int h = (int)src.shape[0], w = (int)src.shape[1];
        const size_t stride = (size_t)src.strides[0];
        Py_BEGIN_ALLOW_THREADS
        chw_planes(src.buf, h, w, stride, dst.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- uint8 planes to normalized float32 ---------------------------------------------------- */

static PyObject *py_normalize(PyObject *self, PyObject *args)
{
    Py_buffer src, dst, mean_std;
    Py_ssize_t planes, plane;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nny*w*", &src, &planes, &plane, &mean_std, &dst))
        return NULL;
    const int ok = planes >= 0 && plane > 0 && plane <= INT_MAX && src.len == planes * plane &&
                   dst.len == src.len * (Py_ssize_t)sizeof(float) &&
                   mean_std.len == (Py_ssize_t)(6 * sizeof(float));
    if (!ok)
        PyErr_SetString(PyExc_ValueError,
                        "normalize takes planes x plane uint8 values, 3 means and 3 stds "
                        "(float32) and a float32 output of as many values");
    else {
        Py_BEGIN_ALLOW_THREADS
        chw_normalize(src.buf, (size_t)planes, (int)plane, mean_std.buf, dst.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&mean_std);
    PyBuffer_Release(&dst);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_kernels(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(resample_kernels());
}

static PyObject *py_use_kernels(PyObject *self, PyObject *args)
{
    const char *name;
    (void)self;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    const int level = strcmp(name, "avx512") == 0 ? CPU_AVX512
                      : strcmp(name, "avx2") == 0  ? CPU_AVX2
                      : strcmp(name, "generic") == 0 ? CPU_GENERIC
                                                     : -1;
    if (level < 0 || cpu_allow(level)) {
        PyErr_Format(PyExc_ValueError, "kernels %s are not available here", name);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resize", py_resize, METH_VARARGS,
     "resize(src, h_in, w_in, channels, dst, h_out, w_out, width_axis, height_axis)"},
    {"qwen_patches", py_qwen_patches, METH_VARARGS,
     "qwen_patches(src, h_in, w_in, dst, h_out, w_out, width_axis, height_axis, patch, merge, "
     "temporal, normalize)"},
    {"tiles", py_tiles, METH_VARARGS,
     "tiles(src, h_in, w_in, dst, h_out, w_out, width_axis, height_axis, tile, rows, cols, top, "
     "left): the resized image at (top, left) of a zeroed canvas of rows x cols CHW tiles"},
    {"chw", py_chw, METH_VARARGS,
     "chw(src, dst): an HxWx3 uint8 array (rows may be strided) to 3 planes of HxW bytes"},
    {"normalize", py_normalize, METH_VARARGS,
     "normalize(src, planes, plane, mean_std, dst): uint8 channel planes (channels 0, 1, 2 in "
     "turn) to float32 (x - mean[c]) / std[c]"},
    {"kernels", py_kernels, METH_NOARGS, "The kernels in use: 'avx512', 'avx2' or 'generic'."},
    {"use_kernels", py_use_kernels, METH_VARARGS,
     "use_kernels('generic' | 'avx2' | 'avx512'): use kernels up to that level (tests only, not "
     "thread-safe)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kernels",
    .m_doc = "Native uint8 resize (torchvision-exact), Qwen-VL patches and LLaVA tiles.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&module);
}
