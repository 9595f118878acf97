/* The job's key-value store, kept by the leader: string values under string keys, and
 * waiters for keys that do not exist yet. Pure data structure: no I/O, no clock. */
#ifndef GPURUN_STORE_H
#define GPURUN_STORE_H

#include <stddef.h>
#include <stdint.h>

struct store;

/* Called once per waiter: with the value (borrowed: valid during the call) when its key
 * appears, or with value NULL when its deadline passes or its owner is dropped. */
typedef void (*store_ready_fn)(void *owner, int64_t id, const char *key, const char *value,
                               void *arg);

/* Makes an empty store that holds at most max_bytes of keys and values in max_keys keys and
 * calls ready(owner, id, key, value, arg) for waiters. Returns new (store_free) or NULL. */
struct store *store_new(size_t max_bytes, size_t max_keys, store_ready_fn ready, void *arg);

/* Frees the store; waiters still pending are dropped without a call. */
void store_free(struct store *s);

/* Sets key to value (both borrowed, copied; value not one the store holds), replacing an
 * older value, then answers every waiter of key with value. Returns 0, or -ENOSPC when the
 * store would exceed its limits, -ENOMEM. */
int store_put(struct store *s, const char *key, const char *value);

/* The value of key (borrowed: valid until the key is put or deleted), or NULL. */
const char *store_get(const struct store *s, const char *key);

/* Removes key. Returns 0, or -ENOENT when it did not exist. */
int store_del(struct store *s, const char *key);

/* Registers a waiter for key: answered by a later store_put, or with NULL once now passes
 * deadline_ms in store_expire(). Returns 0 or -ENOMEM. */
int store_wait(struct store *s, const char *key, int64_t deadline_ms, void *owner, int64_t id);

/* Answers with NULL every waiter whose deadline is at or before now_ms. Returns how many. */
size_t store_expire(struct store *s, int64_t now_ms);

/* Forgets every waiter of owner (a peer that went away) without a call. */
void store_drop_owner(struct store *s, void *owner);

/* Bytes of keys and values held, and the number of keys and of pending waiters. */
size_t store_bytes(const struct store *s);
size_t store_keys(const struct store *s);
size_t store_waiters(const struct store *s);

#endif
