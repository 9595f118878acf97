/* Tests of daemon/store: values, the byte and key accounting behind the store's limits, and
 * waiters answered by a put, by their deadline or dropped with their owner, including
 * callbacks that change the store while it is answering. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../daemon/store.h"
#include "test.h"
#include "banned.h"

#define CALLS_MAX 16

/* One answer a waiter got; strings copied, since the store only lends them for the call. */
struct call {
    void *owner;
    int64_t id;
    char key[64];
    char value[64];
    int has_value;
};

/* What the ready callback saw, and what it should do to the store from inside the call. */
struct rec {
    struct store *s;
    struct call calls[CALLS_MAX];
    int n;
    const char *reput_key, *reput_value; /* put this from inside the first call */
    const char *del_key;                 /* delete this from inside the first call */
    const char *rewait_key;              /* register a waiter on this from inside each call */
    int reput_ret, rewait_ret, del_ret;
};

static void on_ready(void *owner, int64_t id, const char *key, const char *value, void *arg)
{
    struct rec *r = arg;
    struct call *c;

    if (r->n >= CALLS_MAX)
        test_fail(__FILE__, __LINE__, "more than %d calls", CALLS_MAX);
    c = &r->calls[r->n++];
    c->owner = owner;
    c->id = id;
    snprintf(c->key, sizeof(c->key), "%s", key);
    c->has_value = value != NULL;
    snprintf(c->value, sizeof(c->value), "%s", value ? value : "");
    if (r->n == 1 && r->reput_key)
        r->reput_ret = store_put(r->s, r->reput_key, r->reput_value);
    if (r->n == 1 && r->del_key)
        r->del_ret = store_del(r->s, r->del_key);
    if (r->rewait_key)
        r->rewait_ret = store_wait(r->s, r->rewait_key, 1000, owner, id + 100);
}

/* The call that answered waiter id, or NULL. */
static const struct call *find_call(const struct rec *r, int64_t id)
{
    for (int i = 0; i < r->n; i++)
        if (r->calls[i].id == id)
            return &r->calls[i];
    return NULL;
}

static struct store *new_store(struct rec *r, size_t max_bytes, size_t max_keys)
{
    memset(r, 0, sizeof(*r));
    r->s = store_new(max_bytes, max_keys, on_ready, r);
    CHECK(r->s != NULL);
    return r->s;
}

TEST(store_put_get_del)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);

    CHECK(store_get(s, "a") == NULL);
    CHECK_EQ(store_keys(s), 0);
    CHECK_EQ(store_bytes(s), 0);
    CHECK_EQ(store_put(s, "a", "one"), 0);
    CHECK_STR(store_get(s, "a"), "one");
    CHECK_EQ(store_put(s, "b", ""), 0);
    CHECK_STR(store_get(s, "b"), "");
    CHECK_EQ(store_keys(s), 2);
    CHECK_EQ(store_put(s, "a", "two"), 0);
    CHECK_STR(store_get(s, "a"), "two");
    CHECK_EQ(store_keys(s), 2);
    CHECK_EQ(store_del(s, "a"), 0);
    CHECK(store_get(s, "a") == NULL);
    CHECK_EQ(store_del(s, "a"), -ENOENT);
    CHECK_EQ(store_del(s, "never"), -ENOENT);
    CHECK_STR(store_get(s, "b"), "");
    CHECK_EQ(store_keys(s), 1);
    /* Keys are whole strings: a prefix is another key. */
    CHECK(store_get(s, "") == NULL);
    CHECK_EQ(store_put(s, "bb", "x"), 0);
    CHECK_STR(store_get(s, "b"), "");
    CHECK_STR(store_get(s, "bb"), "x");
    CHECK_EQ(r.n, 0);
    store_free(s);
}

TEST(store_put_copies_its_arguments)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    char key[8] = "k", value[8] = "v1";

    CHECK_EQ(store_put(s, key, value), 0);
    key[0] = 'x';
    value[1] = '9';
    CHECK_STR(store_get(s, "k"), "v1");
    CHECK(store_get(s, "x") == NULL);
    store_free(s);
}

TEST(store_bytes_follow_replacement)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);

    /* A key and its value both count. */
    CHECK_EQ(store_put(s, "key", "12345"), 0);
    CHECK_EQ(store_bytes(s), 3 + 5);
    /* A replacement counts the new value, not both. */
    CHECK_EQ(store_put(s, "key", "1"), 0);
    CHECK_EQ(store_bytes(s), 3 + 1);
    CHECK_EQ(store_put(s, "key", "1234567890"), 0);
    CHECK_EQ(store_bytes(s), 3 + 10);
    CHECK_EQ(store_put(s, "k2", "ab"), 0);
    CHECK_EQ(store_bytes(s), 13 + 4);
    CHECK_EQ(store_del(s, "key"), 0);
    CHECK_EQ(store_bytes(s), 4);
    CHECK_EQ(store_del(s, "k2"), 0);
    CHECK_EQ(store_bytes(s), 0);
    CHECK_EQ(store_keys(s), 0);
    /* Churn leaves nothing behind. */
    for (int i = 0; i < 1000; i++) {
        char k[32], v[64];
        snprintf(k, sizeof(k), "k%d", i % 7);
        snprintf(v, sizeof(v), "%0*d", i % 50, i);
        CHECK_EQ(store_put(s, k, v), 0);
    }
    for (int i = 0; i < 7; i++) {
        char k[32];
        snprintf(k, sizeof(k), "k%d", i);
        CHECK_EQ(store_del(s, k), 0);
    }
    CHECK_EQ(store_bytes(s), 0);
    store_free(s);
}

TEST(store_byte_limit)
{
    struct rec r;
    /* 10 bytes: "ab"+"cdefgh" (8) fits, two more fit, a third does not. */
    struct store *s = new_store(&r, 10, 100);

    CHECK_EQ(store_put(s, "ab", "cdefgh"), 0);
    CHECK_EQ(store_put(s, "x", "y"), 0);
    CHECK_EQ(store_bytes(s), 10);
    CHECK_EQ(store_put(s, "z", ""), -ENOSPC);
    CHECK(store_get(s, "z") == NULL);
    CHECK_EQ(store_keys(s), 2);
    CHECK_EQ(store_bytes(s), 10);
    /* Growing a value past the limit fails and keeps the old value. */
    CHECK_EQ(store_put(s, "x", "yy"), -ENOSPC);
    CHECK_STR(store_get(s, "x"), "y");
    CHECK_EQ(store_bytes(s), 10);
    /* A replacement only needs room for the difference: same size fits, smaller frees. */
    CHECK_EQ(store_put(s, "ab", "123456"), 0);
    CHECK_STR(store_get(s, "ab"), "123456");
    CHECK_EQ(store_put(s, "ab", "1"), 0);
    CHECK_EQ(store_bytes(s), 5);
    CHECK_EQ(store_put(s, "x", "yyyyyy"), 0);
    CHECK_EQ(store_bytes(s), 10);
    CHECK_EQ(store_put(s, "q", ""), -ENOSPC);
    /* A delete gives the room back. */
    CHECK_EQ(store_del(s, "x"), 0);
    CHECK_EQ(store_put(s, "q", "rstuvw"), 0);
    CHECK_EQ(store_bytes(s), 10);
    store_free(s);
}

TEST(store_key_limit)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 2);

    CHECK_EQ(store_put(s, "a", "1"), 0);
    CHECK_EQ(store_put(s, "b", "2"), 0);
    CHECK_EQ(store_put(s, "c", "3"), -ENOSPC);
    CHECK(store_get(s, "c") == NULL);
    CHECK_EQ(store_keys(s), 2);
    CHECK_EQ(store_bytes(s), 4);
    /* At the limit, an existing key may still be replaced. */
    CHECK_EQ(store_put(s, "a", "11"), 0);
    CHECK_STR(store_get(s, "a"), "11");
    CHECK_EQ(store_del(s, "b"), 0);
    CHECK_EQ(store_put(s, "c", "3"), 0);
    CHECK_EQ(store_keys(s), 2);
    store_free(s);
}

TEST(store_full_put_answers_no_waiter)
{
    struct rec r;
    struct store *s = new_store(&r, 4, 100);
    int owner;

    CHECK_EQ(store_wait(s, "key", 1000, &owner, 1), 0);
    CHECK_EQ(store_put(s, "key", "toolong"), -ENOSPC);
    CHECK_EQ(r.n, 0);
    CHECK_EQ(store_waiters(s), 1);
    CHECK_EQ(store_put(s, "key", "v"), 0);
    CHECK_EQ(r.n, 1);
    CHECK_STR(r.calls[0].value, "v");
    store_free(s);
}

TEST(store_put_answers_waiters_of_its_key)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int a, b;
    const struct call *c;

    CHECK_EQ(store_wait(s, "nccl_id", 1000, &a, 7), 0);
    CHECK_EQ(store_wait(s, "nccl_id", 1000, &b, 8), 0);
    CHECK_EQ(store_wait(s, "other", 1000, &a, 9), 0);
    CHECK_EQ(store_waiters(s), 3);
    CHECK_EQ(store_put(s, "unrelated", "x"), 0);
    CHECK_EQ(r.n, 0);
    CHECK_EQ(store_put(s, "nccl_id", "abc"), 0);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(store_waiters(s), 1);
    c = find_call(&r, 7);
    CHECK(c != NULL);
    CHECK(c->owner == &a);
    CHECK_STR(c->key, "nccl_id");
    CHECK(c->has_value);
    CHECK_STR(c->value, "abc");
    c = find_call(&r, 8);
    CHECK(c != NULL);
    CHECK(c->owner == &b);
    CHECK_STR(c->value, "abc");
    /* Answered waiters are gone: a second put answers nobody. */
    CHECK_EQ(store_put(s, "nccl_id", "def"), 0);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(store_put(s, "other", "o"), 0);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.calls[2].id, 9);
    CHECK_STR(r.calls[2].value, "o");
    CHECK_EQ(store_waiters(s), 0);
    store_free(s);
}

TEST(store_expire_answers_null_at_deadline)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int owner;

    CHECK_EQ(store_wait(s, "k", 100, &owner, 1), 0);
    CHECK_EQ(store_wait(s, "k", 200, &owner, 2), 0);
    CHECK_EQ(store_wait(s, "j", 150, &owner, 3), 0);
    CHECK_EQ(store_expire(s, 99), 0);
    CHECK_EQ(r.n, 0);
    /* A deadline is inclusive. */
    CHECK_EQ(store_expire(s, 100), 1);
    CHECK_EQ(r.n, 1);
    CHECK_EQ(r.calls[0].id, 1);
    CHECK_STR(r.calls[0].key, "k");
    CHECK(!r.calls[0].has_value);
    /* A put answers what is left of its key; the expired one is not answered twice. */
    CHECK_EQ(store_put(s, "k", "v"), 0);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.calls[1].id, 2);
    CHECK(r.calls[1].has_value);
    CHECK_EQ(store_expire(s, 10000), 1);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.calls[2].id, 3);
    CHECK(!r.calls[2].has_value);
    CHECK_EQ(store_expire(s, 20000), 0);
    CHECK_EQ(store_waiters(s), 0);
    store_free(s);
}

TEST(store_drop_owner_forgets_its_waiters)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int a, b;

    CHECK_EQ(store_wait(s, "k", 100, &a, 1), 0);
    CHECK_EQ(store_wait(s, "k", 100, &b, 2), 0);
    CHECK_EQ(store_wait(s, "j", 100, &a, 3), 0);
    CHECK_EQ(store_wait(s, "k", 100, &a, 4), 0);
    store_drop_owner(s, &a);
    CHECK_EQ(r.n, 0);
    CHECK_EQ(store_waiters(s), 1);
    CHECK_EQ(store_put(s, "k", "v"), 0);
    CHECK_EQ(store_put(s, "j", "w"), 0);
    CHECK_EQ(r.n, 1);
    CHECK_EQ(r.calls[0].id, 2);
    CHECK(r.calls[0].owner == &b);
    /* An owner with no waiters, and a second drop, are no-ops. */
    store_drop_owner(s, &a);
    store_drop_owner(s, &b);
    CHECK_EQ(store_expire(s, 1000), 0);
    CHECK_EQ(r.n, 1);
    store_free(s);
}

TEST(store_free_drops_pending_waiters_silently)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int a;

    CHECK_EQ(store_put(s, "x", "y"), 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(store_wait(s, "k", 100, &a, i), 0);
    store_free(s);
    CHECK_EQ(r.n, 0);
}

TEST(store_callback_puts_another_key)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int a, b;

    CHECK_EQ(store_wait(s, "first", 1000, &a, 1), 0);
    CHECK_EQ(store_wait(s, "second", 1000, &b, 2), 0);
    /* The first answer puts "second", which answers b from inside the first call. */
    r.reput_key = "second";
    r.reput_value = "2";
    CHECK_EQ(store_put(s, "first", "1"), 0);
    CHECK_EQ(r.reput_ret, 0);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.calls[0].id, 1);
    CHECK_STR(r.calls[0].value, "1");
    CHECK_EQ(r.calls[1].id, 2);
    CHECK_STR(r.calls[1].value, "2");
    CHECK_STR(store_get(s, "second"), "2");
    CHECK_EQ(store_waiters(s), 0);
    store_free(s);
}

TEST(store_callback_replaces_the_key_being_answered)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    const struct call *c;
    int a;

    /* Three waiters of one key; the first answer replaces that key's value. The others were
     * answered by the first put and must get its value, which the replacement must not free
     * under them. */
    for (int i = 1; i <= 3; i++)
        CHECK_EQ(store_wait(s, "k", 1000, &a, i), 0);
    r.reput_key = "k";
    r.reput_value = "replaced-by-the-callback";
    CHECK_EQ(store_put(s, "k", "original-value"), 0);
    CHECK_EQ(r.reput_ret, 0);
    CHECK_EQ(r.n, 3);
    for (int i = 1; i <= 3; i++) {
        c = find_call(&r, i);
        CHECK(c != NULL);
        CHECK(c->has_value);
        CHECK_STR(c->value, "original-value");
    }
    CHECK_STR(store_get(s, "k"), "replaced-by-the-callback");
    CHECK_EQ(store_bytes(s), 1 + strlen("replaced-by-the-callback"));
    store_free(s);
}

TEST(store_callback_deletes_the_key_being_answered)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int a;

    CHECK_EQ(store_wait(s, "k", 1000, &a, 1), 0);
    CHECK_EQ(store_wait(s, "k", 1000, &a, 2), 0);
    r.del_key = "k";
    CHECK_EQ(store_put(s, "k", "short-lived"), 0);
    CHECK_EQ(r.del_ret, 0);
    CHECK_EQ(r.n, 2);
    CHECK_STR(r.calls[0].value, "short-lived");
    CHECK_STR(r.calls[1].value, "short-lived");
    CHECK(store_get(s, "k") == NULL);
    CHECK_EQ(store_bytes(s), 0);
    store_free(s);
}

TEST(store_callback_waits_again)
{
    struct rec r;
    struct store *s = new_store(&r, 1 << 20, 100);
    int a;

    /* A waiter registered from inside a call is not answered by the put that is running. */
    CHECK_EQ(store_wait(s, "k", 1000, &a, 1), 0);
    r.rewait_key = "k";
    CHECK_EQ(store_put(s, "k", "v1"), 0);
    CHECK_EQ(r.rewait_ret, 0);
    CHECK_EQ(r.n, 1);
    CHECK_EQ(store_waiters(s), 1);
    r.rewait_key = NULL;
    CHECK_EQ(store_put(s, "k", "v2"), 0);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.calls[1].id, 101);
    CHECK_STR(r.calls[1].value, "v2");
    /* Likewise from inside an expiry. */
    CHECK_EQ(store_wait(s, "j", 50, &a, 2), 0);
    r.rewait_key = "j";
    CHECK_EQ(store_expire(s, 60), 1);
    CHECK_EQ(store_waiters(s), 1);
    r.rewait_key = NULL;
    CHECK_EQ(store_expire(s, 999), 0);
    CHECK_EQ(store_expire(s, 1000), 1);
    CHECK_EQ(r.calls[3].id, 102);
    CHECK(!r.calls[3].has_value);
    store_free(s);
}

/* Many keys through the table's growth, deletions that move the entries after them back,
 * and puts again, against a plain record of what each key holds. */
TEST(store_many_keys_grow_delete_and_return)
{
    enum { N = 5000 };
    static char held[N][24];
    struct rec r;
    struct store *s = new_store(&r, 1 << 24, N);
    char key[32];
    size_t keys = 0, bytes = 0;

    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "addr/%d", i);
        snprintf(held[i], sizeof(held[i]), "10.0.%d.%d", i / 256, i % 256);
        CHECK_EQ(store_put(s, key, held[i]), 0);
        keys++;
        bytes += strlen(key) + strlen(held[i]);
    }
    CHECK_EQ(store_put(s, "one-too-many", "x"), -ENOSPC);
    /* Every third key goes, then every sixth comes back with another value. */
    for (int i = 0; i < N; i += 3) {
        snprintf(key, sizeof(key), "addr/%d", i);
        CHECK_EQ(store_del(s, key), 0);
        CHECK_EQ(store_del(s, key), -ENOENT);
        bytes -= strlen(key) + strlen(held[i]);
        keys--;
        held[i][0] = '\0';
    }
    for (int i = 0; i < N; i += 6) {
        snprintf(key, sizeof(key), "addr/%d", i);
        snprintf(held[i], sizeof(held[i]), "back-%d", i);
        CHECK_EQ(store_put(s, key, held[i]), 0);
        bytes += strlen(key) + strlen(held[i]);
        keys++;
    }
    for (int i = 0; i < N; i++) {
        const char *v;
        snprintf(key, sizeof(key), "addr/%d", i);
        v = store_get(s, key);
        if (held[i][0]) {
            CHECK(v != NULL);
            if (v)
                CHECK_STR(v, held[i]);
        } else {
            CHECK(v == NULL);
        }
    }
    CHECK_EQ(store_keys(s), keys);
    CHECK_EQ(store_bytes(s), bytes);
    store_free(s);
}
