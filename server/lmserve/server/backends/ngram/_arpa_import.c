/*
 * lmserve.server.backends.ngram._arpa_import: an ARPA file's sections parsed straight into the
 * model's probing tables (`_probing.h`), in one pass, holding nothing but the tables.
 *
 * `arpa_import.py` frames the file (header, `\data\` counts, section lines, gzip) and hands each
 * section's body to `TableBuilder.feed` in blocks of whole lines. The builder parses a block's
 * lines (log10 prob, words, optional log10 backoff) and
 *   - order 1: gives each word the next id (file order) in its vocabulary hash, and stores its
 *     log-prob and backoff (natural logs, float32) by id;
 *   - order k >= 2: finds the slot of the line's (k-1)-word prefix by walking the prefix chain
 *     through the tables of orders 2..k-1, inserts `prefix slot << 32 | last word` with the
 *     values into order k's table (which the `\data\` count sized), and checks that the line's
 *     suffix (its last k-1 words) is an entry too.
 * Lookups run over a batch of lines, one order at a time, prefetching ahead (as the scoring
 * kernel does), so the cache misses of a table too large for the caches overlap.
 *
 * Missing prefixes and suffixes (SRILM-pruned files) get fill-in entries, as KenLM adds them
 * (`lm/search_hashed.cc`, FixSRI): probability the backed-off one, p(suffix) + backoff(context),
 * backoff 0. Inserting never moves an entry, so the slots already used as keys stay valid. A
 * table sized by its `\data\` count takes fill-ins up to 3/4 of its home slots; past that the
 * builder raises `TooManyFillIns`, and the caller builds the model in memory instead.
 *
 * Errors raise ValueError(line number, reason, offending bytes or None).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_probing.h"

#define MAX_ORDER 16
#define BATCH_LINES 4096     /* lines of one order looked up and inserted together */
#define PREFETCH_AHEAD 24
#define GROW_SLOTS 4096      /* overflow slots added when an insert reaches the last slot */
#define MIN_HOME_SLOTS 128   /* so that a small table has room for a few fill-ins too */
static const uint32_t kMiss = ~0U;

static PyObject *TooManyFillIns;

/* ---- the vocabulary: word bytes -> id ------------------------------------------------------
 *
 * Open addressing over 16-byte slots that hold a word's length and first 8 bytes beside its id:
 * most words are that short, so finding one touches one slot and nothing else (the tables being
 * built push everything else out of the caches). Longer words compare their rest in `bytes`. */

typedef struct {
    uint32_t id1;   /* id + 1; 0 when empty */
    uint32_t len;
    uint64_t head;  /* the first 8 bytes, zero-padded */
} VocabSlot;

typedef struct {
    char *bytes;          /* every word, one after another */
    size_t n_bytes, cap_bytes;
    uint64_t *start;      /* [n_words + 1] offsets into `bytes` */
    uint32_t n_words, cap_words;
    VocabSlot *slot;
    uint64_t mask;
} Vocab;

static inline uint64_t
word_head(const char *w, size_t n)
{
    uint64_t head = 0;
    memcpy(&head, w, n < 8 ? n : 8);
    return head;
}

static inline uint64_t
hash_word(const char *s, size_t n, uint64_t head)
{
    uint64_t h = (head ^ ((uint64_t)n << 56)) * kMultiplier;
    for (size_t i = 8; i < n; i += 8) {
        uint64_t x = 0;
        memcpy(&x, s + i, n - i < 8 ? n - i : 8);
        h = ((h ^ (h >> 29)) ^ x) * kMultiplier;
    }
    return h ^ (h >> 32);
}

static int
vocab_init(Vocab *v, uint64_t expected)
{
    uint64_t cap = 64;
    while (cap < 2 * expected) {
        cap *= 2;
    }
    v->mask = cap - 1;
    v->slot = calloc(cap, sizeof(VocabSlot));
    v->cap_words = expected > 16 ? (uint32_t)expected : 16;
    v->start = malloc((v->cap_words + 1) * sizeof(uint64_t));
    v->cap_bytes = 16 * (size_t)v->cap_words;
    v->bytes = malloc(v->cap_bytes);
    if (!v->slot || !v->start || !v->bytes) {
        return -1;
    }
    v->start[0] = 0;
    return 0;
}

static void
vocab_free(Vocab *v)
{
    free(v->bytes);
    free(v->start);
    free(v->slot);
}

/* The id of the word, or -1. `*at` gets the hash slot where it is or would go. */
static inline int64_t
vocab_find(const Vocab *v, const char *w, size_t n, uint64_t *at)
{
    const uint64_t head = word_head(w, n);
    uint64_t i = hash_word(w, n, head) & v->mask;
    for (;; i = (i + 1) & v->mask) {
        const VocabSlot *s = &v->slot[i];
        if (s->id1 == 0) {
            *at = i;
            return -1;
        }
        if (s->len == n && s->head == head &&
            (n <= 8 || memcmp(v->bytes + v->start[s->id1 - 1] + 8, w + 8, n - 8) == 0)) {
            *at = i;
            return s->id1 - 1;
        }
    }
}

/* Adds a word known to be absent (at hash slot `at`); returns its id, or -1 when out of memory. */
static int64_t
vocab_add(Vocab *v, const char *w, size_t n, uint64_t at)
{
    if (n >= UINT32_MAX) {
        return -1;
    }
    if (v->n_words + 1 >= v->cap_words) {
        v->cap_words *= 2;
        uint64_t *start = realloc(v->start, (v->cap_words + 1) * sizeof(uint64_t));
        if (!start) {
            return -1;
        }
        v->start = start;
    }
    if (2 * (uint64_t)(v->n_words + 1) > v->mask) { /* keep the load at most 1/2: rehash */
        const uint64_t cap = 2 * (v->mask + 1);
        VocabSlot *slot = calloc(cap, sizeof(VocabSlot));
        if (!slot) {
            return -1;
        }
        for (uint64_t j = 0; j <= v->mask; j++) {
            const VocabSlot *old = &v->slot[j];
            if (old->id1) {
                const char *word = v->bytes + v->start[old->id1 - 1];
                uint64_t i = hash_word(word, old->len, old->head) & (cap - 1);
                while (slot[i].id1) {
                    i = (i + 1) & (cap - 1);
                }
                slot[i] = *old;
            }
        }
        free(v->slot);
        v->slot = slot;
        v->mask = cap - 1;
        (void)vocab_find(v, w, n, &at);
    }
    if (v->n_bytes + n > v->cap_bytes) {
        size_t cap = 2 * v->cap_bytes;
        while (cap < v->n_bytes + n) {
            cap *= 2;
        }
        char *bytes = realloc(v->bytes, cap);
        if (!bytes) {
            return -1;
        }
        v->bytes = bytes;
        v->cap_bytes = cap;
    }
    memcpy(v->bytes + v->n_bytes, w, n);
    v->n_bytes += n;
    const uint32_t id = v->n_words++;
    v->start[id + 1] = v->n_bytes;
    v->slot[at] = (VocabSlot){.id1 = id + 1, .len = (uint32_t)n, .head = word_head(w, n)};
    return id;
}

/* ---- numbers ------------------------------------------------------------------------------ */

static const double kPow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                  1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                  1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Parses a whole token as a double, rounded as Python's float() rounds it. ARPA's numbers
 * ("-1.2345678") take the exact fast path: at most 19 digits whose value is below 2**53 and a
 * power of ten below 1e23 are both exact doubles, so one IEEE division or product is correctly
 * rounded (Clinger). Anything else goes to strtod. Returns 0, or -1 if it is not a number. */
static int
parse_number(const char *s, size_t n, double *out)
{
    const char *p = s, *end = s + n;
    int negative = 0;
    if (p < end && (*p == '-' || *p == '+')) {
        negative = *p == '-';
        p++;
    }
    uint64_t mantissa = 0;
    int digits = 0, scale = 0, any = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++, any = 1) {
        if (mantissa == 0 && *p == '0') {
            continue; /* leading zeros carry nothing */
        }
        mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        digits++;
    }
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, any = 1) {
            if (mantissa == 0 && *p == '0') {
                scale--;
                continue;
            }
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            digits++;
            scale--;
        }
    }
    if (any && p == end && digits <= 19 && mantissa < (1ULL << 53) && scale >= -22) {
        double value = (double)mantissa / kPow10[-scale];
        *out = negative ? -value : value;
        return 0;
    }
    /* The slow path: exponents, long mantissas, inf and nan. */
    char buf[128];
    if (n == 0 || n >= sizeof buf) {
        return -1;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *stop;
    *out = strtod(buf, &stop);
    return stop == buf + n ? 0 : -1;
}

/* ---- the tables being built --------------------------------------------------------------- */

typedef struct {
    PyObject *storage;  /* a bytearray holding the slots; resized as overflow slots are needed */
    Order o;            /* o.slots points into storage */
    int64_t n_entries, limit, fill_ins, last_used;
} Table;

typedef struct {
    PyObject_HEAD
    int order;
    int64_t counts[MAX_ORDER + 1];
    double ln10;
    Vocab vocab;
    float *uni_prob, *uni_backoff;  /* [counts[1]] */
    Table tables[MAX_ORDER + 1];    /* orders 2..N */
    int section;                    /* the order being fed, 0 before the first */
    int64_t filled;                 /* entries of that section so far */
    /* One batch of parsed lines of the section's order. */
    int n_batch;
    uint32_t *ids;                  /* [BATCH_LINES][order] */
    float *prob, *backoff;
    int64_t *line;
    uint32_t *cur;                  /* a line's prefix (or suffix) slot while walking */
    uint8_t *same;                  /* walked words a line shares with the line before it */
    uint64_t *key, *home;
} BuilderObject;

static int
table_init(Table *t, int64_t count, size_t stride)
{
    int64_t n_home = (int64_t)((double)count * 1.5);
    n_home = n_home < MIN_HOME_SLOTS ? MIN_HOME_SLOTS : n_home;
    const int64_t n_slots = n_home + GROW_SLOTS;
    t->storage = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n_slots * (int64_t)stride));
    if (!t->storage) {
        return -1;
    }
    memset(PyByteArray_AS_STRING(t->storage), 0xff, (size_t)(n_slots * (int64_t)stride));
    t->o.slots = (const unsigned char *)PyByteArray_AS_STRING(t->storage);
    t->o.n_home = (uint64_t)n_home;
    t->o.n_slots = n_slots;
    t->o.stride = stride;
    t->n_entries = 0;
    t->limit = n_home * 3 / 4;
    t->fill_ins = 0;
    t->last_used = -1;
    return 0;
}

/* Puts `key` (absent) with its values into the table from `slot` (its home) on; grows the
 * overflow when the walk reaches the last slot, which stays empty. Returns the slot, or -1 with
 * MemoryError set. */
static int64_t
table_put(Table *t, uint64_t key, uint64_t slot, float prob, float backoff)
{
    while (slot_key(&t->o, slot) != kEmpty) {
        slot++;
    }
    if ((int64_t)slot >= t->o.n_slots - 1) {
        const int64_t n_slots = t->o.n_slots + GROW_SLOTS + t->o.n_slots / 64;
        const Py_ssize_t old = PyByteArray_GET_SIZE(t->storage);
        if (PyByteArray_Resize(t->storage, (Py_ssize_t)(n_slots * (int64_t)t->o.stride)) < 0) {
            return -1;
        }
        memset(PyByteArray_AS_STRING(t->storage) + old, 0xff,
               (size_t)(PyByteArray_GET_SIZE(t->storage) - old));
        t->o.slots = (const unsigned char *)PyByteArray_AS_STRING(t->storage);
        t->o.n_slots = n_slots;
    }
    unsigned char *at = (unsigned char *)t->o.slots + slot * t->o.stride;
    memcpy(at, &key, 8);
    memcpy(at + 8, &prob, 4);
    if (t->o.stride == CONTEXT_SLOT_BYTES) {
        memcpy(at + 12, &backoff, 4);
    }
    t->n_entries++;
    if ((int64_t)slot > t->last_used) {
        t->last_used = (int64_t)slot;
    }
    return (int64_t)slot;
}

static int
fail_at(int64_t line, const char *reason, const char *got, size_t n_got)
{
    PyObject *bytes = got ? PyBytes_FromStringAndSize(got, (Py_ssize_t)(n_got > 80 ? 80 : n_got))
                          : Py_NewRef(Py_None);
    if (bytes) {
        PyObject *args = Py_BuildValue("(LsN)", (long long)line, reason, bytes);
        if (args) {
            PyErr_SetObject(PyExc_ValueError, args);
            Py_DECREF(args);
        }
    }
    return -1;
}

/* The slot of the entry of words w[0..len) (len >= 2) in order len's table, adding it (and the
 * prefixes and suffixes it lacks) as a fill-in when absent. Returns -1 with an exception set. */
static int64_t
ensure_entry(BuilderObject *b, const uint32_t *w, int len, int64_t line)
{
    Table *t = &b->tables[len];
    const int64_t prefix = len == 2 ? (int64_t)w[0] : ensure_entry(b, w, len - 1, line);
    if (prefix < 0) {
        return -1;
    }
    const uint64_t key = ((uint64_t)prefix << 32) | w[len - 1];
    const uint64_t home = home_slot(&t->o, key);
    const int64_t found = probe(&t->o, key, home);
    if (found >= 0) {
        return found;
    }
    const int64_t suffix = len == 2 ? (int64_t)w[1] : ensure_entry(b, w + 1, len - 1, line);
    if (suffix < 0) {
        return -1;
    }
    double prob;
    if (len == 2) {
        prob = (double)b->uni_prob[suffix] + (double)b->uni_backoff[prefix];
    } else {
        const Order *below = &b->tables[len - 1].o;
        prob = (double)slot_prob(below, (uint64_t)suffix) +
               (double)slot_backoff(below, (uint64_t)prefix);
    }
    if (t->n_entries >= t->limit) {
        PyErr_Format(TooManyFillIns,
                     "line %lld: order %d needs more fill-in entries than its table holds",
                     (long long)line, len);
        return -1;
    }
    t->fill_ins++;
    return table_put(t, key, home, (float)prob, 0.0f);
}

/* Looks up, for every line of the batch, the entry of its words [first, first + len) (len >= 2)
 * order by order into b->cur (kMiss where the chain breaks), prefetching ahead.
 *
 * ARPA writers sort each section, so a line mostly repeats words of the line before it in the
 * same places: SRILM's order (and the synthetic models') shares leading words, lmplz's shares
 * trailing ones, which are the leading words of the suffix walked from `first` = 1. A line
 * whose first j walked words equal the previous line's takes that line's entries up to order j
 * instead of looking them up. */
static void
walk_chain(BuilderObject *b, int first, int len)
{
    const int n = b->section, n_lines = b->n_batch;
    for (int i = 0; i < n_lines; i++) {
        b->cur[i] = b->ids[i * n + first];
        int same = 0;
        if (i > 0) {
            const uint32_t *now = b->ids + i * n + first, *before = now - n;
            while (same < len && now[same] == before[same]) {
                same++;
            }
        }
        b->same[i] = (uint8_t)same;
    }
    for (int k = 2; k <= len; k++) {
        const Order *o = &b->tables[k].o;
        for (int i = 0; i < n_lines; i++) {
            b->key[i] = ((uint64_t)b->cur[i] << 32) | b->ids[i * n + first + k - 1];
            b->home[i] = home_slot(o, b->key[i]);
        }
        for (int i = 0; i < n_lines && i < PREFETCH_AHEAD; i++) {
            __builtin_prefetch(slot_address(o, b->home[i]));
        }
        for (int i = 0; i < n_lines; i++) {
            if (i + PREFETCH_AHEAD < n_lines) {
                __builtin_prefetch(slot_address(o, b->home[i + PREFETCH_AHEAD]));
            }
            if (b->same[i] >= k) {
                b->cur[i] = b->cur[i - 1]; /* the same words: the previous line's entry */
            } else if (b->cur[i] != kMiss) {
                const int64_t slot = probe(o, b->key[i], b->home[i]);
                b->cur[i] = slot < 0 ? kMiss : (uint32_t)slot;
            }
        }
    }
}

/* Inserts the batch's lines into the section's table. Returns 0, or -1 with an exception. */
static int
flush_batch(BuilderObject *b)
{
    const int n = b->section, n_lines = b->n_batch;
    if (n_lines == 0) {
        return 0;
    }
    /* The prefixes: words [0, n-1). */
    if (n >= 3) {
        walk_chain(b, 0, n - 1);
    } else {
        for (int i = 0; i < n_lines; i++) {
            b->cur[i] = b->ids[i * n];
        }
    }
    for (int i = 0; i < n_lines; i++) {
        if (b->cur[i] == kMiss) {
            const int64_t slot = ensure_entry(b, b->ids + i * n, n - 1, b->line[i]);
            if (slot < 0) {
                return -1;
            }
            b->cur[i] = (uint32_t)slot;
        }
    }
    Table *t = &b->tables[n];
    for (int i = 0; i < n_lines; i++) {
        b->key[i] = ((uint64_t)b->cur[i] << 32) | b->ids[i * n + n - 1];
        b->home[i] = home_slot(&t->o, b->key[i]);
    }
    for (int i = 0; i < n_lines && i < PREFETCH_AHEAD; i++) {
        __builtin_prefetch(slot_address(&t->o, b->home[i]), 1);
    }
    for (int i = 0; i < n_lines; i++) {
        if (i + PREFETCH_AHEAD < n_lines) {
            __builtin_prefetch(slot_address(&t->o, b->home[i + PREFETCH_AHEAD]), 1);
        }
        if (probe(&t->o, b->key[i], b->home[i]) >= 0) {
            char what[64];
            snprintf(what, sizeof what, "duplicate %d-gram", n);
            return fail_at(b->line[i], what, NULL, 0);
        }
        if (table_put(t, b->key[i], b->home[i], b->prob[i], b->backoff[i]) < 0) {
            return -1;
        }
    }
    /* The suffixes: words [1, n). Order 2's suffix is a unigram, always there. */
    if (n >= 3) {
        walk_chain(b, 1, n - 1);
        for (int i = 0; i < n_lines; i++) {
            if (b->cur[i] == kMiss &&
                ensure_entry(b, b->ids + i * n + 1, n - 1, b->line[i]) < 0) {
                return -1;
            }
        }
    }
    b->n_batch = 0;
    return 0;
}

/* ---- parsing ------------------------------------------------------------------------------ */

/* The bytes Python's bytes.split() treats as whitespace, but the newline that ends a line. */
static unsigned char kSpace[256];

static inline int
is_space(char c)
{
    return kSpace[(unsigned char)c];
}

/* One line's fields (at most n + 2 are kept; `*n_fields` counts them all). */
static void
split_fields(const char *p, const char *end, const char **field, size_t *len, int max_fields,
             int *n_fields)
{
    int nf = 0;
    while (p < end) {
        while (p < end && is_space(*p)) {
            p++;
        }
        if (p == end) {
            break;
        }
        const char *start = p;
        while (p < end && !is_space(*p)) {
            p++;
        }
        if (nf < max_fields) {
            field[nf] = start;
            len[nf] = (size_t)(p - start);
        }
        nf++;
    }
    *n_fields = nf;
}

static int
parse_line(BuilderObject *b, const char *p, const char *end, int64_t line)
{
    const int n = b->section;
    const int has_backoff = n < b->order;
    const char *field[MAX_ORDER + 2];
    size_t len[MAX_ORDER + 2];
    int nf;
    split_fields(p, end, field, len, n + 2, &nf);
    if (nf == 0) {
        return 0; /* a blank line */
    }
    if (nf != n + 1 && !(nf == n + 2 && has_backoff)) {
        char what[96];
        if (has_backoff) {
            snprintf(what, sizeof what, "a %d-gram line needs %d or %d fields, it has %d", n,
                     n + 1, n + 2, nf);
        } else {
            snprintf(what, sizeof what, "a %d-gram line needs %d fields, it has %d", n, n + 1, nf);
        }
        return fail_at(line, what, NULL, 0);
    }
    if (b->filled >= b->counts[n]) {
        char what[96];
        snprintf(what, sizeof what, "\\data\\ declares %lld %d-grams, the section has more",
                 (long long)b->counts[n], n);
        return fail_at(line, what, NULL, 0);
    }
    double log10_prob, log10_backoff = 0.0;
    if (parse_number(field[0], len[0], &log10_prob) < 0) {
        return fail_at(line, "not a number", field[0], len[0]);
    }
    if (nf == n + 2 && parse_number(field[n + 1], len[n + 1], &log10_backoff) < 0) {
        return fail_at(line, "not a number", field[n + 1], len[n + 1]);
    }
    if (log10_prob > 0.0) {
        log10_prob = 0.0; /* KenLM clamps positive log-probabilities to 0 */
    }
    const float prob = (float)(log10_prob * b->ln10);
    const float backoff = (float)(log10_backoff * b->ln10);
    if (n == 1) {
        uint64_t at;
        if (vocab_find(&b->vocab, field[1], len[1], &at) >= 0) {
            return fail_at(line, "duplicate unigram", field[1], len[1]);
        }
        const int64_t id = vocab_add(&b->vocab, field[1], len[1], at);
        if (id < 0) {
            PyErr_NoMemory();
            return -1;
        }
        b->uni_prob[id] = prob;
        b->uni_backoff[id] = backoff;
        b->filled++;
        return 0;
    }
    uint32_t *ids = b->ids + b->n_batch * n;
    for (int j = 0; j < n; j++) {
        uint64_t at;
        const int64_t id = vocab_find(&b->vocab, field[1 + j], len[1 + j], &at);
        if (id < 0) {
            return fail_at(line, "a word is not among the unigrams", field[1 + j], len[1 + j]);
        }
        ids[j] = (uint32_t)id;
    }
    b->prob[b->n_batch] = prob;
    b->backoff[b->n_batch] = backoff;
    b->line[b->n_batch] = line;
    b->filled++;
    if (++b->n_batch == BATCH_LINES) {
        return flush_batch(b);
    }
    return 0;
}

/* ---- TableBuilder ------------------------------------------------------------------------- */

static void
builder_free_batch(BuilderObject *b)
{
    PyMem_Free(b->ids);
    PyMem_Free(b->prob);
    PyMem_Free(b->backoff);
    PyMem_Free(b->line);
    PyMem_Free(b->cur);
    PyMem_Free(b->same);
    PyMem_Free(b->key);
    PyMem_Free(b->home);
    b->ids = b->cur = NULL;
    b->same = NULL;
    b->prob = b->backoff = NULL;
    b->line = NULL;
    b->key = b->home = NULL;
}

static void
Builder_dealloc(BuilderObject *b)
{
    for (int k = 2; k <= MAX_ORDER; k++) {
        Py_CLEAR(b->tables[k].storage);
    }
    vocab_free(&b->vocab);
    free(b->uni_prob);
    free(b->uni_backoff);
    builder_free_batch(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int
Builder_init(BuilderObject *b, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"counts", "ln10", NULL};
    PyObject *counts;
    if (b->order) {
        PyErr_SetString(PyExc_RuntimeError, "TableBuilder is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!d", kwlist, &PyTuple_Type, &counts,
                                     &b->ln10)) {
        return -1;
    }
    const Py_ssize_t order = PyTuple_GET_SIZE(counts);
    if (order < 1 || order > MAX_ORDER) {
        PyErr_Format(PyExc_ValueError, "order %zd is outside 1..%d", order, MAX_ORDER);
        return -1;
    }
    for (Py_ssize_t k = 1; k <= order; k++) {
        const long long c = PyLong_AsLongLong(PyTuple_GET_ITEM(counts, k - 1));
        if (c == -1 && PyErr_Occurred()) {
            return -1;
        }
        /* Slot indices become the next order's keys: they must stay below 2**32 - 1. */
        if (c < 0 || (double)c * 1.5 + GROW_SLOTS >= 4294967295.0 ||
            (k == 1 && c >= 2147483647LL)) {
            PyErr_Format(PyExc_ValueError, "order %zd: %lld n-grams is beyond 32-bit slots", k, c);
            return -1;
        }
        b->counts[k] = c;
    }
    b->order = (int)order;
    if (vocab_init(&b->vocab, (uint64_t)b->counts[1]) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    b->uni_prob = malloc(((size_t)b->counts[1] + 1) * sizeof(float));
    b->uni_backoff = malloc(((size_t)b->counts[1] + 1) * sizeof(float));
    const size_t n_batch = BATCH_LINES;
    b->ids = PyMem_Malloc(n_batch * (size_t)order * sizeof(uint32_t));
    b->prob = PyMem_Malloc(n_batch * sizeof(float));
    b->backoff = PyMem_Malloc(n_batch * sizeof(float));
    b->line = PyMem_Malloc(n_batch * sizeof(int64_t));
    b->cur = PyMem_Malloc(n_batch * sizeof(uint32_t));
    b->same = PyMem_Malloc(n_batch);
    b->key = PyMem_Malloc(n_batch * sizeof(uint64_t));
    b->home = PyMem_Malloc(n_batch * sizeof(uint64_t));
    if (!b->uni_prob || !b->uni_backoff || !b->ids || !b->prob || !b->backoff || !b->line ||
        !b->cur || !b->same || !b->key || !b->home) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *
Builder_start_section(BuilderObject *b, PyObject *arg)
{
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (b->order == 0 || n != b->section + 1 || n > b->order) {
        PyErr_Format(PyExc_RuntimeError, "section %ld out of turn", n);
        return NULL;
    }
    if (flush_batch(b) < 0) {
        return NULL;
    }
    b->section = (int)n;
    b->filled = 0;
    if (n >= 2 && table_init(&b->tables[n], b->counts[n],
                             n == b->order ? FINAL_SLOT_BYTES : CONTEXT_SLOT_BYTES) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* feed(buffer, start, first_line, at_eof) -> (end, lines, section_over, filled): parses the
 * whole lines of the current section in buffer[start:], line `first_line` first, up to a line
 * that begins with a backslash (the next section or \end\: section_over, `end` at its start)
 * or to the last newline (the rest, an incomplete line, is left unless `at_eof`). `lines` counts
 * the lines consumed, `filled` the section's entries so far. */
static PyObject *
Builder_feed(BuilderObject *b, PyObject *args)
{
    Py_buffer block;
    Py_ssize_t start;
    long long first_line;
    int at_eof;
    if (!PyArg_ParseTuple(args, "y*nLp:feed", &block, &start, &first_line, &at_eof)) {
        return NULL;
    }
    if (b->section == 0 || start < 0 || start > block.len) {
        PyBuffer_Release(&block);
        PyErr_SetString(PyExc_RuntimeError, "feed before start_section, or start out of range");
        return NULL;
    }
    const char *base = block.buf;
    const char *p = base + start, *end = base + block.len;
    int64_t line = first_line;
    int failed = 0, over = 0;
    while (p < end) {
        if (*p == '\\') {
            over = 1;
            break;
        }
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol && !at_eof) {
            break; /* an incomplete line: the caller reads on */
        }
        const char *stop = eol ? eol : end;
        if (parse_line(b, p, stop, line) < 0) {
            failed = 1;
            break;
        }
        line++;
        p = eol ? eol + 1 : end;
    }
    PyBuffer_Release(&block);
    if (failed || flush_batch(b) < 0) {
        return NULL;
    }
    return Py_BuildValue("(nLOL)", (Py_ssize_t)(p - base), (long long)(line - first_line),
                         over ? Py_True : Py_False, (long long)b->filled);
}

/* The bigrams' second words grouped by their first word (`tables.NgramTables.bigram_words`):
 * a counting sort over the order-2 table, two passes, nothing held but the lists themselves.
 * Returns (start: uint32[V + 1] bytes, words: uint32 bytes), or NULL with an exception set. */
static PyObject *
bigram_lists(BuilderObject *b)
{
    const size_t n_vocab = b->vocab.n_words;
    const Table *t = &b->tables[2];
    PyObject *start = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)((n_vocab + 1) * 4));
    PyObject *words = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(t->n_entries * 4));
    if (!start || !words) {
        Py_XDECREF(start);
        Py_XDECREF(words);
        return NULL;
    }
    uint32_t *at = (uint32_t *)PyByteArray_AS_STRING(start);
    uint32_t *out = (uint32_t *)PyByteArray_AS_STRING(words);
    memset(at, 0, (n_vocab + 1) * 4);
    for (int64_t slot = 0; slot <= t->last_used; slot++) {
        const uint64_t key = slot_key(&t->o, (uint64_t)slot);
        if (key != kEmpty) {
            at[(key >> 32) + 1]++;
        }
    }
    for (size_t w = 0; w < n_vocab; w++) {
        at[w + 1] += at[w];
    }
    for (int64_t slot = 0; slot <= t->last_used; slot++) { /* `at[w]` walks w's part forward */
        const uint64_t key = slot_key(&t->o, (uint64_t)slot);
        if (key != kEmpty) {
            out[at[key >> 32]++] = (uint32_t)key;
        }
    }
    memmove(at + 1, at, n_vocab * 4); /* each part's end is the next one's start */
    at[0] = 0;
    return Py_BuildValue("(NN)", start, words);
}

/* (vocab bytes joined by "\n", uni_prob, uni_backoff, ((table bytes, n_home), ...), fill-ins
 * per order, (bigram_start, bigram_words) or None for a unigram model): the tables trimmed to
 * their last used slot plus the empty one. */
static PyObject *
Builder_finish(BuilderObject *b, PyObject *Py_UNUSED(ignored))
{
    if (b->section != b->order) {
        PyErr_SetString(PyExc_RuntimeError, "finish before the last section");
        return NULL;
    }
    if (flush_batch(b) < 0) {
        return NULL;
    }
    const Vocab *v = &b->vocab;
    const size_t n_words = v->n_words;
    PyObject *vocab = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(v->n_bytes + (n_words ? n_words - 1 : 0)));
    if (!vocab) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(vocab);
    for (size_t id = 0; id < n_words; id++) {
        const size_t len = v->start[id + 1] - v->start[id];
        memcpy(out, v->bytes + v->start[id], len);
        out += len;
        if (id + 1 < n_words) {
            *out++ = '\n';
        }
    }
    PyObject *uni_prob = PyByteArray_FromStringAndSize((const char *)b->uni_prob,
                                                       (Py_ssize_t)(n_words * sizeof(float)));
    PyObject *uni_backoff = PyByteArray_FromStringAndSize(
        (const char *)b->uni_backoff, (Py_ssize_t)(n_words * sizeof(float)));
    PyObject *tables = PyTuple_New(b->order - 1);
    PyObject *fill_ins = PyTuple_New(b->order);
    PyObject *lists = b->order >= 2 ? bigram_lists(b) : Py_NewRef(Py_None);
    if (!uni_prob || !uni_backoff || !tables || !fill_ins || !lists) {
        goto error;
    }
    PyTuple_SET_ITEM(fill_ins, 0, PyLong_FromLong(0));
    for (int k = 2; k <= b->order; k++) {
        Table *t = &b->tables[k];
        int64_t n_slots = t->last_used + 1;
        if (n_slots < (int64_t)t->o.n_home) {
            n_slots = (int64_t)t->o.n_home;
        }
        n_slots += 1; /* the final empty slot */
        if (PyByteArray_Resize(t->storage, (Py_ssize_t)(n_slots * (int64_t)t->o.stride)) < 0) {
            goto error;
        }
        PyObject *pair = Py_BuildValue("(OK)", t->storage, (unsigned long long)t->o.n_home);
        if (!pair) {
            goto error;
        }
        PyTuple_SET_ITEM(tables, k - 2, pair);
        PyTuple_SET_ITEM(fill_ins, k - 1, PyLong_FromLongLong(t->fill_ins));
        Py_CLEAR(t->storage); /* the caller's now: the builder is done */
    }
    builder_free_batch(b);
    return Py_BuildValue("(NNNNNN)", vocab, uni_prob, uni_backoff, tables, fill_ins, lists);
error:
    Py_XDECREF(lists);
    Py_XDECREF(vocab);
    Py_XDECREF(uni_prob);
    Py_XDECREF(uni_backoff);
    Py_XDECREF(tables);
    Py_XDECREF(fill_ins);
    return NULL;
}

static PyMethodDef Builder_methods[] = {
    {"start_section", (PyCFunction)Builder_start_section, METH_O,
     "start_section(n)\n--\n\nBegins the \\n-grams: section (n = 1, 2, ... in turn)."},
    {"feed", (PyCFunction)Builder_feed, METH_VARARGS,
     "feed(buffer, start, first_line, at_eof)\n--\n\n"
     "Parses the current section's whole lines in buffer[start:] (line `first_line` first) into\n"
     "the tables, up to a line that begins with a backslash; returns (end offset, lines\n"
     "consumed, section over, the section's entries so far). Errors raise ValueError(line,\n"
     "reason, bytes or None); a table out of room for fill-ins raises TooManyFillIns."},
    {"finish", (PyCFunction)Builder_finish, METH_NOARGS,
     "finish()\n--\n\n"
     "After the last section: (vocab bytes joined by newlines, uni_prob bytes, uni_backoff bytes,\n"
     "((table bytearray, n_home), ...) for orders 2..N, fill-ins per order, (bigram_start,\n"
     "bigram_words) or None)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmserve.server.backends.ngram._arpa_import.TableBuilder",
    .tp_doc = PyDoc_STR("TableBuilder(counts, ln10)\n--\n\n"
                        "Builds an n-gram model's probing tables from its ARPA sections, sized\n"
                        "by the \\data\\ counts (a tuple, orders 1..N)."),
    .tp_basicsize = sizeof(BuilderObject),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Builder_init,
    .tp_dealloc = (destructor)Builder_dealloc,
    .tp_methods = Builder_methods,
};

static struct PyModuleDef import_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "lmserve.server.backends.ngram._arpa_import",
    .m_doc = "ARPA sections parsed straight into lmserve's probing tables.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__arpa_import(void)
{
    if (PyType_Ready(&BuilderType) < 0) {
        return NULL;
    }
    kSpace[' '] = kSpace['\t'] = kSpace['\v'] = kSpace['\f'] = kSpace['\r'] = 1;
    PyObject *m = PyModule_Create(&import_module);
    if (!m) {
        return NULL;
    }
    TooManyFillIns = PyErr_NewExceptionWithDoc(
        "lmserve.server.backends.ngram._arpa_import.TooManyFillIns",
        "The file lacks more prefixes/suffixes than the tables sized by its counts can take.",
        PyExc_Exception, NULL);
    if (!TooManyFillIns || PyModule_AddObjectRef(m, "TooManyFillIns", TooManyFillIns) < 0 ||
        PyModule_AddObjectRef(m, "TableBuilder", (PyObject *)&BuilderType) < 0) {
        Py_XDECREF(TooManyFillIns);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
