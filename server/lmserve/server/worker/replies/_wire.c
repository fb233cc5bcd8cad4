/*
 * lmserve.server.api._wire: totals-only `ScoreResponse.results` written as protobuf wire bytes.
 *
 * `pack_totals(log_probs, token_counts, oov_counts)` writes, per text, the 19-byte record that
 * `wire.py` describes (field 2 holding a TextScore: the double, then both counts as 3-byte
 * varints) and returns them as one bytes object, or None when a count is negative or above
 * 2**21 - 1 (the caller then builds the message field by field). `wire.packed_text_scores` does
 * the same with numpy and is the reference this is tested against; this costs about a
 * microsecond for 200 texts where the numpy calls cost tens in a busy server.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define RECORD_BYTES 19
#define MAX_PACKED_COUNT ((1 << 21) - 1)

/* A read-only C-contiguous 1-D view of `obj` with items of `itemsize` bytes and kind `kind`
 * ('f' float, 'i' signed int). Returns 0, or -1 with TypeError set. */
static int
get_view(PyObject *obj, Py_buffer *view, char kind, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') {
        f++;
    }
    int ok = view->ndim == 1 && view->itemsize == itemsize && f[1] == '\0' &&
             (kind == 'f' ? *f == 'd' : (*f == 'q' || *f == 'l'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D %s array", what,
                     kind == 'f' ? "float64" : "int64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The key byte of a varint field, then the count as a 3-byte varint (continuation bits on the
 * first two bytes: valid protobuf that any parser reads as the plain value). */
static inline void
put_count(unsigned char *out, unsigned char key, uint32_t count)
{
    out[0] = key;
    out[1] = (unsigned char)(0x80 | (count & 0x7F));
    out[2] = (unsigned char)(0x80 | ((count >> 7) & 0x7F));
    out[3] = (unsigned char)(count >> 14);
}

static PyObject *
pack_totals(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pack_totals(log_probs, token_counts, oov_counts)");
        return NULL;
    }
    Py_buffer lp = {0}, tc = {0}, oc = {0};
    PyObject *result = NULL;
    if (get_view(args[0], &lp, 'f', 8, "log_probs") < 0) {
        return NULL;
    }
    if (get_view(args[1], &tc, 'i', 8, "token_counts") < 0) {
        goto done;
    }
    if (get_view(args[2], &oc, 'i', 8, "oov_counts") < 0) {
        goto done;
    }
    const Py_ssize_t n = lp.shape[0];
    if (tc.shape[0] != n || oc.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "log_probs, token_counts and oov_counts differ in length");
        goto done;
    }
    const double *log_probs = lp.buf;
    const int64_t *tokens = tc.buf, *oovs = oc.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* As unsigned, a negative count is huge: one comparison rejects both. */
        if ((uint64_t)tokens[i] > MAX_PACKED_COUNT || (uint64_t)oovs[i] > MAX_PACKED_COUNT) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, n * RECORD_BYTES);
    if (!result) {
        goto done;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++, out += RECORD_BYTES) {
        out[0] = (2 << 3) | 2;        /* field 2 `results`, length-delimited */
        out[1] = RECORD_BYTES - 2;    /* 17 bytes follow */
        out[2] = (1 << 3) | 1;        /* field 1 `log_prob`, fixed64 */
        memcpy(out + 3, &log_probs[i], 8); /* little-endian hosts only (see the module init) */
        put_count(out + 11, (2 << 3) | 0, (uint32_t)tokens[i]);
        put_count(out + 15, (3 << 3) | 0, (uint32_t)oovs[i]);
    }
done:
    if (oc.obj) {
        PyBuffer_Release(&oc);
    }
    if (tc.obj) {
        PyBuffer_Release(&tc);
    }
    PyBuffer_Release(&lp);
    return result;
}

static PyMethodDef wire_methods[] = {
    {"pack_totals", (PyCFunction)(void (*)(void))pack_totals, METH_FASTCALL,
     "pack_totals(log_probs, token_counts, oov_counts) -> bytes | None\n\n"
     "The wire bytes of totals-only ScoreResponse.results, one 19-byte record per text;\n"
     "None when a count is negative or above 2**21 - 1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "lmserve.server.api._wire",
    .m_doc = "Totals-only ScoreResponse results as protobuf wire bytes.",
    .m_size = 0,
    .m_methods = wire_methods,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    PyErr_SetString(PyExc_ImportError, "_wire writes doubles as little-endian: this host is not");
    return NULL;
#endif
    return PyModule_Create(&wire_module);
}
