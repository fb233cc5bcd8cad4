/*
 * lmserve.server.backends.ngram._kernel: the n-gram scoring loop in C.
 *
 * Scores exactly what `NgramModel._layout` + `_score_tokens` + the totals compute in numpy, but
 * sequentially, one text at a time, with KenLM's state semantics (`lm/model.cc`,
 * `GenericModel::FullScore`): for word w after history h, find the longest n-gram h' w in the
 * model whose context h' is a suffix of h, and
 *
 *     log p(w | h) = log p(w | h') + sum of backoff(c) over the contexts c in the state that
 *                    are longer than h'
 *
 * The state after a word holds the entries found ending at it (order 1 up to order N-1).
 *
 * Lookups use the same tables as `hashing.py`: an order-k entry's key is
 * `(index of its order-(k-1) prefix) << 32 | last word id`, its home bucket is
 *     mixed  = (key * 0x9E3779B97F4A7C15) >> 32        (uint64, wrapping)
 *     bucket = (mixed * n_buckets) >> 32
 * and the bucket's keys are `keys[bucket_start[b]:bucket_start[b+1]]`, values in `vals`.
 *
 * Every model has every suffix of an entry as an entry (`build.py` fills gaps as KenLM does), so
 * the first miss while extending the chain ends the search: no longer n-gram can match either.
 *
 * The model arrays are taken once, through the buffer protocol, by `Scorer(...)`, which keeps the
 * views (and so the numpy arrays or memory maps) alive and checks them once: lengths, dtypes and
 * that every bucket range and every stored value lies inside its array. `Scorer.score` then only
 * checks the per-call inputs (ids in the vocabulary, offsets monotone, output sizes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MAX_ORDER 16 /* orders above this are refused; KenLM's default limit is 6 */

static const uint64_t kMultiplier = 0x9E3779B97F4A7C15ULL;

/* One order k >= 2: its hash table and its per-entry probabilities (and backoffs if k < N). */
typedef struct {
    const uint64_t *keys;
    const int32_t *vals;
    const int64_t *bucket_start;
    uint64_t n_buckets;
    const float *prob;
    const float *backoff; /* NULL for the highest order */
    Py_ssize_t n_entries; /* len(prob) */
} Order;

typedef struct {
    PyObject_HEAD
    int order;
    int32_t bos_id, eos_id;
    Py_ssize_t vocab_size;
    const double *uni_prob;
    const double *uni_backoff; /* NULL when order == 1 */
    Order orders[MAX_ORDER];   /* orders[k] describes order k (k >= 2) */
    Py_buffer views[2 + 5 * MAX_ORDER];
    int n_views;
} ScorerObject;

/* ---- buffers ---------------------------------------------------------------------------- */

/* A read-only C-contiguous 1-D view of `obj` whose items are `itemsize` bytes of kind `kind`
 * ('f' float, 'i' signed, 'u' unsigned). Returns 0, or -1 with an exception set. */
static int
get_view_flags(PyObject *obj, Py_buffer *view, char kind, Py_ssize_t itemsize, const char *what,
               int flags)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | flags) < 0) {
        view->obj = NULL; /* nothing to release */
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') {
        fmt++; /* native little-endian on every platform we build for */
    }
    char c = fmt[0];
    char got = 0;
    if (c == 'f' || c == 'd') {
        got = 'f';
    } else if (c == 'b' || c == 'h' || c == 'i' || c == 'l' || c == 'q') {
        got = 'i';
    } else if (c == 'B' || c == 'H' || c == 'I' || c == 'L' || c == 'Q' || c == '?') {
        got = 'u';
    }
    if (view->ndim > 1 || view->itemsize != itemsize || got != kind || fmt[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s: expected a 1-D array of %c%zd, got format '%s'",
                     what, kind, itemsize * 8, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int
get_view(PyObject *obj, Py_buffer *view, char kind, Py_ssize_t itemsize, const char *what)
{
    return get_view_flags(obj, view, kind, itemsize, what, 0);
}

static Py_ssize_t
view_len(const Py_buffer *view)
{
    return view->len / view->itemsize;
}

/* Takes the next view slot of `self`; it is released in dealloc. */
static const void *
scorer_view(ScorerObject *self, PyObject *obj, char kind, Py_ssize_t itemsize, Py_ssize_t *len,
            const char *what)
{
    Py_buffer *view = &self->views[self->n_views];
    if (get_view(obj, view, kind, itemsize, what) < 0) {
        return NULL;
    }
    self->n_views++;
    *len = view_len(view);
    return view->buf;
}

/* ---- the hash lookup ---------------------------------------------------------------------- */

static inline int32_t
lookup(const Order *o, uint64_t key)
{
    uint64_t mixed = (key * kMultiplier) >> 32;
    uint64_t bucket = (mixed * o->n_buckets) >> 32; /* < n_buckets: mixed < 2**32 */
    int64_t lo = o->bucket_start[bucket], hi = o->bucket_start[bucket + 1];
    for (int64_t slot = lo; slot < hi; slot++) {
        if (o->keys[slot] == key) {
            return o->vals[slot];
        }
    }
    return -1;
}

/* ---- Scorer ------------------------------------------------------------------------------- */

static void
Scorer_dealloc(ScorerObject *self)
{
    for (int i = 0; i < self->n_views; i++) {
        PyBuffer_Release(&self->views[i]);
    }
    self->n_views = 0;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
check_tuple(PyObject *t, Py_ssize_t n, const char *what)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of %zd arrays", what, n);
        return -1;
    }
    return 0;
}

static int
Scorer_init(ScorerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"uni_prob", "uni_backoff", "probs", "backoffs", "keys",
                             "vals",     "bucket_start", "bos_id", "eos_id", NULL};
    PyObject *uni_prob, *uni_backoff, *probs, *backoffs, *keys, *vals, *starts;
    int bos_id, eos_id;
    if (self->n_views) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOii", kwlist, &uni_prob, &uni_backoff,
                                     &probs, &backoffs, &keys, &vals, &starts, &bos_id,
                                     &eos_id)) {
        return -1;
    }
    if (!PyTuple_Check(probs)) {
        PyErr_SetString(PyExc_TypeError, "probs must be a tuple of arrays (orders 2..N)");
        return -1;
    }
    Py_ssize_t order = PyTuple_GET_SIZE(probs) + 1;
    if (order > MAX_ORDER) {
        PyErr_Format(PyExc_ValueError, "order %zd is above the limit of %d", order, MAX_ORDER);
        return -1;
    }
    if (check_tuple(backoffs, order > 1 ? order - 2 : 0, "backoffs") < 0 ||
        check_tuple(keys, order - 1, "keys") < 0 || check_tuple(vals, order - 1, "vals") < 0 ||
        check_tuple(starts, order - 1, "bucket_start") < 0) {
        return -1;
    }
    self->order = (int)order;
    Py_ssize_t n;
    self->uni_prob = scorer_view(self, uni_prob, 'f', 8, &self->vocab_size, "uni_prob");
    if (!self->uni_prob) {
        return -1;
    }
    if (bos_id < 0 || bos_id >= self->vocab_size || eos_id < 0 || eos_id >= self->vocab_size) {
        PyErr_SetString(PyExc_ValueError, "bos_id/eos_id outside the vocabulary");
        return -1;
    }
    self->bos_id = bos_id;
    self->eos_id = eos_id;
    self->uni_backoff = NULL;
    if (order > 1) {
        self->uni_backoff = scorer_view(self, uni_backoff, 'f', 8, &n, "uni_backoff");
        if (!self->uni_backoff) {
            return -1;
        }
        if (n != self->vocab_size) {
            PyErr_SetString(PyExc_ValueError, "uni_backoff and uni_prob differ in length");
            return -1;
        }
    }
    for (Py_ssize_t k = 2; k <= order; k++) {
        Order *o = &self->orders[k];
        Py_ssize_t n_keys, n_vals, n_starts;
        o->prob = scorer_view(self, PyTuple_GET_ITEM(probs, k - 2), 'f', 4, &o->n_entries,
                              "probs");
        if (!o->prob) {
            return -1;
        }
        o->backoff = NULL;
        if (k < order) {
            o->backoff =
                scorer_view(self, PyTuple_GET_ITEM(backoffs, k - 2), 'f', 4, &n, "backoffs");
            if (!o->backoff) {
                return -1;
            }
            if (n != o->n_entries) {
                PyErr_Format(PyExc_ValueError, "order %zd: backoffs and probs differ in length",
                             k);
                return -1;
            }
        }
        o->keys = scorer_view(self, PyTuple_GET_ITEM(keys, k - 2), 'u', 8, &n_keys, "keys");
        if (!o->keys) {
            return -1;
        }
        o->vals = scorer_view(self, PyTuple_GET_ITEM(vals, k - 2), 'i', 4, &n_vals, "vals");
        if (!o->vals) {
            return -1;
        }
        o->bucket_start = scorer_view(self, PyTuple_GET_ITEM(starts, k - 2), 'i', 8, &n_starts,
                                      "bucket_start");
        if (!o->bucket_start) {
            return -1;
        }
        if (n_keys != n_vals || n_starts < 2 || (uint64_t)(n_starts - 1) > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "order %zd: malformed hash table", k);
            return -1;
        }
        o->n_buckets = (uint64_t)(n_starts - 1);
        /* Every bucket range inside the key array, every value an entry of this order. */
        int64_t prev = 0;
        for (Py_ssize_t b = 0; b < n_starts; b++) {
            int64_t s = o->bucket_start[b];
            if (s < prev || s > n_keys) {
                PyErr_Format(PyExc_ValueError, "order %zd: bucket_start out of range", k);
                return -1;
            }
            prev = s;
        }
        for (Py_ssize_t i = 0; i < o->bucket_start[n_starts - 1]; i++) {
            if (o->vals[i] < 0 || o->vals[i] >= o->n_entries) {
                PyErr_Format(PyExc_ValueError, "order %zd: a table value is out of range", k);
                return -1;
            }
        }
    }
    return 0;
}

/* Scores one text of `n` words (`words`), with <s>/</s> added as asked. Writes the per-token
 * log-probs and matched lengths when `lp` is not NULL (the <s> token is not written). Returns
 * the total in nats. */
static double
score_text(const ScorerObject *s, const int32_t *words, Py_ssize_t n, int bos, int eos,
           double *lp, int32_t *matched_out)
{
    const int order = s->order;
    /* KenLM's state: the entries found ending at the previous token, orders 1..len. */
    int32_t state[MAX_ORDER];
    int len = 0;
    double total = 0.0;
    Py_ssize_t n_tokens = n + eos;
    Py_ssize_t out = 0;
    if (bos) {
        /* <s> is context only: not scored, and it starts the chain like any word. */
        state[0] = s->bos_id;
        len = order > 1 ? 1 : 0; /* a unigram model keeps no context */
    }
    for (Py_ssize_t i = 0; i < n_tokens; i++) {
        int32_t w = i < n ? words[i] : s->eos_id;
        double p = s->uni_prob[w];
        int matched = 1;
        int32_t next[MAX_ORDER];
        next[0] = w;
        /* Extend the chain: order k's key is (order k-1 entry ending at the previous word) << 32
         * | w. The state holds those entries for k-1 = 1..len. */
        int k = 2;
        for (; k <= order && k - 1 <= len; k++) {
            uint64_t key = ((uint64_t)(uint32_t)state[k - 2] << 32) | (uint32_t)w;
            int32_t e = lookup(&s->orders[k], key);
            if (e < 0) {
                break;
            }
            p = s->orders[k].prob[e];
            next[k - 1] = e;
            matched = k;
        }
        /* FullScore: add the backoffs of the state's contexts of length >= matched (those not
         * extended by w). The state entry of length j is state[j-1]. */
        double backoff = 0.0;
        for (int j = matched; j <= len; j++) {
            backoff += j == 1 ? s->uni_backoff[state[0]] : s->orders[j].backoff[state[j - 1]];
        }
        p += backoff;
        total += p;
        if (lp) {
            lp[out] = p;
            matched_out[out] = matched;
            out++;
        }
        /* The new state: entries of orders 1..min(matched, N-1) ending at w. */
        len = matched < order ? matched : order - 1;
        memcpy(state, next, (size_t)len * sizeof(int32_t));
    }
    return total;
}

static PyObject *
Scorer_score(ScorerObject *self, PyObject *args)
{
    PyObject *ids_obj, *offsets_obj, *totals_obj, *lp_obj = Py_None, *len_obj = Py_None;
    int bos, eos;
    if (!PyArg_ParseTuple(args, "OOppO|OO:score", &ids_obj, &offsets_obj, &bos, &eos,
                          &totals_obj, &lp_obj, &len_obj)) {
        return NULL;
    }
    if (self->n_views == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is not initialised");
        return NULL;
    }
    if ((lp_obj == Py_None) != (len_obj == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "give both log_probs and lengths, or neither");
        return NULL;
    }
    Py_buffer ids = {0}, offsets = {0}, totals = {0}, lp = {0}, lens = {0};
    PyObject *result = NULL;
    int have_tokens = lp_obj != Py_None;
    if (get_view(ids_obj, &ids, 'i', 4, "ids") < 0) {
        return NULL;
    }
    if (get_view(offsets_obj, &offsets, 'i', 8, "offsets") < 0) {
        goto done;
    }
    if (get_view_flags(totals_obj, &totals, 'f', 8, "totals", PyBUF_WRITABLE) < 0) {
        goto done;
    }
    if (have_tokens) {
        if (get_view_flags(lp_obj, &lp, 'f', 8, "log_probs", PyBUF_WRITABLE) < 0 ||
            get_view_flags(len_obj, &lens, 'i', 4, "lengths", PyBUF_WRITABLE) < 0) {
            goto done;
        }
    }
    const int32_t *id = ids.buf;
    const int64_t *off = offsets.buf;
    Py_ssize_t n_ids = view_len(&ids), n_off = view_len(&offsets);
    if (n_off < 1 || off[0] != 0 || off[n_off - 1] != n_ids) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0 and end at len(ids)");
        goto done;
    }
    Py_ssize_t n_texts = n_off - 1;
    if (totals.len != n_texts * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "totals must be float64[len(offsets) - 1]");
        goto done;
    }
    if (have_tokens) {
        Py_ssize_t n_out = n_ids + (eos ? n_texts : 0);
        if (lp.len != n_out * (Py_ssize_t)sizeof(double) ||
            lens.len != n_out * (Py_ssize_t)sizeof(int32_t)) {
            PyErr_SetString(PyExc_ValueError,
                            "log_probs/lengths must be float64/int32[len(ids) + eos * texts]");
            goto done;
        }
    }
    for (Py_ssize_t t = 0; t < n_texts; t++) {
        if (off[t + 1] < off[t]) {
            PyErr_SetString(PyExc_ValueError, "offsets must not decrease");
            goto done;
        }
    }
    Py_ssize_t bad = -1;
    const Py_ssize_t vocab = self->vocab_size;
    double *tot = totals.buf;
    double *lp_buf = have_tokens ? lp.buf : NULL;
    int32_t *len_buf = have_tokens ? lens.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_ids; i++) {
        if (id[i] < 0 || id[i] >= vocab) {
            bad = i;
            break;
        }
    }
    if (bad < 0) {
        for (Py_ssize_t t = 0; t < n_texts; t++) {
            Py_ssize_t start = off[t], n = off[t + 1] - off[t];
            Py_ssize_t out = start + (eos ? t : 0);
            tot[t] = score_text(self, id + start, n, bos, eos, lp_buf ? lp_buf + out : NULL,
                                len_buf ? len_buf + out : NULL);
        }
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "ids[%zd] = %d is not a vocabulary id", bad, (int)id[bad]);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (lens.obj) {
        PyBuffer_Release(&lens);
    }
    if (lp.obj) {
        PyBuffer_Release(&lp);
    }
    if (totals.obj) {
        PyBuffer_Release(&totals);
    }
    if (offsets.obj) {
        PyBuffer_Release(&offsets);
    }
    PyBuffer_Release(&ids);
    return result;
}

static PyObject *
Scorer_get_order(ScorerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->order);
}

static PyMethodDef Scorer_methods[] = {
    {"score", (PyCFunction)Scorer_score, METH_VARARGS,
     "score(ids, offsets, bos, eos, totals, log_probs=None, lengths=None)\n--\n\n"
     "Scores the batch (int32 ids, int64 offsets) into `totals` (float64[texts]) and, when\n"
     "given, per-token `log_probs` (float64) and matched `lengths` (int32), both of length\n"
     "len(ids) + eos * texts. The GIL is released while scoring."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scorer_getset[] = {
    {"order", (getter)Scorer_get_order, NULL, "the model's order", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScorerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmserve.server.backends.ngram._kernel.Scorer",
    .tp_doc = PyDoc_STR("Scorer(uni_prob, uni_backoff, probs, backoffs, keys, vals, "
                        "bucket_start, bos_id, eos_id)\n--\n\n"
                        "One model's arrays (orders 2..N in the tuples), held for scoring."),
    .tp_basicsize = sizeof(ScorerObject),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scorer_init,
    .tp_dealloc = (destructor)Scorer_dealloc,
    .tp_methods = Scorer_methods,
    .tp_getset = Scorer_getset,
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "lmserve.server.backends.ngram._kernel",
    .m_doc = "The n-gram scoring loop in C (KenLM's FullScore over lmserve's hash tables).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__kernel(void)
{
    if (PyType_Ready(&ScorerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&kernel_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Scorer", (PyObject *)&ScorerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
