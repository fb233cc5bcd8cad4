/*
 * lmserve.server.decoding._draw: one token per row by inverse CDF, in C.
 *
 *     draw_logits(logits, width, maxes, inv_temps, uniforms, out)   rows of float32 logits
 *     draw_weights(weights, width, uniforms, out)            rows of float32 weights >= 0
 *
 * Each row (`width` floats) gets the first token whose cumulative weight reaches u * total,
 * u in (0, 1]; a token of weight 0 is never chosen. `draw_logits` weighs token i by
 * exp((x_i - max) * inv_temp), exp(-inf) = 0 (banned tokens), with each row's max given
 * (numpy's vectorised max: a float max reduction does not vectorise in portable C). `out` is
 * int64 per row. A row with no positive weight, or with NaN or +inf values (weights, or
 * logits above the row's given max), raises ValueError naming the row: never a wrong token.
 *
 * The same two-level search as `decoding.sampling._draw_blocks`: the row is cut into blocks of
 * BLOCK tokens; one pass computes the weights (kept in a scratch row) and each block's sum,
 * summed in float64; the cumulative block sums pick the block holding the target and a
 * float64 running sum inside that block picks the token. Where numpy spent about ten passes
 * over [B, V] and as many temporaries, this reads the row once and scans a block.
 *
 * The exponential is a polynomial (Cephes' expf: range reduction by ln 2, degree-6 polynomial,
 * relative error ~1e-7) written branch-free so that the compiler vectorises it with the
 * baseline instruction set (hatch_build's -fno-trapping-math lets its selects become blends);
 * libm's expf is a scalar call per token. At batch 32 over 12k tokens this is about as fast as
 * numpy's exp alone (an AVX2 build was slower on the development VM); the gain is the passes
 * and temporaries saved: 0.06 vs 0.13 ms a step at batch 1 (bench/bench_sampling.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 128
#define LANES 16 /* independent partial sums: vectorisable without reassociation */
/* Draws over at least this many values (rows * width) release the GIL while they run. */
#define RELEASE_GIL_MIN_VALUES ((Py_ssize_t)1 << 22)

#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* exp(x) for x <= 0; 0 below -87 (float32's smallest normal is exp(-87.3)) and for -inf;
 * NaN for NaN and for x > 0 (a row holding NaN or +inf, or a wrong max), so that the row's
 * total becomes NaN and the row is refused rather than drawn from. The argument is clamped to
 * [-87, 0] first, NaN included, so the float-to-int conversion below is always defined. */
static ALWAYS_INLINE float
exp_nonpositive(float x)
{
    const float xc = x > -87.0f ? (x < 0.0f ? x : 0.0f) : -87.0f;
    const float fx = xc * 1.44269504088896341f; /* x / ln 2, in [-125.6, 0] */
    const float n = (float)(int)(fx - 0.5f);    /* round to nearest for fx <= 0 */
    float r = xc - n * 0.693359375f;            /* Cody-Waite: ln 2 in two parts */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float w = p * scale;
    return x < -87.0f ? 0.0f : (x <= 0.0f ? w : NAN);
}

/* Sum of w[0:n) (n <= BLOCK) in lanes, then in double. */
static ALWAYS_INLINE double
block_sum(const float *w, Py_ssize_t n)
{
    float lane[LANES] = {0};
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            lane[j] += w[i + j];
        }
    }
    double s = 0.0;
    for (int j = 0; j < LANES; j++) {
        s += lane[j];
    }
    for (; i < n; i++) {
        s += w[i];
    }
    return s;
}

/* Fills w with exp((x - m) * t) and sums[b] with each block's sum; returns the total. */
static double
weigh(const float *x, Py_ssize_t n, float m, float t, float *w, double *sums)
{
    double total = 0.0;
    for (Py_ssize_t start = 0, b = 0; start < n; start += BLOCK, b++) {
        const Py_ssize_t len = n - start < BLOCK ? n - start : BLOCK;
        const float *xb = x + start;
        float *wb = w + start;
        for (Py_ssize_t i = 0; i < len; i++) {
            wb[i] = exp_nonpositive((xb[i] - m) * t);
        }
        sums[b] = block_sum(wb, len);
        total += sums[b];
    }
    return total;
}

static double
sum_blocks(const float *w, Py_ssize_t n, double *sums)
{
    double total = 0.0;
    for (Py_ssize_t start = 0, b = 0; start < n; start += BLOCK, b++) {
        sums[b] = block_sum(w + start, n - start < BLOCK ? n - start : BLOCK);
        total += sums[b];
    }
    return total;
}

/* The first index whose cumulative weight reaches u * total, never one of weight 0; -1 when
 * the row has no weight, or NaN or infinite weight (its total is then NaN or inf). */
static Py_ssize_t
search(const float *w, Py_ssize_t n, const double *sums, double total, double u)
{
    if (!(total > 0.0) || total == (double)INFINITY) {
        return -1;
    }
    const double target = u * total;
    const Py_ssize_t n_blocks = (n + BLOCK - 1) / BLOCK;
    double before = 0.0;
    Py_ssize_t b = 0;
    while (b < n_blocks - 1 && before + sums[b] < target) {
        before += sums[b];
        b++;
    }
    while (b > 0 && sums[b] == 0.0) { /* rounding put the target past the last weight */
        b--;
        before -= sums[b];
    }
    const Py_ssize_t start = b * BLOCK, end = start + BLOCK < n ? start + BLOCK : n;
    Py_ssize_t last = start;
    double cum = before;
    for (Py_ssize_t i = start; i < end; i++) {
        if (w[i] > 0.0f) {
            cum += w[i];
            last = i;
            if (cum >= target) {
                return i;
            }
        }
    }
    return last; /* the block's own running sum fell a hair short of its block sum */
}

/* A C-contiguous buffer of `itemsize`-byte items of kind `kind` ('f' float, 'i' integer). */
static int
get_view(PyObject *obj, Py_buffer *view, char kind, Py_ssize_t itemsize, const char *name,
         int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') {
        f++;
    }
    int ok = view->itemsize == itemsize &&
             (kind == 'f' ? (*f == 'f' || *f == 'd') : (*f == 'q' || *f == 'l'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must hold %s%zd values", name,
                     kind == 'f' ? "float" : "int", itemsize * 8);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
draw(PyObject *const *args, Py_ssize_t nargs, int from_logits)
{
    const Py_ssize_t expected = from_logits ? 6 : 4;
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", expected, nargs);
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (width < 1) {
        PyErr_SetString(PyExc_ValueError, "width must be at least 1");
        return NULL;
    }
    Py_buffer rows = {0}, maxes_view = {0}, temps = {0}, uniforms = {0}, out = {0};
    PyObject *result = NULL;
    float *w = NULL;
    double *sums = NULL;
    int a = 2;
    if (get_view(args[0], &rows, 'f', 4, "rows", 0) < 0) {
        return NULL;
    }
    if ((from_logits && (get_view(args[a++], &maxes_view, 'f', 4, "maxes", 0) < 0 ||
                         get_view(args[a++], &temps, 'f', 8, "inv_temps", 0) < 0)) ||
        get_view(args[a++], &uniforms, 'f', 8, "uniforms", 0) < 0 ||
        get_view(args[a], &out, 'i', 8, "out", 1) < 0) {
        goto done;
    }
    const Py_ssize_t n_rows = (rows.len / 4) / width;
    if (rows.len != n_rows * width * 4 || uniforms.len != n_rows * 8 || out.len != n_rows * 8 ||
        (from_logits && (temps.len != n_rows * 8 || maxes_view.len != n_rows * 4))) {
        PyErr_SetString(PyExc_ValueError, "rows must be float32[S * width]; maxes, uniforms, "
                                          "inv_temps and out one value per row");
        goto done;
    }
    const float *x = rows.buf;
    const double *u = uniforms.buf, *t = from_logits ? temps.buf : NULL;
    const float *maxes = from_logits ? maxes_view.buf : NULL;
    int64_t *chosen = out.buf;
    const Py_ssize_t n_blocks = (width + BLOCK - 1) / BLOCK;
    sums = PyMem_Malloc((size_t)n_blocks * sizeof(double));
    w = from_logits ? PyMem_Malloc((size_t)width * sizeof(float)) : NULL;
    if (!sums || (from_logits && !w)) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t bad = -1;
    /* As the n-gram kernels: only long work lets other threads run meanwhile. A thread that
       releases the GIL must win it back, and in a busy server that wait (up to the 5 ms switch
       interval) costs more than a step's draw (~0.7 ms for 32 rows of 12k tokens). */
    PyThreadState *released =
        n_rows * width >= RELEASE_GIL_MIN_VALUES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < n_rows; r++) {
        const float *row = x + r * width;
        const float *weights = row;
        double total;
        if (from_logits) {
            total = weigh(row, width, maxes[r], (float)t[r], w, sums);
            weights = w;
        } else {
            total = sum_blocks(row, width, sums);
        }
        chosen[r] = search(weights, width, sums, total, u[r]);
        if (chosen[r] < 0 && bad < 0) {
            bad = r;
        }
    }
    if (released) {
        PyEval_RestoreThread(released);
    }
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "row %zd has no token of positive weight "
                                         "(or NaN/inf weights)", bad);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(w);
    PyMem_Free(sums);
    PyBuffer_Release(&rows);
    if (maxes_view.obj) {
        PyBuffer_Release(&maxes_view);
    }
    if (temps.obj) {
        PyBuffer_Release(&temps);
    }
    if (uniforms.obj) {
        PyBuffer_Release(&uniforms);
    }
    if (out.obj) {
        PyBuffer_Release(&out);
    }
    return result;
}

static PyObject *
draw_logits(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return draw(args, nargs, 1);
}

static PyObject *
draw_weights(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return draw(args, nargs, 0);
}

static PyMethodDef methods[] = {
    {"draw_logits", (PyCFunction)(void (*)(void))draw_logits, METH_FASTCALL,
     "draw_logits(logits, width, maxes, inv_temps, uniforms, out)\n--\n\n"
     "One token per row of float32 logits: the first whose cumulative weight\n"
     "exp((x - max) * inv_temp) reaches u * total. Writes int64 ids into `out`."},
    {"draw_weights", (PyCFunction)(void (*)(void))draw_weights, METH_FASTCALL,
     "draw_weights(weights, width, uniforms, out)\n--\n\n"
     "As draw_logits over float32 weights >= 0 given as they are."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_draw",
    .m_doc = "Inverse-CDF draws over rows of logits or weights.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__draw(void)
{
    return PyModule_Create(&module);
}
