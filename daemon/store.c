/* The store: values in an open-addressing hash table of its own, waiters in one list. A job
 * has few waiters at a time (ranks waiting for the NCCL id, say), so a list scanned on put
 * beats a per-key index in code and in memory. A key and its value share one block: a put is
 * one allocation, where a jansson object (the store's first table) made three and compared
 * keys in a chain, 4% of a large job's leader at its start. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "banned.h"

struct waiter {
    struct waiter *next;
    char *key;
    int64_t deadline_ms;
    void *owner;
    int64_t id;
};

/* A slot: block holds the key, its NUL, the value and its NUL; NULL: empty. */
struct slot {
    uint64_t hash;
    char *block;
    size_t klen, vlen;
};

struct store {
    struct slot *slots;
    size_t cap, nkeys; /* cap: a power of two, at least twice nkeys */
    size_t bytes, max_bytes, max_keys;
    struct waiter *waiters;
    size_t nwaiters;
    store_ready_fn ready;
    void *arg;
};

#define STORE_MIN_SLOTS 64

/* FNV-1a: keys are the job's own ranks', not a stranger's to collide. */
static uint64_t hash_key(const char *key, size_t n)
{
    uint64_t h = 14695981039346656037ULL;

    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)key[i]) * 1099511628211ULL;
    return h;
}

/* The slot of key, or the empty slot where it would go. */
static struct slot *find(const struct store *s, const char *key, size_t klen, uint64_t h)
{
    size_t mask = s->cap - 1;

    for (size_t i = h & mask;; i = (i + 1) & mask) {
        struct slot *e = &s->slots[i];
        if (!e->block || (e->hash == h && e->klen == klen && !memcmp(e->block, key, klen)))
            return e;
    }
}

/* Doubles the table. Returns 0 or -ENOMEM (the table stays as it was). */
static int grow(struct store *s)
{
    size_t old_cap = s->cap, cap = 2 * old_cap;
    struct slot *old = s->slots, *slots = calloc(cap, sizeof(*slots));

    if (!slots)
        return -ENOMEM;
    s->slots = slots;
    s->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].block)
            *find(s, old[i].block, old[i].klen, old[i].hash) = old[i];
    free(old);
    return 0;
}

/* Empties e, moving back the entries after it that it separated from their home slot
 * (linear probing's deletion: no tombstones). */
static void remove_slot(struct store *s, struct slot *e)
{
    size_t mask = s->cap - 1, hole = (size_t)(e - s->slots);

    free(e->block);
    e->block = NULL;
    s->nkeys--;
    for (size_t i = (hole + 1) & mask; s->slots[i].block; i = (i + 1) & mask) {
        size_t home = s->slots[i].hash & mask;
        /* It stays where its home is cyclically in (hole, i]. */
        if (hole < i ? (home > hole && home <= i) : (home > hole || home <= i))
            continue;
        s->slots[hole] = s->slots[i];
        s->slots[i].block = NULL;
        hole = i;
    }
}

struct store *store_new(size_t max_bytes, size_t max_keys, store_ready_fn ready, void *arg)
{
    struct store *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    s->cap = STORE_MIN_SLOTS;
    s->slots = calloc(s->cap, sizeof(*s->slots));
    if (!s->slots) {
        free(s);
        return NULL;
    }
    s->max_bytes = max_bytes;
    s->max_keys = max_keys;
    s->ready = ready;
    s->arg = arg;
    return s;
}

static void waiter_free(struct waiter *w)
{
    free(w->key);
    free(w);
}

void store_free(struct store *s)
{
    if (!s)
        return;
    while (s->waiters) {
        struct waiter *w = s->waiters;
        s->waiters = w->next;
        waiter_free(w);
    }
    for (size_t i = 0; i < s->cap; i++)
        free(s->slots[i].block);
    free(s->slots);
    free(s);
}

/* Unlinks and answers every waiter that match() selects. A callback may put or wait again,
 * so the matching waiters are detached first and answered after. */
static size_t answer(struct store *s, int (*match)(const struct waiter *, const void *),
                     const void *ctx, const char *value)
{
    struct waiter **pp = &s->waiters, *done = NULL, **tail = &done;
    size_t n = 0;

    while (*pp) {
        struct waiter *w = *pp;
        if (match(w, ctx)) {
            *pp = w->next;
            w->next = NULL;
            *tail = w;
            tail = &w->next;
            s->nwaiters--;
        } else {
            pp = &w->next;
        }
    }
    while (done) {
        struct waiter *w = done;
        done = w->next;
        if (s->ready)
            s->ready(w->owner, w->id, w->key, value, s->arg);
        waiter_free(w);
        n++;
    }
    return n;
}

static int match_key(const struct waiter *w, const void *key)
{
    return !strcmp(w->key, key);
}

int store_put(struct store *s, const char *key, const char *value)
{
    size_t klen = strlen(key), vlen = strlen(value);
    uint64_t h = hash_key(key, klen);
    struct slot *e = find(s, key, klen, h);
    size_t oldsz = e->block ? e->klen + e->vlen : 0;
    char *block;

    if (!e->block && s->nkeys >= s->max_keys)
        return -ENOSPC;
    if (s->bytes - oldsz + klen + vlen > s->max_bytes)
        return -ENOSPC;
    if (!e->block && 2 * (s->nkeys + 1) > s->cap) {
        if (grow(s) < 0)
            return -ENOMEM;
        e = find(s, key, klen, h);
    }
    block = malloc(klen + vlen + 2);
    if (!block)
        return -ENOMEM;
    memcpy(block, key, klen + 1);
    memcpy(block + klen + 1, value, vlen + 1);
    if (e->block)
        free(e->block);
    else
        s->nkeys++;
    *e = (struct slot){.hash = h, .block = block, .klen = klen, .vlen = vlen};
    s->bytes = s->bytes - oldsz + klen + vlen;
    /* The waiters get the caller's value: a callback may put or delete this key again,
     * which frees the stored copy under the waiters answered after it. */
    answer(s, match_key, key, value);
    return 0;
}

const char *store_get(const struct store *s, const char *key)
{
    size_t klen = strlen(key);
    const struct slot *e = find(s, key, klen, hash_key(key, klen));

    return e->block ? e->block + e->klen + 1 : NULL;
}

int store_del(struct store *s, const char *key)
{
    size_t klen = strlen(key);
    struct slot *e = find(s, key, klen, hash_key(key, klen));

    if (!e->block)
        return -ENOENT;
    s->bytes -= e->klen + e->vlen;
    remove_slot(s, e);
    return 0;
}

int store_wait(struct store *s, const char *key, int64_t deadline_ms, void *owner, int64_t id)
{
    struct waiter *w = calloc(1, sizeof(*w));

    if (!w)
        return -ENOMEM;
    w->key = strdup(key);
    if (!w->key) {
        free(w);
        return -ENOMEM;
    }
    w->deadline_ms = deadline_ms;
    w->owner = owner;
    w->id = id;
    w->next = s->waiters;
    s->waiters = w;
    s->nwaiters++;
    return 0;
}

static int match_deadline(const struct waiter *w, const void *now)
{
    return w->deadline_ms <= *(const int64_t *)now;
}

size_t store_expire(struct store *s, int64_t now_ms)
{
    return answer(s, match_deadline, &now_ms, NULL);
}

void store_drop_owner(struct store *s, void *owner)
{
    struct waiter **pp = &s->waiters;

    while (*pp) {
        struct waiter *w = *pp;
        if (w->owner == owner) {
            *pp = w->next;
            waiter_free(w);
            s->nwaiters--;
        } else {
            pp = &w->next;
        }
    }
}

size_t store_bytes(const struct store *s)
{
    return s->bytes;
}

size_t store_keys(const struct store *s)
{
    return s->nkeys;
}

size_t store_waiters(const struct store *s)
{
    return s->nwaiters;
}
