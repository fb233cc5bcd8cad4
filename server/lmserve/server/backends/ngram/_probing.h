/*
 * The probing tables of lmserve's n-gram models, shared by the scoring kernel (`_kernel.c`) and
 * the ARPA importer (`_arpa_import.c`); the Python side is `hashing.ProbingTable`.
 *
 * Each order k >= 2 is one linear-probing hash table of exact keys (KenLM's "probing" structure,
 * `lm/search_hashed.cc`, with exact keys instead of hashes). An order-k entry's key is
 *     (slot of its order-(k-1) prefix) << 32 | last word id        (order 1's "slot": the word id)
 * its home slot is
 *     mixed = (key * 0x9E3779B97F4A7C15) >> 32        (uint64, wrapping)
 *     home  = (mixed * n_home) >> 32
 * and it lies in the first slot from there holding it, before the first empty slot (key ~0).
 * Probing runs forward and never wraps: slots past n_home are overflow, and the table's last
 * slot is always empty, so a walk always ends inside the array.
 *
 * Two slot layouts, little-endian and packed:
 *   orders 2..N-1 (contexts): 16 bytes {uint64 key; float prob; float backoff}
 *   order N (the highest):    12 bytes {uint64 key; float prob}      (no backoff to keep)
 * At 1.5 slots per entry (KenLM's default `probing_multiplier`) that is 24 and 18 bytes per
 * n-gram. The fields are read with memcpy: a 12-byte slot's key is not 8-byte aligned.
 */
#ifndef LMSERVE_NGRAM_PROBING_H
#define LMSERVE_NGRAM_PROBING_H

#include <stdint.h>
#include <string.h>

#define CONTEXT_SLOT_BYTES 16
#define FINAL_SLOT_BYTES 12

static const uint64_t kMultiplier = 0x9E3779B97F4A7C15ULL;
static const uint64_t kEmpty = ~0ULL; /* never a key: slot indices stay below 2**32 - 1 */

/* One order k >= 2: its probing table, exact or compact (quantized: `compact.py`). */
typedef struct {
    const unsigned char *slots;
    uint64_t n_home;  /* home slots: [0, n_home); n_home < n_slots */
    int64_t n_slots;  /* the last one is empty */
    size_t stride;    /* bytes a slot */
    /* A compact order: keys `prefix << word_bits | word`, `key_bits` wide, hashed by a bijection
     * `mix`; a slot holds the hash's low `low_bits` bits, its displacement from its home + 1
     * (`disp_bits`; 0: empty), an 8-bit prob level and, below the highest order, a backoff
     * level. Its array is padded so that every slot can be read as one uint64. */
    int compact;
    unsigned word_bits, key_bits, low_bits, disp_bits, value_shift;
    uint64_t key_mask, low_mask, disp_mask, slot_mask;
    const float *prob_levels, *backoff_levels; /* 256 each; backoff_levels NULL when final */
} Order;

static inline uint64_t
compact_word(const Order *o, uint64_t slot)
{
    uint64_t v;
    memcpy(&v, o->slots + slot * o->stride, sizeof v);
    return v & o->slot_mask;
}

static inline uint64_t
slot_key(const Order *o, uint64_t slot)
{
    uint64_t key;
    memcpy(&key, o->slots + slot * o->stride, sizeof key);
    return key;
}

static inline float
slot_prob(const Order *o, uint64_t slot)
{
    if (o->compact) {
        return o->prob_levels[(compact_word(o, slot) >> o->value_shift) & 0xff];
    }
    float prob;
    memcpy(&prob, o->slots + slot * o->stride + 8, sizeof prob);
    return prob;
}

/* 0 for the highest order, whose slots keep no backoff. */
static inline float
slot_backoff(const Order *o, uint64_t slot)
{
    if (o->compact) {
        return o->backoff_levels
                   ? o->backoff_levels[(compact_word(o, slot) >> (o->value_shift + 8)) & 0xff]
                   : 0.0f;
    }
    float backoff = 0.0f;
    if (o->stride == CONTEXT_SLOT_BYTES) {
        memcpy(&backoff, o->slots + slot * o->stride + 12, sizeof backoff);
    }
    return backoff;
}

static inline const void *
slot_address(const Order *o, uint64_t slot)
{
    return o->slots + slot * o->stride;
}

/* The lookup key of the entry (prefix slot, word): exact, the key itself; compact, its hash. */
static inline uint64_t
order_key(const Order *o, uint64_t prefix, uint32_t word)
{
    if (o->compact) {
        const uint64_t k = (prefix << o->word_bits) | word;
        const uint64_t x = k ^ (k >> (o->key_bits / 2 > 0 ? o->key_bits / 2 : 1));
        return (x * kMultiplier) & o->key_mask;
    }
    return (prefix << 32) | word;
}

static inline uint64_t
home_slot(const Order *o, uint64_t key)
{
    if (o->compact) {
        return (uint64_t)(((unsigned __int128)key * o->n_home) >> o->key_bits);
    }
    uint64_t mixed = (key * kMultiplier) >> 32;
    return (mixed * o->n_home) >> 32; /* < n_home: mixed < 2**32 */
}

/* The slot holding `key` (`order_key`), probing from `home`, or -1. Stops at the first empty
 * slot; the table's last slot is empty, so the walk stays inside it. */
static inline int64_t
probe(const Order *o, uint64_t key, uint64_t home)
{
    if (o->compact) {
        const uint64_t low = key & o->low_mask;
        for (uint64_t slot = home;; slot++) {
            const uint64_t v = compact_word(o, slot);
            const uint64_t disp1 = (v >> o->low_bits) & o->disp_mask;
            if (disp1 == 0) {
                return -1;
            }
            if (slot - (disp1 - 1) == home && (v & o->low_mask) == low) {
                return (int64_t)slot;
            }
        }
    }
    for (uint64_t slot = home;; slot++) {
        uint64_t got = slot_key(o, slot);
        if (got == key) {
            return (int64_t)slot;
        }
        if (got == kEmpty) {
            return -1;
        }
    }
}

/* Whether `slot` is empty. */
static inline int
slot_empty(const Order *o, uint64_t slot)
{
    if (o->compact) {
        return ((compact_word(o, slot) >> o->low_bits) & o->disp_mask) == 0;
    }
    return slot_key(o, slot) == kEmpty;
}

#endif
