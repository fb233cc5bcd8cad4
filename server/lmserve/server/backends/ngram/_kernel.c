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
 * Each order k >= 2 has a probing hash table (`_probing.h`, `hashing.ProbingTable`): slots
 * {uint64 key; float prob; float backoff} (16 bytes; the highest order's 12 bytes hold no
 * backoff), so finding an entry also brings its log-prob and backoff. An order-k entry's key is
 * `(slot of its order-(k-1) prefix) << 32 | last word id` (order 1's "slot" is the word id).
 *
 * Every model has every suffix of an entry as an entry (`build.py` fills gaps as KenLM does), so
 * the first miss while extending the chain ends the search: no longer n-gram can match either.
 *
 * Memory-level parallelism: scoring is bound by the cache misses of its lookups (about 2.3 per
 * token on the KJV 5-gram), so it runs order by order over a chunk of texts rather than token by
 * token. The order-k key of a token needs only the order-(k-1) entry ending at the token before
 * it, which the order-(k-1) pass has found for every position; within a pass every lookup is
 * independent, and the loop prefetches PREFETCH_AHEAD lookups ahead, keeping as many misses in
 * flight as the core allows. (A token-by-token walk must resolve a token's entries before it can
 * issue the next token's lookups; interleaving 8 texts that way was 10-20% slower, in-process
 * and through the server.) A last pass per text applies FullScore's rule to what was found.
 *
 * The model arrays are taken once, through the buffer protocol, by `Scorer(...)`, which keeps the
 * views (and so the numpy arrays or memory maps) alive and checks them once: lengths, dtypes and
 * the table shapes that keep every probe inside its array. `Scorer.score` then only
 * checks the per-call inputs (ids in the vocabulary, offsets monotone, output sizes).
 *
 * Next-token distributions (`Scorer.distributions`) look words up after the context, order by
 * order, as the scoring passes do. The candidates are the words of the bigrams after the
 * context's last word (`bigram_start`/`bigram_words`, 4 bytes a bigram): every suffix of an
 * entry is an entry, so no other word can match any longer context either. Per-context lists
 * of every order's children would cost more bytes per n-gram than the probing tables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_probing.h"

/* Batches of at least this many tokens release the GIL while they are scored. */
#define RELEASE_GIL_MIN_TOKENS ((Py_ssize_t)1 << 16)
/* Distributions release it from this many output cells (rows x vocabulary) on: at ~0.3 ns a
 * cell, about a millisecond of work, as long as a long scoring batch. */
#define RELEASE_GIL_MIN_CELLS ((Py_ssize_t)1 << 22)

#define MAX_ORDER 16 /* orders above this are refused; KenLM's default limit is 6 */

typedef struct {
    PyObject_HEAD
    int order;
    int32_t bos_id, eos_id;
    Py_ssize_t vocab_size;
    const double *uni_prob;
    const double *uni_backoff; /* NULL when order == 1 */
    Order orders[MAX_ORDER + 1]; /* orders[k] describes order k (k >= 2) */
    /* The words of the bigrams after word w: bigram_words[bigram_start[w] ..
     * bigram_start[w + 1]] (NULL: distributions look the whole vocabulary up). */
    const uint32_t *bigram_start, *bigram_words;
    Py_buffer views[4 + 3 * MAX_ORDER]; /* unigrams, bigram lists; per order table, levels */
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

/* ---- Scorer ------------------------------------------------------------------------------- */

/* The first index of an id outside [0, vocab), or -1. */
static Py_ssize_t
first_bad_id(const int32_t *id, Py_ssize_t n, Py_ssize_t vocab)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (id[i] < 0 || id[i] >= vocab) {
            return i;
        }
    }
    return -1;
}

/* A batch's text boundaries: offsets[0] == 0, non-decreasing, ending at n_ids. Returns the
 * number of texts, or -1 with ValueError set. */
static Py_ssize_t
check_offsets(const int64_t *off, Py_ssize_t n_off, Py_ssize_t n_ids)
{
    if (n_off < 1 || off[0] != 0 || off[n_off - 1] != n_ids) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0 and end at len(ids)");
        return -1;
    }
    for (Py_ssize_t t = 0; t + 1 < n_off; t++) {
        if (off[t + 1] < off[t]) {
            PyErr_SetString(PyExc_ValueError, "offsets must not decrease");
            return -1;
        }
    }
    return n_off - 1;
}


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

/* A compact order's layout (`compact.CompactTable.kernel_layout`): (word_bits, key_bits,
 * low_bits, disp_bits, prob_levels, backoff_levels), the levels float32[256] (backoff_levels
 * empty for the highest order). Returns 0, or -1 with an exception set. */
static int
init_compact(ScorerObject *self, Order *o, PyObject *layout, int final, int k)
{
    unsigned word_bits, key_bits, low_bits, disp_bits;
    PyObject *prob_levels, *backoff_levels;
    if (!PyArg_ParseTuple(layout, "IIIIOO;a compact layout", &word_bits, &key_bits, &low_bits,
                          &disp_bits, &prob_levels, &backoff_levels)) {
        return -1;
    }
    const unsigned value_bits = final ? 8 : 16;
    if (key_bits < 1 || key_bits > 62 || word_bits >= key_bits || low_bits < 1 ||
        low_bits > key_bits || disp_bits < 1 || low_bits + disp_bits + value_bits > 64 ||
        (1ULL << word_bits) < (uint64_t)self->vocab_size) {
        PyErr_Format(PyExc_ValueError, "order %d: malformed compact layout", k);
        return -1;
    }
    Py_ssize_t n;
    o->prob_levels = scorer_view(self, prob_levels, 'f', 4, &n, "prob_levels");
    if (!o->prob_levels) {
        return -1;
    }
    if (n != 256) {
        PyErr_Format(PyExc_ValueError, "order %d: 256 prob levels expected", k);
        return -1;
    }
    o->backoff_levels = scorer_view(self, backoff_levels, 'f', 4, &n, "backoff_levels");
    if (!o->backoff_levels) {
        return -1;
    }
    if (n != (final ? 0 : 256)) {
        PyErr_Format(PyExc_ValueError, "order %d: %d backoff levels expected", k, final ? 0 : 256);
        return -1;
    }
    if (final) {
        o->backoff_levels = NULL;
    }
    o->compact = 1;
    o->word_bits = word_bits;
    o->key_bits = key_bits;
    o->low_bits = low_bits;
    o->disp_bits = disp_bits;
    o->value_shift = low_bits + disp_bits;
    o->key_mask = (1ULL << key_bits) - 1;
    o->low_mask = (1ULL << low_bits) - 1;
    o->disp_mask = (1ULL << disp_bits) - 1;
    const unsigned slot_bits = low_bits + disp_bits + value_bits;
    o->stride = (slot_bits + 7) / 8;
    o->slot_mask = o->stride >= 8 ? ~0ULL : (1ULL << (8 * o->stride)) - 1;
    return 0;
}

static int
Scorer_init(ScorerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"uni_prob", "uni_backoff", "tables",       "n_home",
                             "bos_id",   "eos_id",      "layouts",      "bigram_start",
                             "bigram_words", NULL};
    PyObject *uni_prob, *uni_backoff, *tables, *homes, *layouts = Py_None;
    PyObject *bigram_start = Py_None, *bigram_words = Py_None;
    int bos_id, eos_id;
    if (self->n_views) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOii|OOO", kwlist, &uni_prob, &uni_backoff,
                                     &tables, &homes, &bos_id, &eos_id, &layouts, &bigram_start,
                                     &bigram_words)) {
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
    if (check_tuple(homes, order - 1, "n_home") < 0 ||
        (layouts != Py_None && check_tuple(layouts, order - 1, "layouts") < 0)) {
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
        Py_ssize_t n_bytes;
        const unsigned char *raw =
            scorer_view(self, PyTuple_GET_ITEM(tables, k - 2), 'u', 1, &n_bytes, "tables");
        if (!raw) {
            return -1;
        }
        unsigned long long n_home = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(homes, k - 2));
        if (n_home == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
        /* The shape that keeps every probe in bounds: home slots below n_home < n_slots, the
         * last slot empty, and slot indices (the next order's key prefixes) below 2**32 - 1. */
        o->slots = raw;
        o->stride = k == order ? FINAL_SLOT_BYTES : CONTEXT_SLOT_BYTES;
        PyObject *layout = layouts == Py_None ? Py_None : PyTuple_GET_ITEM(layouts, k - 2);
        Py_ssize_t padding = 0;
        if (layout != Py_None) {
            if (init_compact(self, o, layout, k == order, (int)k) < 0) {
                return -1;
            }
            padding = 8; /* every slot can be read as a uint64 */
        }
        o->n_slots = (int64_t)((n_bytes - padding) / (Py_ssize_t)o->stride);
        o->n_home = (uint64_t)n_home;
        if (n_bytes < padding || (n_bytes - padding) % (Py_ssize_t)o->stride ||
            o->n_slots < 2 || (uint64_t)o->n_slots >= kEmpty >> 32 || n_home < 1 ||
            n_home >= (unsigned long long)o->n_slots ||
            !slot_empty(o, (uint64_t)o->n_slots - 1)) {
            PyErr_Format(PyExc_ValueError, "order %zd: malformed probing table", k);
            return -1;
        }
    }
    self->bigram_start = NULL;
    self->bigram_words = NULL;
    if ((bigram_start == Py_None) != (bigram_words == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "give both bigram_start and bigram_words, or neither");
        return -1;
    }
    if (bigram_start != Py_None && order > 1) {
        Py_ssize_t n_start, n_words;
        const uint32_t *start =
            scorer_view(self, bigram_start, 'u', 4, &n_start, "bigram_start");
        if (!start) {
            return -1;
        }
        const uint32_t *words = scorer_view(self, bigram_words, 'u', 4, &n_words, "bigram_words");
        if (!words) {
            return -1;
        }
        /* Offsets that stay inside `words`; the words themselves are checked where read. */
        int ok = n_start == self->vocab_size + 1 && start[0] == 0 &&
                 (Py_ssize_t)start[n_start - 1] == n_words;
        for (Py_ssize_t i = 0; ok && i + 1 < n_start; i++) {
            ok = start[i] <= start[i + 1];
        }
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "malformed bigram lists");
            return -1;
        }
        self->bigram_start = start;
        self->bigram_words = words;
    }
    return 0;
}

/* ---- scoring, order by order ----------------------------------------------------------------
 *
 * A chunk of texts is laid out as positions: per text a lead position (<s> with bos, else one
 * that is no context), then its tokens (its words, then </s> with eos). found[k-1][p] is the slot
 * of the order-k entry ending at position p, or kMiss (order 1's "slot" is the word id, kMiss for
 * a lead without <s>); prob and backoff keep that entry's values, read when it was found, so that
 * the last pass reads no table. */
#define PREFETCH_AHEAD 16        /* lookups prefetched ahead of the one being resolved */
#define CHUNK_POSITIONS 1024     /* positions per chunk: the scratch (~80 bytes each) stays in L2 */
static const uint32_t kMiss = ~0U;

typedef struct {
    uint32_t *found[MAX_ORDER]; /* found[k-1]: order k = 1..N */
    float *prob[MAX_ORDER];     /* [k-1]: the found order-k entry's log-prob, k >= 2 */
    float *backoff[MAX_ORDER];  /* [k-1]: and its backoff */
    uint32_t *pos;              /* one pass's lookups: position, key, home slot */
    uint64_t *key, *home;
    uint8_t *lead;              /* 1 at each text's lead position */
    void *block;                /* one allocation holds them all */
} Scratch;

/* Scratch for chunks of up to `cap` positions. Returns 0, or -1 when out of memory. */
static int
scratch_alloc(Scratch *sc, int order, Py_ssize_t cap)
{
    const size_t n = (size_t)cap;
    const size_t per_position = (size_t)order * sizeof(uint32_t) +
                                (size_t)(order - 1) * 2 * sizeof(float) + sizeof(uint32_t) +
                                2 * sizeof(uint64_t) + 1;
    char *at = sc->block = malloc(n * per_position);
    if (!at) {
        return -1;
    }
    /* 8-byte arrays first: every array stays aligned to its item size. */
    sc->key = (uint64_t *)at, at += n * sizeof(uint64_t);
    sc->home = (uint64_t *)at, at += n * sizeof(uint64_t);
    for (int k = 0; k < order; k++) {
        sc->found[k] = (uint32_t *)at, at += n * sizeof(uint32_t);
        if (k > 0) { /* order 1's values are the unigram arrays themselves */
            sc->prob[k] = (float *)at, at += n * sizeof(float);
            sc->backoff[k] = (float *)at, at += n * sizeof(float);
        }
    }
    sc->pos = (uint32_t *)at, at += n * sizeof(uint32_t);
    sc->lead = (uint8_t *)at;
    return 0;
}

/* The order-k entries (k >= 2) ending at positions [0, n_pos). Position p is looked up when the
 * order-(k-1) entries ending at p - 1 (the context) and at p were both found: every suffix of an
 * entry is an entry, so without the latter the lookup would miss anyway (the token-by-token
 * walk's "first miss ends the chain"). */
static void
find_order(const ScorerObject *s, Scratch *sc, int k, Py_ssize_t n_pos)
{
    const Order *o = &s->orders[k];
    const uint32_t *prev = sc->found[k - 2], *word = sc->found[0];
    const uint8_t *lead = sc->lead;
    uint32_t *out = sc->found[k - 1];
    float *prob = sc->prob[k - 1], *backoff = sc->backoff[k - 1];
    Py_ssize_t n = 0;
    for (Py_ssize_t p = 0; p < n_pos; p++) {
        out[p] = kMiss;
        /* lead[0] is set, so prev[p - 1] is read from p = 1 on */
        if (lead[p] || prev[p - 1] == kMiss || prev[p] == kMiss) {
            continue;
        }
        const uint64_t key = order_key(o, prev[p - 1], word[p]);
        sc->pos[n] = (uint32_t)p;
        sc->key[n] = key;
        sc->home[n] = home_slot(o, key);
        n++;
    }
    for (Py_ssize_t i = 0; i < n && i < PREFETCH_AHEAD; i++) {
        __builtin_prefetch(slot_address(o, sc->home[i]));
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) {
            __builtin_prefetch(slot_address(o, sc->home[i + PREFETCH_AHEAD]));
        }
        const int64_t slot = probe(o, sc->key[i], sc->home[i]);
        if (slot >= 0) {
            const uint32_t p = sc->pos[i];
            out[p] = (uint32_t)slot;
            prob[p] = slot_prob(o, (uint64_t)slot);
            backoff[p] = slot_backoff(o, (uint64_t)slot);
        }
    }
}

/* Scores texts [t0, t1) of a validated batch (laid out from position 0) into `tot` and the
 * per-token outputs. */
static void
score_chunk(const ScorerObject *s, Scratch *sc, const int32_t *id, const int64_t *off,
            Py_ssize_t t0, Py_ssize_t t1, int bos, int eos, double *tot, double *lp_buf,
            int32_t *len_buf)
{
    const int order = s->order;
    uint32_t *word = sc->found[0];
    uint8_t *lead = sc->lead;
    Py_ssize_t p = 0;
    for (Py_ssize_t t = t0; t < t1; t++) {
        lead[p] = 1;
        word[p++] = bos ? (uint32_t)s->bos_id : kMiss;
        for (int64_t i = off[t]; i < off[t + 1]; i++) {
            lead[p] = 0;
            word[p++] = (uint32_t)id[i];
        }
        if (eos) {
            lead[p] = 0;
            word[p++] = (uint32_t)s->eos_id;
        }
    }
    for (int k = 2; k <= order; k++) {
        find_order(s, sc, k, p);
    }
    p = 0;
    for (Py_ssize_t t = t0; t < t1; t++) {
        /* The state at the lead: <s> is a context of length 1 (a unigram model keeps none). */
        int len = bos && order > 1 ? 1 : 0;
        p++;
        const Py_ssize_t n_tokens = off[t + 1] - off[t] + eos;
        const Py_ssize_t out = off[t] + (eos ? t : 0);
        double total = 0.0;
        for (Py_ssize_t i = 0; i < n_tokens; i++, p++) {
            int matched = 1;
            while (matched < order && sc->found[matched][p] != kMiss) {
                matched++;
            }
            double lp = matched == 1 ? s->uni_prob[word[p]] : sc->prob[matched - 1][p];
            /* FullScore: add the backoffs of the state's contexts of length >= matched (those
             * not extended by this token); the context of length j is found[j-1][p-1]. */
            for (int j = matched; j <= len; j++) {
                lp += j == 1 ? s->uni_backoff[word[p - 1]] : sc->backoff[j - 1][p - 1];
            }
            total += lp;
            if (lp_buf) {
                lp_buf[out + i] = lp;
                len_buf[out + i] = matched;
            }
            /* The new state: the entries of orders 1..min(matched, N-1) ending here. */
            len = matched < order ? matched : order - 1;
        }
        tot[t] = total;
    }
}

/* Scores texts [0, n_texts) of a validated batch into `tot` (and the per-token outputs), in
 * chunks of whole texts of up to CHUNK_POSITIONS positions (a longer text is a chunk of its own).
 * Returns 0, or -1 when the scratch could not be allocated (positions are uint32). */
static int
score_batch(const ScorerObject *s, const int32_t *id, const int64_t *off, Py_ssize_t n_texts,
            int bos, int eos, double *tot, double *lp_buf, int32_t *len_buf)
{
    const Py_ssize_t extra = 1 + eos; /* the lead, and </s> */
    Py_ssize_t cap = CHUNK_POSITIONS;
    for (Py_ssize_t t = 0; t < n_texts; t++) {
        const Py_ssize_t need = off[t + 1] - off[t] + extra;
        cap = need > cap ? need : cap;
    }
    Scratch sc;
    if (cap > (Py_ssize_t)UINT32_MAX || scratch_alloc(&sc, s->order, cap) < 0) {
        return -1;
    }
    for (Py_ssize_t t0 = 0, t1; t0 < n_texts; t0 = t1) {
        Py_ssize_t used = off[t0 + 1] - off[t0] + extra;
        for (t1 = t0 + 1; t1 < n_texts; t1++) {
            const Py_ssize_t need = off[t1 + 1] - off[t1] + extra;
            if (used + need > cap) {
                break;
            }
            used += need;
        }
        score_chunk(s, &sc, id, off, t0, t1, bos, eos, tot, lp_buf, len_buf);
    }
    free(sc.block);
    return 0;
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
    Py_ssize_t n_ids = view_len(&ids);
    Py_ssize_t n_texts = check_offsets(off, view_len(&offsets), n_ids);
    if (n_texts < 0) {
        goto done;
    }
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
    Py_ssize_t bad = -1;
    const Py_ssize_t vocab = self->vocab_size;
    double *tot = totals.buf;
    double *lp_buf = have_tokens ? lp.buf : NULL;
    int32_t *len_buf = have_tokens ? lens.buf : NULL;
    /* Only a long batch lets other threads run meanwhile: a thread that releases the GIL must
       win it back, and in a busy server that wait (up to the 5 ms switch interval) costs more
       than a typical request's whole scoring (~0.5 ms for 200 sentences). */
    PyThreadState *released = n_ids >= RELEASE_GIL_MIN_TOKENS ? PyEval_SaveThread() : NULL;
    bad = first_bad_id(id, n_ids, vocab);
    const int failed =
        bad < 0 && score_batch(self, id, off, n_texts, bos, eos, tot, lp_buf, len_buf) < 0;
    if (released) {
        PyEval_RestoreThread(released);
    }
    if (failed) {
        PyErr_NoMemory();
        goto done;
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

/* ---- next-token distributions ------------------------------------------------------------- */

/* KenLM's state after `[<s>] context` (`NgramModel.context_entries`): the context cut to its
 * last N-1 ids, `<s>` first when bos and the context is shorter than that, each word extending
 * the chain of entries found ending at the previous one (the first miss ends it). Writes the
 * window's ids to `window` and returns its length. */
static int
context_window(const ScorerObject *s, const int32_t *ctx, Py_ssize_t n, int bos,
               uint32_t *window)
{
    const int n_keep = s->order - 1;
    int n_win = 0;
    if (bos && n < n_keep) {
        window[n_win++] = (uint32_t)s->bos_id;
    }
    for (Py_ssize_t i = n > n_keep ? n - n_keep : 0; i < n; i++) {
        window[n_win++] = (uint32_t)ctx[i];
    }
    return n_win;
}

/* The state after `window` (KenLM's, minimised): found[0] the last word, found[j-1] for j >= 2
 * the slot of the order-j entry ending at it, each word extending the chain found at the word
 * before (the first miss ends it), at most N-1 entries. Returns their number. */
static int
walk_window(const ScorerObject *s, const uint32_t *window, int n_win, uint32_t *found)
{
    const int n_keep = s->order - 1;
    uint32_t now[MAX_ORDER];
    int n_found = 0;
    for (int i = 0; i < n_win; i++) {
        const uint32_t w = window[i];
        int n_now = 1;
        now[0] = w;
        const int n_try = n_found < n_keep - 1 ? n_found : n_keep - 1;
        for (int j = 0; j < n_try; j++) {
            const Order *o = &s->orders[j + 2];
            const uint64_t key = order_key(o, found[j], w);
            const int64_t slot = probe(o, key, home_slot(o, key));
            if (slot < 0) {
                break;
            }
            now[n_now++] = (uint32_t)slot;
        }
        memcpy(found, now, (size_t)n_now * sizeof(uint32_t));
        n_found = n_now;
    }
    return n_keep == 0 ? 0 : n_found; /* a unigram model keeps no context */
}

/* The backoffs of a state's entries, by order 1..n_found. */
static void
state_backoffs(const ScorerObject *s, const uint32_t *found, int n_found, double *backoff)
{
    for (int j = 0; j < n_found; j++) {
        backoff[j] = j == 0 ? s->uni_backoff[found[0]] : slot_backoff(&s->orders[j + 1], found[j]);
    }
}

/* `distribution_row` from a state (`walk_window`'s `found`) instead of a window. */
static void
state_row(const ScorerObject *s, const uint32_t *found, int n_found, float *row, uint32_t *word,
          uint64_t *key, uint64_t *home)
{
    double backoff[MAX_ORDER];
    state_backoffs(s, found, n_found, backoff);
    double total = 0.0;
    for (int j = 0; j < n_found; j++) {
        total += backoff[j];
    }
    /* Locals: with -fno-strict-aliasing a store to `row` could change `s->vocab_size`, and
     * the loop would not be vectorised. */
    const double *uni = s->uni_prob;
    const Py_ssize_t v = s->vocab_size;
    for (Py_ssize_t w = 0; w < v; w++) {
        row[w] = (float)(uni[w] + total);
    }
    /* The candidates: the words of the bigrams after the context's last word. */
    Py_ssize_t n_words = 0;
    if (n_found > 0 && s->bigram_start) {
        const uint32_t lo = s->bigram_start[found[0]], hi = s->bigram_start[found[0] + 1];
        for (uint32_t i = lo; i < hi; i++) {
            if ((Py_ssize_t)s->bigram_words[i] < v) { /* a damaged file's word is skipped */
                word[n_words++] = s->bigram_words[i];
            }
        }
    } else if (n_found > 0) {
        for (Py_ssize_t w = 0; w < v; w++) {
            word[n_words++] = (uint32_t)w;
        }
    }
    for (int j = 0; j < n_found && n_words > 0; j++) {
        /* After the context entry of order j+1: order j+2. */
        const Order *o = &s->orders[j + 2];
        const uint64_t prefix = found[j];
        double longer = 0.0;
        for (int i = j + 1; i < n_found; i++) {
            longer += backoff[i];
        }
        for (Py_ssize_t i = 0; i < n_words; i++) {
            key[i] = order_key(o, prefix, word[i]);
            home[i] = home_slot(o, key[i]);
        }
        for (Py_ssize_t i = 0; i < n_words && i < PREFETCH_AHEAD; i++) {
            __builtin_prefetch(slot_address(o, home[i]));
        }
        Py_ssize_t n_next = 0;
        for (Py_ssize_t i = 0; i < n_words; i++) {
            if (i + PREFETCH_AHEAD < n_words) {
                __builtin_prefetch(slot_address(o, home[i + PREFETCH_AHEAD]));
            }
            const uint32_t w = word[i];
            const int64_t slot = probe(o, key[i], home[i]);
            if (slot >= 0) {
                row[w] = (float)((double)slot_prob(o, (uint64_t)slot) + longer);
                word[n_next++] = w;
            }
        }
        n_words = n_next;
    }
}

/* log P(w | window) for every w into `row` (float32[V]), as `NgramModel.next_token_log_probs`:
 * the unigram log-prob plus the backoffs of every context entry; then, order by order, the
 * words w for which the context entry of length j is followed by w (an order-(j+1) entry),
 * written with that entry's log-prob plus the backoffs of the longer context entries. Only the
 * bigram list's words can follow the length-1 entry, and every suffix of an entry is an entry,
 * so only the words found after the length-j context are looked up after the length-(j+1) one;
 * the longest match writes last. `word`, `key` and `home` are scratch of V items. Sums in
 * float64. */
static void
distribution_row(const ScorerObject *s, const uint32_t *window, int n_win, float *row,
                 uint32_t *word, uint64_t *key, uint64_t *home)
{
    uint32_t found[MAX_ORDER];
    const int n_found = walk_window(s, window, n_win, found);
    state_row(s, found, n_found, row, word, key, home);
}

static int get_matrix_view(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t cols,
                           const char *what);

/* ---- word lookups from a state ---------------------------------------------------------------
 *
 * log P(w | state) for one word w, and the state after it, without a distribution: the chain
 * of entries (state[j], w) of orders 2.. looked up until the first miss, as `state_row` looks
 * the word up (every suffix of an entry is an entry, so no longer one can match), and the value
 * computed with the very same float64 sums, rounded to float32: equal, bit for bit, to the
 * distribution row's entry. The new state is the chain found (w, then the slots), at most N-1
 * entries: what `walk_window` gives for the history extended by w. */
static int
lookup_word(const ScorerObject *s, const uint32_t *found, int n_found, const double *backoff,
            uint32_t w, float *lp, uint32_t *next)
{
    const int n_keep = s->order - 1;
    uint32_t now[MAX_ORDER + 1];
    now[0] = w;
    int n_now = 1;
    for (int j = 0; j < n_found; j++) {
        const Order *o = &s->orders[j + 2];
        const uint64_t key = order_key(o, found[j], w);
        const int64_t slot = probe(o, key, home_slot(o, key));
        if (slot < 0) {
            break;
        }
        now[n_now++] = (uint32_t)slot;
    }
    if (n_now == 1) {
        double total = 0.0;
        for (int j = 0; j < n_found; j++) {
            total += backoff[j];
        }
        *lp = (float)(s->uni_prob[w] + total);
    } else {
        /* The longest entry is of order n_now; the context entries longer than its context
         * (orders n_now..n_found) add their backoffs. */
        double longer = 0.0;
        for (int i = n_now - 1; i < n_found; i++) {
            longer += backoff[i];
        }
        const Order *o = &s->orders[n_now];
        *lp = (float)((double)slot_prob(o, now[n_now - 1]) + longer);
    }
    const int n_next = n_now < n_keep ? n_now : n_keep;
    memcpy(next, now, (size_t)(n_next > 0 ? n_next : 0) * sizeof(uint32_t));
    return n_next > 0 ? n_next : 0;
}

/* A state given from Python: a tuple of at most N-1 ints, the word below the vocabulary size
 * and each slot inside its order's table (whatever else it holds, every read stays in bounds).
 * Returns its length, or -1 with an exception set. */
static int
read_state(const ScorerObject *s, PyObject *obj, Py_ssize_t row, uint32_t *found)
{
    if (!PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "states[%zd] must be a tuple of ints", row);
        return -1;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(obj);
    if (n > s->order - 1) {
        PyErr_Format(PyExc_ValueError, "states[%zd] holds %zd entries, more than order - 1", row,
                     n);
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        const unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(obj, j));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
        const uint64_t bound = j == 0 ? (uint64_t)s->vocab_size : (uint64_t)s->orders[j + 1].n_slots;
        if (v >= bound) {
            PyErr_Format(PyExc_ValueError, "states[%zd] is not a state of this model", row);
            return -1;
        }
        found[j] = (uint32_t)v;
    }
    return (int)n;
}

static PyObject *
new_state(const uint32_t *found, int n)
{
    PyObject *t = PyTuple_New(n);
    if (!t) {
        return NULL;
    }
    for (int j = 0; j < n; j++) {
        PyObject *v = PyLong_FromUnsignedLong(found[j]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, j, v);
    }
    return t;
}

static PyObject *
Scorer_score_next(ScorerObject *self, PyObject *args)
{
    PyObject *states_obj, *words_obj;
    if (!PyArg_ParseTuple(args, "OO:score_next", &states_obj, &words_obj)) {
        return NULL;
    }
    if (self->n_views == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is not initialised");
        return NULL;
    }
    PyObject *states = PySequence_Fast(states_obj, "states must be a sequence of tuples");
    if (!states) {
        return NULL;
    }
    PyObject *words = PySequence_Fast(words_obj, "words must be a sequence of ints");
    PyObject *lps = NULL, *nexts = NULL, *result = NULL;
    if (!words) {
        goto done;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(states);
    if (PySequence_Fast_GET_SIZE(words) != n) {
        PyErr_SetString(PyExc_ValueError, "states and words differ in length");
        goto done;
    }
    lps = PyList_New(n);
    nexts = PyList_New(n);
    if (!lps || !nexts) {
        goto done;
    }
    uint32_t found[MAX_ORDER], next[MAX_ORDER + 1];
    double backoff[MAX_ORDER];
    int n_found = 0;
    PyObject *last = NULL; /* rows from one state (a node's arcs) read it once */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *state = PySequence_Fast_GET_ITEM(states, i);
        if (state != last) {
            n_found = read_state(self, state, i, found);
            if (n_found < 0) {
                goto done;
            }
            state_backoffs(self, found, n_found, backoff);
            last = state;
        }
        const long w = PyLong_AsLong(PySequence_Fast_GET_ITEM(words, i));
        if (w == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (w < 0 || w >= self->vocab_size) {
            PyErr_Format(PyExc_ValueError, "words[%zd] = %ld is not a vocabulary id", i, w);
            goto done;
        }
        float lp;
        const int n_next = lookup_word(self, found, n_found, backoff, (uint32_t)w, &lp, next);
        PyObject *value = PyFloat_FromDouble((double)lp);
        if (!value) {
            goto done;
        }
        PyList_SET_ITEM(lps, i, value);
        PyObject *t = new_state(next, n_next);
        if (!t) {
            goto done;
        }
        PyList_SET_ITEM(nexts, i, t);
    }
    result = PyTuple_Pack(2, lps, nexts);
done:
    Py_XDECREF(lps);
    Py_XDECREF(nexts);
    Py_XDECREF(words);
    Py_DECREF(states);
    return result;
}

static PyObject *
Scorer_state_distributions(ScorerObject *self, PyObject *args)
{
    PyObject *states_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OO:state_distributions", &states_obj, &out_obj)) {
        return NULL;
    }
    if (self->n_views == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is not initialised");
        return NULL;
    }
    PyObject *states = PySequence_Fast(states_obj, "states must be a sequence of tuples");
    if (!states) {
        return NULL;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(states);
    const Py_ssize_t v = self->vocab_size;
    Py_buffer out = {0};
    PyObject *result = NULL;
    uint32_t *word = NULL;
    uint64_t *key = NULL, *home = NULL;
    if (get_matrix_view(out_obj, &out, n, v, "out") < 0) {
        goto done;
    }
    word = PyMem_Malloc((size_t)v * sizeof(uint32_t) + 1);
    key = PyMem_Malloc((size_t)v * sizeof(uint64_t) + 1);
    home = PyMem_Malloc((size_t)v * sizeof(uint64_t) + 1);
    if (!word || !key || !home) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t found[MAX_ORDER];
        const int n_found = read_state(self, PySequence_Fast_GET_ITEM(states, i), i, found);
        if (n_found < 0) {
            goto done;
        }
        state_row(self, found, n_found, (float *)out.buf + i * v, word, key, home);
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(word);
    PyMem_Free(key);
    PyMem_Free(home);
    if (out.obj) {
        PyBuffer_Release(&out);
    }
    Py_DECREF(states);
    return result;
}

/* Scratch for `distributions_batch`: each row's window, and an open-addressing table of the
 * rows that were filled (by window), so that a row whose context another row already has
 * (beams, samples of one prompt) copies that row instead of filling it again: a copy costs
 * about half a fill (KJV 3-gram, V = 12k: ~1.5 us against ~3-4 us). */
typedef struct {
    uint32_t *windows; /* [n_rows][MAX_ORDER] */
    int *lengths;      /* [n_rows] */
    Py_ssize_t *table; /* [mask + 1]: a filled row, or -1 */
    uint64_t mask;
    uint32_t *word; /* [V]: `distribution_row`'s scratch */
    uint64_t *key;  /* [V] */
    uint64_t *home; /* [V] */
} Dedup;

static int
dedup_alloc(Dedup *d, Py_ssize_t n_rows, Py_ssize_t vocab)
{
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n_rows) {
        cap *= 2;
    }
    d->mask = cap - 1;
    d->windows = PyMem_Malloc((size_t)n_rows * MAX_ORDER * sizeof(uint32_t) + 1);
    d->lengths = PyMem_Malloc((size_t)n_rows * sizeof(int) + 1);
    d->table = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    d->word = PyMem_Malloc((size_t)vocab * sizeof(uint32_t) + 1);
    d->key = PyMem_Malloc((size_t)vocab * sizeof(uint64_t) + 1);
    d->home = PyMem_Malloc((size_t)vocab * sizeof(uint64_t) + 1);
    if (!d->windows || !d->lengths || !d->table || !d->word || !d->key || !d->home) {
        PyErr_NoMemory();
        return -1;
    }
    memset(d->table, 0xff, (size_t)cap * sizeof(Py_ssize_t)); /* all -1 */
    return 0;
}

static void
dedup_free(Dedup *d)
{
    PyMem_Free(d->windows);
    PyMem_Free(d->lengths);
    PyMem_Free(d->table);
    PyMem_Free(d->word);
    PyMem_Free(d->key);
    PyMem_Free(d->home);
}

/* Rows [0, n_rows) of a validated batch into `out` [n_rows, V]. */
static void
distributions_batch(const ScorerObject *s, const int32_t *id, const int64_t *off,
                    Py_ssize_t n_rows, int bos, float *out, Dedup *d)
{
    const Py_ssize_t v = s->vocab_size;
    for (Py_ssize_t b = 0; b < n_rows; b++) {
        float *row = out + b * v;
        uint32_t *window = d->windows + b * MAX_ORDER;
        const int n_win = context_window(s, id + off[b], off[b + 1] - off[b], bos, window);
        d->lengths[b] = n_win;
        uint64_t h = (uint64_t)n_win;
        for (int i = 0; i < n_win; i++) {
            h = (h ^ window[i]) * kMultiplier;
        }
        uint64_t at = (h >> 32) & d->mask;
        Py_ssize_t same = -1;
        for (; d->table[at] >= 0; at = (at + 1) & d->mask) {
            const Py_ssize_t r = d->table[at];
            if (d->lengths[r] == n_win &&
                memcmp(d->windows + r * MAX_ORDER, window, (size_t)n_win * sizeof(uint32_t)) == 0) {
                same = r;
                break;
            }
        }
        if (same >= 0) {
            memcpy(row, out + same * v, (size_t)v * sizeof(float));
        } else {
            d->table[at] = b;
            distribution_row(s, window, n_win, row, d->word, d->key, d->home);
        }
    }
}

/* A writable C-contiguous float32 [rows, cols] view of `obj`. Returns 0, or -1 with an
 * exception set. */
static int
get_matrix_view(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t cols,
                const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        view->obj = NULL;
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') {
        fmt++;
    }
    if (fmt[0] != 'f' || fmt[1] != '\0' || view->itemsize != 4) {
        PyErr_Format(PyExc_TypeError, "%s: expected float32, got format '%s'", what,
                     view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    if (view->ndim != 2 || view->shape[0] != rows || view->shape[1] != cols) {
        PyErr_Format(PyExc_ValueError, "%s: expected shape (%zd, %zd) (contexts, vocabulary)",
                     what, rows, cols);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
Scorer_distributions(ScorerObject *self, PyObject *args)
{
    PyObject *ids_obj, *offsets_obj, *out_obj;
    int bos;
    if (!PyArg_ParseTuple(args, "OOpO:distributions", &ids_obj, &offsets_obj, &bos, &out_obj)) {
        return NULL;
    }
    if (self->n_views == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Scorer is not initialised");
        return NULL;
    }
    Py_buffer ids = {0}, offsets = {0}, out = {0};
    PyObject *result = NULL;
    if (get_view(ids_obj, &ids, 'i', 4, "ids") < 0) {
        return NULL;
    }
    if (get_view(offsets_obj, &offsets, 'i', 8, "offsets") < 0) {
        goto done;
    }
    const int32_t *id = ids.buf;
    const int64_t *off = offsets.buf;
    Py_ssize_t n_ids = view_len(&ids);
    Py_ssize_t n_rows = check_offsets(off, view_len(&offsets), n_ids);
    if (n_rows < 0) {
        goto done;
    }
    const Py_ssize_t bad = first_bad_id(id, n_ids, self->vocab_size);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "ids[%zd] = %d is not a vocabulary id", bad, (int)id[bad]);
        goto done;
    }
    if (get_matrix_view(out_obj, &out, n_rows, self->vocab_size, "out") < 0) {
        goto done;
    }
    Dedup dedup = {0};
    if (dedup_alloc(&dedup, n_rows, self->vocab_size) < 0) {
        dedup_free(&dedup);
        goto done;
    }
    /* Small batches keep the GIL (see Scorer_score): winning it back can cost more. */
    PyThreadState *released =
        n_rows * self->vocab_size >= RELEASE_GIL_MIN_CELLS ? PyEval_SaveThread() : NULL;
    distributions_batch(self, id, off, n_rows, bos, out.buf, &dedup);
    if (released) {
        PyEval_RestoreThread(released);
    }
    dedup_free(&dedup);
    result = Py_NewRef(Py_None);
done:
    if (out.obj) {
        PyBuffer_Release(&out);
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
     "len(ids) + eos * texts. Batches of 65536 tokens or more release the GIL while scored."},
    {"distributions", (PyCFunction)Scorer_distributions, METH_VARARGS,
     "distributions(ids, offsets, bos, out)\n--\n\n"
     "Fills `out` (float32 [contexts, vocabulary], C-contiguous) with log P(w | [<s>] context)\n"
     "in nats for every word w, one row per context (int32 ids, int64 offsets), as\n"
     "NgramModel.next_token_log_probs. The GIL is released for large outputs."},
    {"score_next", (PyCFunction)Scorer_score_next, METH_VARARGS,
     "score_next(states, words)\n--\n\n"
     "For each (state, word): log P(word | state) in nats, equal to the float32 entry of the\n"
     "state's distribution, and the state after the word. A state is a tuple of ints: the last\n"
     "word, then the slots of the order-2.. entries ending at it (KenLM's minimised state, at\n"
     "most order - 1 of them). Returns (list of floats, list of states)."},
    {"state_distributions", (PyCFunction)Scorer_state_distributions, METH_VARARGS,
     "state_distributions(states, out)\n--\n\n"
     "Fills `out` (float32 [states, vocabulary], C-contiguous) with each state's next-token\n"
     "log-probs, as `distributions` fills a row from the context that leads to the state."},
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
                        "backoffs, and per order 2..N a probing table (its slots as uint8\n"
                        "bytes: 16 per slot, 12 for the highest order) and its number of home\n"
                        "slots."),
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
