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
 * Each order k >= 2 has a probing hash table (`hashing.ProbingTable`): 16-byte slots
 * {uint64 key; float prob; float backoff}, four to a cache line, so finding an entry also brings
 * its log-prob and backoff. An order-k entry's key is `(slot of its order-(k-1) prefix) << 32 |
 * last word id` (order 1's "slot" is the word id); its home slot is
 *     mixed = (key * 0x9E3779B97F4A7C15) >> 32        (uint64, wrapping)
 *     home  = (mixed * n_home) >> 32
 * and it lies in the first slot from there holding it, before the first empty slot (key ~0).
 * Probing runs forward and never wraps; the table's last slot is always empty, so a walk always
 * ends inside the array.
 *
 * Every model has every suffix of an entry as an entry (`build.py` fills gaps as KenLM does), so
 * the first miss while extending the chain ends the search: no longer n-gram can match either.
 *
 * Memory-level parallelism: the keys of all of a token's lookups (orders 2..N) depend only on
 * the state left by the previous token, so the loop computes every home slot and prefetches
 * them all before resolving any; the cache misses of one token overlap instead of queueing.
 * And LANES texts advance together, one token each per round (issue all, then resolve all), so
 * the misses of different texts overlap too (KJV 5-gram: LANES 1 -> 2 -> 4 -> 8 gave about
 * 2.1 -> 2.4 -> 2.6 -> 2.8 x KenLM's in-process words/s).
 *
 * The model arrays are taken once, through the buffer protocol, by `Scorer(...)`, which keeps the
 * views (and so the numpy arrays or memory maps) alive and checks them once: lengths, dtypes and
 * the table shapes that keep every probe inside its array. `Scorer.score` then only
 * checks the per-call inputs (ids in the vocabulary, offsets monotone, output sizes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* Batches of at least this many tokens release the GIL while they are scored. */
#define RELEASE_GIL_MIN_TOKENS ((Py_ssize_t)1 << 16)

#define MAX_ORDER 16 /* orders above this are refused; KenLM's default limit is 6 */

static const uint64_t kMultiplier = 0x9E3779B97F4A7C15ULL;
static const uint64_t kEmpty = ~0ULL; /* never a key: slot indices stay below 2**32 - 1 */

/* One slot of a probing table; the Python side's `hashing.SLOT_DTYPE` (little-endian). */
typedef struct {
    uint64_t key;
    float prob;
    float backoff; /* 0 for the highest order */
} Slot;

_Static_assert(sizeof(Slot) == 16, "a slot is 16 bytes: four per cache line");

/* One order k >= 2: its probing table. */
typedef struct {
    const Slot *slots;
    uint64_t n_home;    /* home slots: [0, n_home); n_home < n_slots */
    Py_ssize_t n_slots; /* the last one is empty */
} Order;

typedef struct {
    PyObject_HEAD
    int order;
    int32_t bos_id, eos_id;
    Py_ssize_t vocab_size;
    const double *uni_prob;
    const double *uni_backoff; /* NULL when order == 1 */
    Order orders[MAX_ORDER + 1]; /* orders[k] describes order k (k >= 2) */
    Py_buffer views[2 + MAX_ORDER];
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

static inline uint64_t
home_slot(const Order *o, uint64_t key)
{
    uint64_t mixed = (key * kMultiplier) >> 32;
    return (mixed * o->n_home) >> 32; /* < n_home: mixed < 2**32 */
}

/* The slot holding `key`, probing from `slot` (its home), or -1. Stops at the first empty slot;
 * the table's last slot is empty, so the walk stays inside it. */
static inline int64_t
probe(const Order *o, uint64_t key, uint64_t slot)
{
    for (;;) {
        uint64_t got = o->slots[slot].key;
        if (got == key) {
            return (int64_t)slot;
        }
        if (got == kEmpty) {
            return -1;
        }
        slot++;
    }
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
    static char *kwlist[] = {"uni_prob", "uni_backoff", "tables", "n_home",
                             "bos_id",   "eos_id",      NULL};
    PyObject *uni_prob, *uni_backoff, *tables, *homes;
    int bos_id, eos_id;
    if (self->n_views) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOii", kwlist, &uni_prob, &uni_backoff,
                                     &tables, &homes, &bos_id, &eos_id)) {
        return -1;
    }
    if (!PyTuple_Check(tables)) {
        PyErr_SetString(PyExc_TypeError, "tables must be a tuple of arrays (orders 2..N)");
        return -1;
    }
    Py_ssize_t order = PyTuple_GET_SIZE(tables) + 1;
    if (order > MAX_ORDER) {
        PyErr_Format(PyExc_ValueError, "order %zd is above the limit of %d", order, MAX_ORDER);
        return -1;
    }
    if (check_tuple(homes, order - 1, "n_home") < 0) {
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
    if ((uint64_t)self->vocab_size >= kEmpty >> 32) {
        PyErr_SetString(PyExc_ValueError, "vocabulary too large for 32-bit word ids");
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
        Py_ssize_t n_words;
        const uint64_t *raw =
            scorer_view(self, PyTuple_GET_ITEM(tables, k - 2), 'u', 8, &n_words, "tables");
        if (!raw) {
            return -1;
        }
        unsigned long long n_home = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(homes, k - 2));
        if (n_home == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
        /* The shape that keeps every probe in bounds: home slots below n_home < n_slots, the
         * last slot empty, and slot indices (the next order's key prefixes) below 2**32 - 1. */
        o->slots = (const Slot *)raw;
        o->n_slots = n_words / 2;
        if (n_words % 2 || o->n_slots < 2 || (uint64_t)o->n_slots >= kEmpty >> 32 ||
            n_home < 1 || n_home >= (unsigned long long)o->n_slots ||
            o->slots[o->n_slots - 1].key != kEmpty) {
            PyErr_Format(PyExc_ValueError, "order %zd: malformed probing table", k);
            return -1;
        }
        o->n_home = (uint64_t)n_home;
    }
    return 0;
}

/* One text being scored, with KenLM's state; `score_batch` advances several at once. */
typedef struct {
    const int32_t *words; /* the text's ids; </s> follows them when eos */
    Py_ssize_t n_words, n_tokens, i; /* i: the next token to score */
    Py_ssize_t text;      /* index in the batch, for its total */
    double total;
    double *lp;           /* per-token outputs, or NULL */
    int32_t *matched_out;
    /* KenLM's state: what was found ending at the previous token, orders 1..len: state[0] is
     * the word id, state[j-1] for j >= 2 the slot of the order-j entry in its table. */
    uint32_t state[MAX_ORDER];
    int len;
    /* The pending lookups of token i, issued by `issue` and resolved by `resolve`. */
    uint32_t w;
    int n_try;
    uint64_t key[MAX_ORDER], home[MAX_ORDER];
} Lane;

/* Sets `lane` up for a text of `n` words starting at `words`. */
static void
lane_start(const ScorerObject *s, Lane *lane, Py_ssize_t text, const int32_t *words, Py_ssize_t n,
           int bos, int eos, double *lp, int32_t *matched_out)
{
    lane->words = words;
    lane->n_words = n;
    lane->n_tokens = n + eos;
    lane->i = 0;
    lane->text = text;
    lane->total = 0.0;
    lane->lp = lp;
    lane->matched_out = matched_out;
    lane->len = 0;
    if (bos) {
        /* <s> is context only: not scored, and it starts the chain like any word. */
        lane->state[0] = (uint32_t)s->bos_id;
        lane->len = s->order > 1 ? 1 : 0; /* a unigram model keeps no context */
    }
}

/* Token i's lookups: orders 2..len+1 can match, the order-k key extending the state's
 * order-(k-1) entry. Computes every key and home slot and prefetches them, so that the cache
 * misses overlap (with each other, and with the other lanes') instead of queueing. */
static inline void
issue(const ScorerObject *s, Lane *lane)
{
    lane->w = (uint32_t)(lane->i < lane->n_words ? lane->words[lane->i] : s->eos_id);
    int n_try = lane->len < s->order - 1 ? lane->len : s->order - 1;
    for (int j = 0; j < n_try; j++) {
        const Order *o = &s->orders[j + 2];
        lane->key[j] = ((uint64_t)lane->state[j] << 32) | lane->w;
        lane->home[j] = home_slot(o, lane->key[j]);
        __builtin_prefetch(&o->slots[lane->home[j]]);
    }
    lane->n_try = n_try;
}

/* Resolves token i's lookups in order (the first miss ends the chain), scores it with
 * FullScore's rule and moves the state on. */
static inline void
resolve(const ScorerObject *s, Lane *lane)
{
    const int order = s->order;
    const uint32_t w = lane->w;
    double p = s->uni_prob[w];
    int matched = 1;
    uint32_t next[MAX_ORDER];
    next[0] = w;
    for (int j = 0; j < lane->n_try; j++) {
        const Order *o = &s->orders[j + 2];
        int64_t slot = probe(o, lane->key[j], lane->home[j]);
        if (slot < 0) {
            break;
        }
        p = o->slots[slot].prob;
        next[j + 1] = (uint32_t)slot;
        matched = j + 2;
    }
    /* FullScore: add the backoffs of the state's contexts of length >= matched (those not
     * extended by w). The state entry of length j is state[j-1]. */
    double backoff = 0.0;
    for (int j = matched; j <= lane->len; j++) {
        backoff += j == 1 ? s->uni_backoff[lane->state[0]]
                          : s->orders[j].slots[lane->state[j - 1]].backoff;
    }
    p += backoff;
    lane->total += p;
    if (lane->lp) {
        lane->lp[lane->i] = p;
        lane->matched_out[lane->i] = matched;
    }
    /* The new state: entries of orders 1..min(matched, N-1) ending at w. */
    lane->len = matched < order ? matched : order - 1;
    memcpy(lane->state, next, (size_t)lane->len * sizeof(uint32_t));
    lane->i++;
}

/* Scores texts [0, n_texts) of a validated batch into `tot` (and the per-token outputs), LANES
 * texts at a time: each round issues one token's lookups for every lane, then resolves them, so
 * up to LANES * (N-1) independent misses are in flight. A lane that finishes its text takes the
 * next one. Results do not depend on LANES: every text is scored on its own state. */
#define LANES 8
static void
score_batch(const ScorerObject *s, const int32_t *id, const int64_t *off, Py_ssize_t n_texts,
            int bos, int eos, double *tot, double *lp_buf, int32_t *len_buf)
{
    Lane lanes[LANES];
    int n_live = 0;
    Py_ssize_t next_text = 0;
    for (;;) {
        /* Fill free lanes; texts with no token to score (empty, no </s>) end at once. */
        while (n_live < LANES && next_text < n_texts) {
            Py_ssize_t t = next_text++, start = off[t], n = off[t + 1] - off[t];
            Py_ssize_t out = start + (eos ? t : 0);
            if (n + eos == 0) {
                tot[t] = 0.0;
                continue;
            }
            lane_start(s, &lanes[n_live++], t, id + start, n, bos, eos,
                       lp_buf ? lp_buf + out : NULL, len_buf ? len_buf + out : NULL);
        }
        if (n_live == 0) {
            return;
        }
        for (int l = 0; l < n_live; l++) {
            issue(s, &lanes[l]);
        }
        for (int l = 0; l < n_live; l++) {
            resolve(s, &lanes[l]);
        }
        /* Retire finished lanes (moving the last live lane into the gap). */
        for (int l = 0; l < n_live;) {
            if (lanes[l].i == lanes[l].n_tokens) {
                tot[lanes[l].text] = lanes[l].total;
                lanes[l] = lanes[--n_live];
            } else {
                l++;
            }
        }
    }
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
    /* Only a long batch lets other threads run meanwhile: a thread that releases the GIL must
       win it back, and in a busy server that wait (up to the 5 ms switch interval) costs more
       than a typical request's whole scoring (~0.5 ms for 200 sentences). */
    PyThreadState *released = n_ids >= RELEASE_GIL_MIN_TOKENS ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n_ids; i++) {
        if (id[i] < 0 || id[i] >= vocab) {
            bad = i;
            break;
        }
    }
    if (bad < 0) {
        score_batch(self, id, off, n_texts, bos, eos, tot, lp_buf, len_buf);
    }
    if (released) {
        PyEval_RestoreThread(released);
    }
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
    .tp_doc = PyDoc_STR("Scorer(uni_prob, uni_backoff, tables, n_home, bos_id, eos_id)\n--\n\n"
                        "One model's arrays, held for scoring: float64 unigram log-probs and\n"
                        "backoffs, and per order 2..N a probing table (uint64 pairs) and its\n"
                        "number of home slots."),
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
    .m_doc = "The n-gram scoring loop in C (KenLM's FullScore over lmserve's probing tables).",
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
