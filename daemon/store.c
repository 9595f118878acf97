/* The store: values in a jansson object (a hash table we already link), waiters in one
 * list. A job has few waiters at a time (ranks waiting for the NCCL id, say), so a list
 * scanned on put beats a per-key index in code and in memory. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "store.h"
#include "banned.h"

struct waiter {
    struct waiter *next;
    char *key;
    int64_t deadline_ms;
    void *owner;
    int64_t id;
};

struct store {
    json_t *map;
    size_t bytes, max_bytes, max_keys;
    struct waiter *waiters;
    size_t nwaiters;
    store_ready_fn ready;
    void *arg;
};

struct store *store_new(size_t max_bytes, size_t max_keys, store_ready_fn ready, void *arg)
{
    struct store *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    s->map = json_object();
    if (!s->map) {
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
    json_decref(s->map);
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
    json_t *old = json_object_get(s->map, key);
    size_t oldsz = old ? strlen(key) + strlen(json_string_value(old)) : 0;
    size_t newsz = strlen(key) + strlen(value);
    json_t *v;

    if (!old && json_object_size(s->map) >= s->max_keys)
        return -ENOSPC;
    if (s->bytes - oldsz + newsz > s->max_bytes)
        return -ENOSPC;
    v = json_string(value);
    if (!v || json_object_set_new(s->map, key, v) < 0)
        return -ENOMEM;
    s->bytes = s->bytes - oldsz + newsz;
    /* The value answered is the stored copy, held for the whole answer: a callback may put
     * or delete this key again, which must not free it under the waiters answered after. */
    json_incref(v);
    answer(s, match_key, key, json_string_value(v));
    json_decref(v);
    return 0;
}

const char *store_get(const struct store *s, const char *key)
{
    json_t *v = json_object_get(s->map, key);
    return v ? json_string_value(v) : NULL;
}

int store_del(struct store *s, const char *key)
{
    json_t *v = json_object_get(s->map, key);

    if (!v)
        return -ENOENT;
    s->bytes -= strlen(key) + strlen(json_string_value(v));
    json_object_del(s->map, key);
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
    return json_object_size(s->map);
}

size_t store_waiters(const struct store *s)
{
    return s->nwaiters;
}
