/*
 * lmserve.server.text._wordindex: split texts into words and map them to vocabulary ids in C.
 *
 * `WordIndex(words, unk_id)` builds an open-addressing hash table (linear probing, load <= 1/2)
 * over the UTF-8 bytes of the vocabulary's words; `encode(texts)` splits every text on KenLM's
 * whitespace (util::kSpaces: ASCII space, \t, \n, \v, \f, \r; nothing else, no Unicode spaces),
 * looks each word up and returns three bytearrays for np.frombuffer:
 *
 *     ids      int32 per word (unknown words get unk_id)
 *     offsets  int64 per text + 1: text i is ids[offsets[i]:offsets[i+1]]
 *     oov      uint8 per word: 1 for unknown words and for the literal unknown-word token
 *              (KenLM counts `<unk>` in the text as an OOV too)
 *     oov_counts  int64 per text: its OOV words (what Score reports, free here)
 *
 * `encode_words(token_lists)` looks up words split elsewhere (a regex tokenizer's, a client's
 * token lists), each str taken whole, into the same four arrays: a dict lookup per word and
 * four numpy passes cost a small request more than its scoring.
 *
 * The table's slots are 16 bytes (half a megabyte for a vocabulary of tens of thousands of
 * words) and a word of at most 8 bytes, most words, is stored in its slot as an integer: one
 * slot read and one compare find it, with no second read of its bytes elsewhere. Words are split
 * a window at a time, their slots prefetched, then looked up: after a request's scoring has
 * evicted the table from the cache, the misses of a window overlap.
 *
 * Strings are read through PyUnicode_AsUTF8AndSize (zero-copy for ASCII strings); a long batch
 * releases the GIL while splitting and hashing, over a private tuple of the texts so that
 * nothing the loop reads can be freed meanwhile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Batches of at least this many (possible) words release the GIL while they are encoded. */
#define RELEASE_GIL_MIN_WORDS ((Py_ssize_t)1 << 16)


/* The n < 8 bytes at p as a little-endian integer (zero above them). A word inside a text is
 * read with one 8-byte load and a mask when 8 bytes lie before `limit` (the end of the buffer):
 * copying n bytes into a variable and loading it whole stalls the CPU (the load cannot be
 * forwarded from the smaller stores), which cost a third of the encoding time. */
static inline uint64_t
load_tail(const char *p, size_t n, const char *limit)
{
    uint64_t v = 0;
    if (limit - p >= 8) {
        memcpy(&v, p, 8);
        return v & ((1ULL << (8 * n)) - 1);
    }
    for (size_t i = 0; i < n; i++) {
        v |= (uint64_t)(unsigned char)p[i] << (8 * i);
    }
    return v;
}

/* A 64-bit hash of the byte string p[0:n] (readable up to `limit`): 8 bytes at a time,
 * multiply-xorshift mixing (in the spirit of wyhash/murmur finalisers). Any decent hash works:
 * a hit is confirmed by comparing the bytes. */
static inline uint64_t
hash_bytes(const char *p, size_t n, const char *limit)
{
    const uint64_t m = 0x9E3779B97F4A7C15ULL;
    uint64_t h = 0xCBF29CE484222325ULL ^ (n * m);
    while (n >= 8) {
        uint64_t chunk;
        memcpy(&chunk, p, 8);
        h = (h ^ chunk) * m;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        h = (h ^ load_tail(p, n, limit)) * m;
        h ^= h >> 29;
    }
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return h;
}

/* Words of at most this many bytes are stored in their slot itself (`Slot.key`). */
#define INLINE_BYTES 8

/* A word's key: for a word of at most INLINE_BYTES bytes, the bytes themselves as an integer
 * (compared together with the length, so "a" and "a\0" differ); for a longer one, its hash. */
static inline uint64_t
word_key(const char *p, size_t n, const char *limit)
{
    if (n < INLINE_BYTES) {
        return load_tail(p, n, limit);
    }
    if (n == INLINE_BYTES) {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    return hash_bytes(p, n, limit);
}

/* The home slot of a key (mixed: an inline key is raw bytes). */
static inline size_t
home_slot(uint64_t key, size_t mask)
{
    key *= 0xBF58476D1CE4E5B9ULL;
    return (size_t)(key ^ (key >> 31)) & mask;
}

/* 16 bytes, so that a vocabulary of tens of thousands of words takes half a megabyte. */
typedef struct {
    uint64_t key;
    int32_t id;   /* -1 for an empty slot */
    uint32_t len; /* the word's length in bytes */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;       /* capacity - 1 (capacity a power of two) */
    char *pool;        /* every word's UTF-8 bytes, back to back */
    Py_ssize_t *start; /* per id: where its bytes begin in the pool (for words past INLINE_BYTES) */
    Py_ssize_t n_words;
    int32_t unk_id;
} WordIndexObject;

/* The id of the word p[0:n] with key `key`, or -1. A short word is settled by its slot alone;
 * a long one also compares its bytes. */
static inline int32_t
find(const WordIndexObject *self, const char *p, size_t n, uint64_t key)
{
    size_t i = home_slot(key, self->mask);
    for (;;) {
        const Slot *s = &self->slots[i];
        if (s->id < 0) {
            return -1;
        }
        if (s->key == key && s->len == n &&
            (n <= INLINE_BYTES || memcmp(self->pool + self->start[s->id], p, n) == 0)) {
            return s->id;
        }
        i = (i + 1) & self->mask;
    }
}

static void
WordIndex_dealloc(WordIndexObject *self)
{
    PyMem_Free(self->slots);
    PyMem_Free(self->pool);
    PyMem_Free(self->start);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
WordIndex_init(WordIndexObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"words", "unk_id", NULL};
    PyObject *words_obj;
    int unk_id;
    if (self->slots) {
        PyErr_SetString(PyExc_RuntimeError, "WordIndex is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oi", kwlist, &words_obj, &unk_id)) {
        return -1;
    }
    PyObject *words = PySequence_Tuple(words_obj);
    if (!words) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(words);
    int ok = 0;
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many words");
        goto done;
    }
    if (unk_id < 0 || unk_id >= n) {
        PyErr_SetString(PyExc_ValueError, "unk_id is not a word's id");
        goto done;
    }
    Py_ssize_t pool_size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PyTuple_GET_ITEM(words, i);
        if (!PyUnicode_Check(w)) {
            PyErr_Format(PyExc_TypeError, "words[%zd] must be str, not %.100s", i,
                         Py_TYPE(w)->tp_name);
            goto done;
        }
        Py_ssize_t len;
        if (!PyUnicode_AsUTF8AndSize(w, &len)) {
            goto done;
        }
        if ((size_t)len > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "words[%zd] is too long", i);
            goto done;
        }
        pool_size += len;
    }
    size_t capacity = 16;
    while (capacity < 2 * (size_t)n) {
        capacity *= 2;
    }
    self->slots = PyMem_Malloc(capacity * sizeof(Slot));
    self->pool = PyMem_Malloc(pool_size ? (size_t)pool_size : 1);
    self->start = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (!self->slots || !self->pool || !self->start) {
        PyErr_NoMemory();
        goto done;
    }
    self->mask = capacity - 1;
    for (size_t i = 0; i < capacity; i++) {
        self->slots[i].id = -1;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *p = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(words, i), &len);
        uint64_t key = word_key(p, (size_t)len, p + len);
        if (find(self, p, (size_t)len, key) >= 0) {
            PyErr_Format(PyExc_ValueError, "words[%zd] is a duplicate", i);
            goto done;
        }
        memcpy(self->pool + at, p, (size_t)len);
        self->start[i] = at;
        size_t j = home_slot(key, self->mask);
        while (self->slots[j].id >= 0) {
            j = (j + 1) & self->mask;
        }
        self->slots[j] = (Slot){.key = key, .id = (int32_t)i, .len = (uint32_t)len};
        at += len;
    }
    self->n_words = n;
    self->unk_id = unk_id;
    ok = 1;
done:
    Py_DECREF(words);
    if (!ok) {
        PyMem_Free(self->slots);
        PyMem_Free(self->pool);
        PyMem_Free(self->start);
        self->slots = NULL;
        self->pool = NULL;
        self->start = NULL;
        return -1;
    }
    return 0;
}

typedef struct {
    const char *p;
    Py_ssize_t n;
} Text;

/* Words are split (and their home slots prefetched) this many at a time before they are looked
 * up: the slots of a big vocabulary miss the cache once a request's scoring has run, and a
 * window of independent prefetches waits for memory once rather than once per word. */
#define LOOKUP_WINDOW 32

typedef struct {
    const char *p;
    size_t len;
    uint64_t key;
} Pending;

/* Looks up `n` split words, the output positions first, first + 1, ... */
static inline void
look_up(const WordIndexObject *self, const Pending *words, int n, Py_ssize_t first,
        int32_t *id_out, uint8_t *oov_out)
{
    const int32_t unk = self->unk_id;
    for (int j = 0; j < n; j++) {
        int32_t id = find(self, words[j].p, words[j].len, words[j].key);
        if (id < 0) {
            id = unk;
        }
        id_out[first + j] = id;
        oov_out[first + j] = id == unk;
    }
}

/* The batch being encoded: words are split into `pending`, looked up a window at a time. */
typedef struct {
    const WordIndexObject *index;
    Pending pending[LOOKUP_WINDOW];
    int n_pending;
    Py_ssize_t n_words;
    int32_t *id_out;
    uint8_t *oov_out;
} Encoding;

/* Takes the word p[0:len] of a text that ends at `end`: its key now, its home slot prefetched,
 * its lookup with the window's. */
static inline void
push_word(Encoding *e, const char *p, size_t len, const char *end)
{
    Pending *w = &e->pending[e->n_pending++];
    w->p = p;
    w->len = len;
    w->key = word_key(p, len, end);
    __builtin_prefetch(&e->index->slots[home_slot(w->key, e->index->mask)]);
    e->n_words++;
    if (e->n_pending == LOOKUP_WINDOW) {
        look_up(e->index, e->pending, e->n_pending, e->n_words - e->n_pending, e->id_out,
                e->oov_out);
        e->n_pending = 0;
    }
}

#ifdef __SSE2__
/* Bit i set where byte i of the 16 at p is KenLM whitespace: ' ', or \t \n \v \f \r (9-13). */
static inline uint32_t
space_mask(const char *p)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i space = _mm_cmpeq_epi8(v, _mm_set1_epi8(' '));
    const __m128i from_tab = _mm_sub_epi8(v, _mm_set1_epi8('\t'));
    const __m128i control = _mm_cmpeq_epi8(_mm_min_epu8(from_tab, _mm_set1_epi8(4)), from_tab);
    return (uint32_t)_mm_movemask_epi8(_mm_or_si128(space, control));
}

/* Splits p[0:n] 16 bytes at a time: a whitespace mask per block, and the words' starts (a
 * non-space after a space) and ends (a space after a non-space) taken from it bit by bit, with
 * no branch per byte. The last partial block is read from a copy padded with spaces. */
static void
split_text(Encoding *e, const char *p, Py_ssize_t n)
{
    const char *const end = p + n;
    const char *word = NULL; /* the word being read, if any */
    uint32_t space_before = 1; /* the byte before the block is a space (or the text's start) */
    for (Py_ssize_t at = 0; at < n; at += 16) {
        uint32_t mask;
        if (n - at >= 16) {
            mask = space_mask(p + at);
        } else {
            char tail[16];
            memset(tail, ' ', sizeof tail);
            memcpy(tail, p + at, (size_t)(n - at));
            mask = space_mask(tail);
        }
        const uint32_t after_space = ((mask << 1) | space_before) & 0xFFFF;
        uint32_t starts = ~mask & after_space & 0xFFFF, ends = mask & ~after_space;
        space_before = mask >> 15;
        /* Starts and ends alternate: take whichever comes next. */
        for (;;) {
            if (!word) {
                if (!starts) {
                    break;
                }
                word = p + at + __builtin_ctz(starts);
                starts &= starts - 1;
            } else {
                if (!ends) {
                    break;
                }
                const char *stop = p + at + __builtin_ctz(ends);
                ends &= ends - 1;
                push_word(e, word, (size_t)(stop - word), end);
                word = NULL;
            }
        }
    }
    /* A word running to the end met a padding space, unless the text fills its last block. */
    if (word) {
        push_word(e, word, (size_t)(end - word), end);
    }
}
#else
/* KenLM's util::kSpaces (util/string_piece / tokenize): ' ', or \t \n \v \f \r (9-13); the
 * rule `space_mask` applies 16 bytes at a time. */
static inline int
is_space(unsigned char c)
{
    return c == ' ' || (unsigned char)(c - '\t') <= 4;
}

/* Splits p[0:n] byte by byte (hosts without SSE2). */
static void
split_text(Encoding *e, const char *p, Py_ssize_t n)
{
    const char *const end = p + n;
    for (;;) {
        while (p < end && is_space((unsigned char)*p)) {
            p++;
        }
        if (p == end) {
            return;
        }
        const char *word = p;
        while (p < end && !is_space((unsigned char)*p)) {
            p++;
        }
        push_word(e, word, (size_t)(p - word), end);
    }
}
#endif

static PyObject *
WordIndex_encode(WordIndexObject *self, PyObject *texts_obj)
{
    if (!self->slots) {
        PyErr_SetString(PyExc_RuntimeError, "WordIndex is not initialised");
        return NULL;
    }
    /* A private tuple: holds every str alive (and their UTF-8 buffers) while the GIL is off. */
    PyObject *texts = PySequence_Tuple(texts_obj);
    if (!texts) {
        return NULL;
    }
    Py_ssize_t n_texts = PyTuple_GET_SIZE(texts);
    Text *spans = PyMem_Malloc((size_t)(n_texts ? n_texts : 1) * sizeof(Text));
    PyObject *ids = NULL, *offsets = NULL, *oov = NULL, *oov_counts = NULL, *result = NULL;
    if (!spans) {
        PyErr_NoMemory();
        goto done;
    }
    /* Words in a text of L bytes: at most (L + 1) / 2 (each needs a byte and a separator). */
    Py_ssize_t cap = 0;
    for (Py_ssize_t i = 0; i < n_texts; i++) {
        PyObject *t = PyTuple_GET_ITEM(texts, i);
        if (!PyUnicode_Check(t)) {
            PyErr_Format(PyExc_TypeError, "texts[%zd] must be str, not %.100s", i,
                         Py_TYPE(t)->tp_name);
            goto done;
        }
        spans[i].p = PyUnicode_AsUTF8AndSize(t, &spans[i].n);
        if (!spans[i].p) {
            goto done;
        }
        cap += (spans[i].n + 1) / 2;
    }
    ids = PyByteArray_FromStringAndSize(NULL, cap * (Py_ssize_t)sizeof(int32_t));
    oov = PyByteArray_FromStringAndSize(NULL, cap);
    offsets = PyByteArray_FromStringAndSize(NULL, (n_texts + 1) * (Py_ssize_t)sizeof(int64_t));
    oov_counts = PyByteArray_FromStringAndSize(NULL, n_texts * (Py_ssize_t)sizeof(int64_t));
    if (!ids || !oov || !offsets || !oov_counts) {
        goto done;
    }
    int32_t *id_out = (int32_t *)PyByteArray_AS_STRING(ids);
    uint8_t *oov_out = (uint8_t *)PyByteArray_AS_STRING(oov);
    int64_t *off_out = (int64_t *)PyByteArray_AS_STRING(offsets);
    int64_t *oov_count_out = (int64_t *)PyByteArray_AS_STRING(oov_counts);
    Encoding e = {.index = self, .n_pending = 0, .n_words = 0, .id_out = id_out,
                  .oov_out = oov_out};
    /* As in the n-gram kernel: only a long batch releases the GIL (a busy server's threads
       would otherwise make this call wait to win it back, longer than the work itself). */
    PyThreadState *released = cap >= RELEASE_GIL_MIN_WORDS ? PyEval_SaveThread() : NULL;
    off_out[0] = 0;
    for (Py_ssize_t i = 0; i < n_texts; i++) {
        split_text(&e, spans[i].p, spans[i].n);
        off_out[i + 1] = e.n_words;
    }
    look_up(self, e.pending, e.n_pending, e.n_words - e.n_pending, id_out, oov_out);
    const Py_ssize_t n_words = e.n_words;
    for (Py_ssize_t i = 0; i < n_texts; i++) {
        int64_t count = 0;
        for (int64_t j = off_out[i]; j < off_out[i + 1]; j++) {
            count += oov_out[j];
        }
        oov_count_out[i] = count;
    }
    if (released) {
        PyEval_RestoreThread(released);
    }
    if (PyByteArray_Resize(ids, n_words * (Py_ssize_t)sizeof(int32_t)) < 0 ||
        PyByteArray_Resize(oov, n_words) < 0) {
        goto done;
    }
    result = PyTuple_Pack(4, ids, offsets, oov, oov_counts);
done:
    Py_XDECREF(ids);
    Py_XDECREF(offsets);
    Py_XDECREF(oov);
    Py_XDECREF(oov_counts);
    PyMem_Free(spans);
    Py_DECREF(texts);
    return result;
}

/* The id of one already split word (a str), or unk_id. A str with no UTF-8 form (a lone
 * surrogate) is no vocabulary word: unknown, as a dict lookup would find it. */
static inline int32_t
word_id(const WordIndexObject *self, PyObject *word)
{
    Py_ssize_t len;
    const char *p = PyUnicode_AsUTF8AndSize(word, &len);
    if (!p) {
        PyErr_Clear();
        return self->unk_id;
    }
    int32_t id = find(self, p, (size_t)len, word_key(p, (size_t)len, p + len));
    return id < 0 ? self->unk_id : id;
}

static PyObject *
WordIndex_encode_words(WordIndexObject *self, PyObject *lists_obj)
{
    if (!self->slots) {
        PyErr_SetString(PyExc_RuntimeError, "WordIndex is not initialised");
        return NULL;
    }
    PyObject *lists = PySequence_Tuple(lists_obj);
    if (!lists) {
        return NULL;
    }
    Py_ssize_t n_texts = PyTuple_GET_SIZE(lists);
    PyObject *ids = NULL, *offsets = NULL, *oov = NULL, *oov_counts = NULL, *result = NULL;
    PyObject **fast = PyMem_Calloc((size_t)(n_texts ? n_texts : 1), sizeof(PyObject *));
    if (!fast) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n_texts; i++) {
        fast[i] = PySequence_Fast(PyTuple_GET_ITEM(lists, i), "each text must be a sequence");
        if (!fast[i]) {
            goto done;
        }
        total += PySequence_Fast_GET_SIZE(fast[i]);
    }
    ids = PyByteArray_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(int32_t));
    oov = PyByteArray_FromStringAndSize(NULL, total);
    offsets = PyByteArray_FromStringAndSize(NULL, (n_texts + 1) * (Py_ssize_t)sizeof(int64_t));
    oov_counts = PyByteArray_FromStringAndSize(NULL, n_texts * (Py_ssize_t)sizeof(int64_t));
    if (!ids || !oov || !offsets || !oov_counts) {
        goto done;
    }
    int32_t *id_out = (int32_t *)PyByteArray_AS_STRING(ids);
    uint8_t *oov_out = (uint8_t *)PyByteArray_AS_STRING(oov);
    int64_t *off_out = (int64_t *)PyByteArray_AS_STRING(offsets);
    int64_t *oov_count_out = (int64_t *)PyByteArray_AS_STRING(oov_counts);
    const int32_t unk = self->unk_id;
    Py_ssize_t at = 0;
    off_out[0] = 0;
    for (Py_ssize_t i = 0; i < n_texts; i++) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(fast[i]);
        PyObject **words = PySequence_Fast_ITEMS(fast[i]);
        int64_t count = 0;
        for (Py_ssize_t j = 0; j < n; j++, at++) {
            if (!PyUnicode_Check(words[j])) {
                PyErr_Format(PyExc_TypeError, "token_lists[%zd][%zd] must be str, not %.100s", i,
                             j, Py_TYPE(words[j])->tp_name);
                goto done;
            }
            int32_t id = word_id(self, words[j]);
            id_out[at] = id;
            oov_out[at] = id == unk;
            count += id == unk;
        }
        off_out[i + 1] = at;
        oov_count_out[i] = count;
    }
    result = PyTuple_Pack(4, ids, offsets, oov, oov_counts);
done:
    Py_XDECREF(ids);
    Py_XDECREF(offsets);
    Py_XDECREF(oov);
    Py_XDECREF(oov_counts);
    if (fast) {
        for (Py_ssize_t i = 0; i < n_texts; i++) {
            Py_XDECREF(fast[i]);
        }
        PyMem_Free(fast);
    }
    Py_DECREF(lists);
    return result;
}

static Py_ssize_t
WordIndex_len(WordIndexObject *self)
{
    return self->n_words;
}

static PyObject *
WordIndex_get_unk_id(WordIndexObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->unk_id);
}

static PyMethodDef WordIndex_methods[] = {
    {"encode", (PyCFunction)WordIndex_encode, METH_O,
     "encode(texts)\n--\n\n"
     "Splits each str on ASCII whitespace and maps words to ids: returns bytearrays\n"
     "(ids int32, offsets int64, oov uint8, oov_counts int64) for np.frombuffer."},
    {"encode_words", (PyCFunction)WordIndex_encode_words, METH_O,
     "encode_words(token_lists)\n--\n\n"
     "Maps already split words (a sequence of str per text) to ids, each word taken whole:\n"
     "the same four bytearrays as encode()."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef WordIndex_getset[] = {
    {"unk_id", (getter)WordIndex_get_unk_id, NULL, "the unknown-word id", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods WordIndex_as_sequence = {
    .sq_length = (lenfunc)WordIndex_len,
};

static PyTypeObject WordIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmserve.server.text._wordindex.WordIndex",
    .tp_doc = PyDoc_STR("WordIndex(words, unk_id)\n--\n\n"
                        "A hash table from the words (str) to their positions."),
    .tp_basicsize = sizeof(WordIndexObject),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)WordIndex_init,
    .tp_dealloc = (destructor)WordIndex_dealloc,
    .tp_methods = WordIndex_methods,
    .tp_getset = WordIndex_getset,
    .tp_as_sequence = &WordIndex_as_sequence,
};

static struct PyModuleDef wordindex_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "lmserve.server.text._wordindex",
    .m_doc = "Whitespace splitting and word -> id lookup in C (KenLM's whitespace rule).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__wordindex(void)
{
    if (PyType_Ready(&WordIndexType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&wordindex_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "WordIndex", (PyObject *)&WordIndexType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
