/* The horovod rendezvous server (hvd.h): a libuv listener, one record per connection holding
 * its request, a strict parser of the little HTTP horovod's clients send, and the store:
 * entries in one hash table under "SCOPE/KEY" (the request path without its slash), each also
 * on its scope's list so that a finished scope is cleared in one pass.
 *
 * The parser is our own: Debian 12 packages no llhttp, and its http-parser is unmaintained
 * upstream (nodejs/http-parser#522). What is needed is a request line, header lines and a
 * Content-Length body, which a few strict functions say completely. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "log.h"
#include "refusals.h"
#include "banned.h"

/* Resolution of the request deadlines: a tenth of HVD_TIMEOUT_MS. */
#define TICK_MS           100
/* The most one read asks for: a 1 MiB value arrives in 16 reads, an 8 KiB header in one. */
#define READ_CHUNK        (64 * 1024)
/* Buckets a hash table starts with; it doubles whenever it holds more entries than buckets. */
#define HTAB_MIN          64
/* A node's horovod name: short, since it names a scope inside a URL path. */
#define NAME_MAX_HVD      63
/* An error response's body: the one line that says what was wrong. */
#define WHY_MAX           200
/* A source's refusals are summarised at most once in this window: the leader's port's own
 * window (leader_int.h's REFUSAL_WINDOW_MS), so both read alike. */
#define REFUSAL_WINDOW_MS 5000

/* --- the store ----------------------------------------------------------------------------- */

/* A value, shared by the store and the responses in flight that send it. */
struct hval {
    int refs;
    size_t len;
    char data[];
};

/* An intrusive hash-table link: the record that embeds it owns the key. */
struct hlink {
    struct hlink *next;
    uint64_t hash;
    const char *key;
    size_t klen;
};

struct htab {
    struct hlink **b;
    size_t nb, n;
};

struct hscope;

struct hentry {
    struct hlink link; /* key: path, "SCOPE/KEY" */
    struct hscope *scope;
    struct hentry *prev, *next; /* the scope's entries */
    struct hval *val;
    char path[];
};

struct hscope {
    struct hlink link; /* key: name */
    struct hentry *entries;
    size_t nentries;
    int size;        /* members of a layout scope; 0: an ad-hoc scope */
    char **finished; /* layout scopes: the distinct keys DELETEd since the last clear */
    int nfinished, capfinished;
    char name[];
};

/* --- connections --------------------------------------------------------------------------- */

struct hvd_server;
struct hconn;

typedef void (*method_fn)(struct hconn *c);

struct method {
    const char *name;
    method_fn run;
    bool needs_length; /* a body is the point: no Content-Length is 411 */
};

/* READING the request, WRITING the response, then closed; or, after a refusal that left some
 * of the request unread, DRAINING: our side shut down, the rest read and dropped until the
 * client closes, so that closing on unread bytes (a TCP reset) cannot destroy the response
 * on its way (RFC 9112 section 9.6). */
enum conn_state { CONN_READING, CONN_WRITING, CONN_DRAINING };

struct hconn {
    uv_tcp_t tcp;
    uv_shutdown_t shutdown_req;
    struct hvd_server *h;
    struct hconn *prev, *next;
    enum conn_state state;
    bool closing;
    bool drain; /* refused: drain what the client still sends after the response */
    int64_t deadline_ms;
    char peer[64]; /* "ADDR:PORT", for log lines */
    char addr[48]; /* ADDR alone: what refusals are counted by */
    char *buf;
    size_t len, cap;
    size_t limit;   /* bytes this request may have in all: the header's, then head + body */
    size_t scanned; /* bytes already searched for the header's end */
    size_t head_len, body_len;
    bool has_length;
    const struct method *method;
    /* The request's "SCOPE/KEY" at buf + path_off (buf moves as the body comes), path_len
     * bytes, scope_len of them the scope; path is set for the method's run. */
    const char *path;
    size_t path_off, path_len, scope_len;
};

/* One response: its head, the value or error text it sends, and the request that writes it. */
struct hwrite {
    uv_write_t req;
    struct hval *val; /* a reference, or NULL */
    char head[160];
    char text[WHY_MAX + 2];
};

struct hvd_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t tick;
    int handles_open;
    bool closing;
    bool accept_pending; /* a connection waits in libuv for a free slot */
    int port;
    size_t header_max, body_max, bytes_max, keys_max;
    size_t cfg_body_max, cfg_bytes_max,
        cfg_keys_max; /* the config's, before a layout bounds them */
    int conns_max, timeout_ms;

    struct sockaddr_storage *allow; /* the job's hosts (hvd_server_allow) */
    int nallow;
    struct refusals refusals;

    struct hconn *conns;
    int nconns;

    struct htab entries, scopes;
    size_t puts;  /* values stored since the start: horovod was used (hvd_server_puts) */
    size_t bytes; /* keys, values, scope names and finished keys held */

    char **hosts; /* the layout's horovod name of every node */
    int nnodes, nprocs;
};

static int64_t now_ms(const struct hvd_server *h)
{
    return (int64_t)uv_now(h->loop);
}

/* --- hash tables --------------------------------------------------------------------------- */

/* FNV-1a: short keys, no adversary who gains from collisions more than a slow store. */
static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t x = 14695981039346656037ULL;

    for (size_t i = 0; i < n; i++) {
        x ^= (unsigned char)p[i];
        x *= 1099511628211ULL;
    }
    return x;
}

static struct hlink *htab_find(const struct htab *t, const char *key, size_t klen)
{
    uint64_t x = hash_bytes(key, klen);

    if (!t->nb)
        return NULL;
    for (struct hlink *l = t->b[x & (t->nb - 1)]; l; l = l->next)
        if (l->hash == x && l->klen == klen && !memcmp(l->key, key, klen))
            return l;
    return NULL;
}

static int htab_grow(struct htab *t)
{
    size_t nb = t->nb ? 2 * t->nb : HTAB_MIN;
    struct hlink **b = calloc(nb, sizeof(*b));

    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < t->nb; i++) {
        while (t->b[i]) {
            struct hlink *l = t->b[i];
            t->b[i] = l->next;
            l->next = b[l->hash & (nb - 1)];
            b[l->hash & (nb - 1)] = l;
        }
    }
    free(t->b);
    t->b = b;
    t->nb = nb;
    return 0;
}

/* Links l, whose key is set and not in t yet. Returns 0 or -ENOMEM. */
static int htab_add(struct htab *t, struct hlink *l)
{
    if (t->n >= t->nb && htab_grow(t) < 0 && !t->nb)
        return -ENOMEM;
    l->hash = hash_bytes(l->key, l->klen);
    l->next = t->b[l->hash & (t->nb - 1)];
    t->b[l->hash & (t->nb - 1)] = l;
    t->n++;
    return 0;
}

static void htab_remove(struct htab *t, struct hlink *l)
{
    struct hlink **pp = &t->b[l->hash & (t->nb - 1)];

    while (*pp && *pp != l)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = l->next;
        t->n--;
    }
}

/* --- store operations ---------------------------------------------------------------------- */

static struct hval *hval_new(const char *data, size_t len)
{
    struct hval *v = malloc(sizeof(*v) + len);

    if (!v)
        return NULL;
    v->refs = 1;
    v->len = len;
    memcpy(v->data, data, len);
    return v;
}

static void hval_unref(struct hval *v)
{
    if (v && --v->refs == 0)
        free(v);
}

static struct hscope *scope_find(const struct hvd_server *h, const char *name, size_t n)
{
    struct hlink *l = htab_find(&h->scopes, name, n);

    return l ? (struct hscope *)((char *)l - offsetof(struct hscope, link)) : NULL;
}

static struct hentry *entry_find(const struct hvd_server *h, const char *path, size_t n)
{
    struct hlink *l = htab_find(&h->entries, path, n);

    return l ? (struct hentry *)((char *)l - offsetof(struct hentry, link)) : NULL;
}

/* A new scope of size members (0: ad-hoc) named name (n bytes), or NULL without memory. */
static struct hscope *scope_add(struct hvd_server *h, const char *name, size_t n, int size)
{
    struct hscope *s = calloc(1, sizeof(*s) + n + 1);

    if (!s)
        return NULL;
    memcpy(s->name, name, n);
    s->link.key = s->name;
    s->link.klen = n;
    s->size = size;
    if (htab_add(&h->scopes, &s->link) < 0) {
        free(s);
        return NULL;
    }
    h->bytes += n;
    return s;
}

static void entry_remove(struct hvd_server *h, struct hentry *e)
{
    struct hscope *s = e->scope;

    htab_remove(&h->entries, &e->link);
    if (e->prev)
        e->prev->next = e->next;
    else
        s->entries = e->next;
    if (e->next)
        e->next->prev = e->prev;
    s->nentries--;
    h->bytes -= e->link.klen + e->val->len;
    hval_unref(e->val);
    free(e);
}

static void finished_clear(struct hvd_server *h, struct hscope *s)
{
    for (int i = 0; i < s->nfinished; i++) {
        h->bytes -= strlen(s->finished[i]);
        free(s->finished[i]);
    }
    s->nfinished = 0;
}

static void scope_clear(struct hvd_server *h, struct hscope *s)
{
    while (s->entries)
        entry_remove(h, s->entries);
    finished_clear(h, s);
}

static void scope_free(struct hvd_server *h, struct hscope *s)
{
    scope_clear(h, s);
    htab_remove(&h->scopes, &s->link);
    h->bytes -= s->link.klen;
    free(s->finished);
    free(s);
}

/* Empties the store; layout scopes stay (empty) unless all is set. */
static void store_clear(struct hvd_server *h, bool all)
{
    for (size_t i = 0; i < h->scopes.nb; i++) {
        struct hlink *l = h->scopes.b[i];
        while (l) {
            struct hscope *s = (struct hscope *)((char *)l - offsetof(struct hscope, link));
            l = l->next;
            if (all || !s->size)
                scope_free(h, s);
            else
                scope_clear(h, s);
        }
    }
}

/* Whether the store can take add more bytes in add_keys more keys. */
static bool store_fits(const struct hvd_server *h, size_t add, size_t add_keys)
{
    return h->bytes + add <= h->bytes_max && h->entries.n + add_keys <= h->keys_max;
}

/* --- responses ----------------------------------------------------------------------------- */

static const struct status {
    int code;
    const char *reason;
} statuses[] = {
    {200, "OK"},
    {400, "Bad Request"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {408, "Request Timeout"},
    {411, "Length Required"},
    {413, "Content Too Large"},
    {431, "Request Header Fields Too Large"},
    {501, "Not Implemented"},
    {507, "Insufficient Storage"},
};

static const char *reason_of(int code)
{
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
        if (statuses[i].code == code)
            return statuses[i].reason;
    return "Error";
}

static void on_conn_closed(uv_handle_t *handle);
static void accept_one(struct hvd_server *h);
static void maybe_free(struct hvd_server *h);

/* Closes c once; it is freed in the close callback, never inside one of its own. */
static void conn_close(struct hconn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_drain_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    /* What a draining connection reads is dropped: one buffer serves them all. */
    static char sink[4096];

    (void)handle;
    (void)suggested;
    *buf = uv_buf_init(sink, sizeof(sink));
}

static void on_drain_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0)
        conn_close(stream->data);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)req;
    (void)status;
}

static void on_written(uv_write_t *req, int status)
{
    struct hwrite *w = (struct hwrite *)req;
    struct hconn *c = req->handle->data;

    hval_unref(w->val);
    free(w);
    if (c->closing)
        return;
    if (status == 0 && c->drain &&
        uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) == 0 &&
        uv_read_start((uv_stream_t *)&c->tcp, on_drain_alloc, on_drain_read) == 0) {
        c->state = CONN_DRAINING;
        c->deadline_ms = now_ms(c->h) + c->h->timeout_ms;
        return;
    }
    conn_close(c);
}

/* Sends the response and closes c after it: code with val (a new reference taken) as the
 * body, or with the text why (a line) when val is NULL. */
static void respond(struct hconn *c, int code, struct hval *val, const char *why)
{
    struct hwrite *w = calloc(1, sizeof(*w));
    uv_buf_t bufs[2];
    size_t body;
    int ret;

    uv_read_stop((uv_stream_t *)&c->tcp);
    c->state = CONN_WRITING;
    c->deadline_ms = now_ms(c->h) + c->h->timeout_ms;
    if (!w) {
        conn_close(c);
        return;
    }
    if (val) {
        w->val = val;
        val->refs++;
        bufs[1] = uv_buf_init(val->data, (unsigned)val->len);
        body = val->len;
    } else {
        snprintf(w->text, sizeof(w->text), "%s%s", why ? why : "", why ? "\n" : "");
        bufs[1] = uv_buf_init(w->text, (unsigned)strlen(w->text));
        body = strlen(w->text);
    }
    /* Header names as horovod's C++ client matches them: case-sensitively. */
    snprintf(w->head, sizeof(w->head),
             "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
             reason_of(code), body);
    bufs[0] = uv_buf_init(w->head, (unsigned)strlen(w->head));
    ret = uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, body ? 2 : 1, on_written);
    if (ret < 0) {
        hval_unref(w->val);
        free(w);
        conn_close(c);
    }
}

/* A request that cannot be served: a log line naming the peer and why (the first of its
 * burst: refusals.h counts the rest), then the answer. */
static void refuse(struct hconn *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void refuse(struct hconn *c, int code, const char *fmt, ...)
{
    char why[WHY_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (refusals_note(&c->h->refusals, now_ms(c->h), c->addr, why))
        log_warn("horovod rendezvous: refused a request from '%s': %s", c->peer, why);
    c->drain = true;
    respond(c, code, NULL, why);
}

/* --- methods ------------------------------------------------------------------------------- */

static void do_get(struct hconn *c)
{
    struct hentry *e = entry_find(c->h, c->path, c->path_len);

    if (e)
        respond(c, 200, e->val, NULL);
    else
        respond(c, 404, NULL, "no such key");
}

static void do_put(struct hconn *c)
{
    struct hvd_server *h = c->h;
    struct hentry *e = entry_find(h, c->path, c->path_len);
    struct hscope *s = scope_find(h, c->path, c->scope_len);
    const char *body = c->buf + c->head_len;
    size_t add = c->path_len + c->body_len + (s ? 0 : c->scope_len);
    struct hval *v;

    /* A replaced value frees its bytes first: the limit is on what is held after the put. */
    if (e && c->body_len <= e->val->len)
        add = 0;
    else if (e)
        add = c->body_len - e->val->len;
    if (!store_fits(h, add, e ? 0 : 1)) {
        refuse(c, 507, "store full (%zu bytes in %zu keys held) for 'PUT /%.*s'", h->bytes,
               h->entries.n, (int)c->path_len, c->path);
        return;
    }
    v = hval_new(body, c->body_len);
    if (!v)
        goto nomem;
    if (e) {
        h->bytes -= e->val->len;
        hval_unref(e->val);
        e->val = v;
        h->bytes += v->len;
        h->puts++;
        respond(c, 200, NULL, NULL);
        return;
    }
    if (!s && !(s = scope_add(h, c->path, c->scope_len, 0)))
        goto nomem_v;
    e = calloc(1, sizeof(*e) + c->path_len + 1);
    if (!e)
        goto nomem_v;
    memcpy(e->path, c->path, c->path_len);
    e->link.key = e->path;
    e->link.klen = c->path_len;
    if (htab_add(&h->entries, &e->link) < 0) {
        free(e);
        goto nomem_v;
    }
    e->scope = s;
    e->val = v;
    e->next = s->entries;
    if (s->entries)
        s->entries->prev = e;
    s->entries = e;
    s->nentries++;
    h->bytes += c->path_len + v->len;
    h->puts++;
    respond(c, 200, NULL, NULL);
    return;
nomem_v:
    hval_unref(v);
    if (s && !s->size && !s->nentries)
        scope_free(h, s);
nomem:
    refuse(c, 507, "out of memory for 'PUT /%.*s'", (int)c->path_len, c->path);
}

/* RendezvousHandler.do_DELETE. Two deliberate differences, both about a scope of the layout:
 * a rank that finishes twice (a retried DELETE) counts once, where horovod appends it again
 * and may clear a scope before its last member read it; and a clear forgets that scope's
 * finished ranks only, where horovod forgets every scope's (finished_list.clear()) and a
 * scope half-finished at that moment is then never cleared. */
static void do_delete(struct hconn *c)
{
    struct hvd_server *h = c->h;
    struct hscope *s = scope_find(h, c->path, c->scope_len);
    const char *key = c->path + c->scope_len + 1;
    size_t klen = c->path_len - c->scope_len - 1;
    struct hentry *e;

    if (s && s->size) {
        bool seen = false;
        for (int i = 0; i < s->nfinished && !seen; i++)
            seen = strlen(s->finished[i]) == klen && !memcmp(s->finished[i], key, klen);
        if (!seen) {
            char *copy;
            if (!store_fits(h, klen, 0)) {
                refuse(c, 507, "store full for 'DELETE /%.*s'", (int)c->path_len, c->path);
                return;
            }
            if (s->nfinished == s->capfinished) {
                int cap = s->capfinished ? 2 * s->capfinished : 16;
                char **nf = realloc(s->finished, (size_t)cap * sizeof(*nf));
                if (!nf)
                    goto nomem;
                s->finished = nf;
                s->capfinished = cap;
            }
            copy = strndup(key, klen);
            if (!copy)
                goto nomem;
            s->finished[s->nfinished++] = copy;
            h->bytes += klen;
        }
        if (s->nfinished >= s->size) {
            log_debug("horovod rendezvous: every member of '%s' finished; cleared", s->name);
            scope_clear(h, s);
        }
    } else if (s) {
        e = entry_find(h, c->path, c->path_len);
        if (e)
            entry_remove(h, e);
        if (!s->nentries)
            scope_free(h, s);
    }
    respond(c, 200, NULL, NULL);
    return;
nomem:
    refuse(c, 507, "out of memory for 'DELETE /%.*s'", (int)c->path_len, c->path);
}

static const struct method methods[] = {
    {"GET", do_get, false},
    {"PUT", do_put, true},
    {"DELETE", do_delete, false},
};

/* --- the request parser -------------------------------------------------------------------- */

/* RFC 9110's tchar: what a method or a header name is made of. */
static bool is_tchar(unsigned char ch)
{
    return isalnum(ch) || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* A path segment's byte: visible ASCII but the separator. */
static bool is_path_char(unsigned char ch)
{
    return ch > 0x20 && ch < 0x7f && ch != '/';
}

struct head {
    int status; /* 0 while the head is good, else the response's code */
    char why[WHY_MAX];
    bool has_host;
};

static void head_bad(struct head *hd, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void head_bad(struct head *hd, int status, const char *fmt, ...)
{
    va_list ap;

    if (hd->status)
        return;
    hd->status = status;
    va_start(ap, fmt);
    vsnprintf(hd->why, sizeof(hd->why), fmt, ap);
    va_end(ap);
}

static void hdr_content_length(struct hconn *c, struct head *hd, const char *v, size_t n)
{
    size_t x = 0;

    if (c->has_length) {
        head_bad(hd, 400, "more than one Content-Length");
        return;
    }
    c->has_length = true;
    if (n == 0 || n > 18) {
        head_bad(hd, n ? 413 : 400, "Content-Length '%.*s' %s", (int)(n < 32 ? n : 32), v,
                 n ? "is too large" : "is empty");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)v[i])) {
            head_bad(hd, 400, "Content-Length '%.*s' is not a number", (int)n, v);
            return;
        }
        x = 10 * x + (size_t)(v[i] - '0');
    }
    c->body_len = x;
}

static void hdr_transfer_encoding(struct hconn *c, struct head *hd, const char *v, size_t n)
{
    (void)c;
    head_bad(hd, 501, "Transfer-Encoding '%.*s' is not supported", (int)(n < 32 ? n : 32), v);
}

static void hdr_host(struct hconn *c, struct head *hd, const char *v, size_t n)
{
    (void)c;
    (void)v;
    (void)n;
    if (hd->has_host)
        head_bad(hd, 400, "more than one Host");
    hd->has_host = true;
}

/* The headers the server reads; any other is ignored. */
static const struct header {
    const char *name;
    void (*run)(struct hconn *c, struct head *hd, const char *v, size_t n);
} headers[] = {
    {"Content-Length", hdr_content_length},
    {"Transfer-Encoding", hdr_transfer_encoding},
    {"Host", hdr_host},
};

/* The request line: METHOD SP /SCOPE/KEY SP HTTP/1.x */
static void parse_request_line(struct hconn *c, struct head *hd, const char *p, size_t n,
                               bool *http11)
{
    const char *sp1 = memchr(p, ' ', n), *sp2, *target, *slash;
    size_t mlen, tlen;

    if (!sp1 || sp1 == p) {
        head_bad(hd, 400, "malformed request line");
        return;
    }
    mlen = (size_t)(sp1 - p);
    for (size_t i = 0; i < mlen; i++)
        if (!is_tchar((unsigned char)p[i])) {
            head_bad(hd, 400, "malformed request line");
            return;
        }
    target = sp1 + 1;
    sp2 = memchr(target, ' ', n - mlen - 1);
    if (!sp2 || sp2 == target) {
        head_bad(hd, 400, "malformed request line");
        return;
    }
    tlen = (size_t)(sp2 - target);
    if (n - (size_t)(sp2 + 1 - p) != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) ||
        (sp2[8] != '0' && sp2[8] != '1')) {
        head_bad(hd, 400, "not an HTTP/1.0 or HTTP/1.1 request");
        return;
    }
    *http11 = sp2[8] == '1';
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (strlen(methods[i].name) == mlen && !memcmp(methods[i].name, p, mlen))
            c->method = &methods[i];
    if (!c->method) {
        head_bad(hd, 405, "method '%.*s' is not GET, PUT or DELETE", (int)(mlen < 16 ? mlen : 16),
                 p);
        return;
    }
    /* horovod's paths: exactly two non-empty segments (http_server.py unpacks "_, scope, key"
     * from the path split at '/'). */
    slash = tlen > 1 ? memchr(target + 1, '/', tlen - 1) : NULL;
    if (target[0] != '/' || !slash || slash == target + 1 || slash == target + tlen - 1) {
        head_bad(hd, 400, "path '%.*s' is not /SCOPE/KEY", (int)(tlen < 64 ? tlen : 64), target);
        return;
    }
    for (const char *q = target + 1; q < target + tlen; q++)
        if (!is_path_char((unsigned char)*q) && q != slash) {
            head_bad(hd, 400, "path '%.*s' is not /SCOPE/KEY", (int)(tlen < 64 ? tlen : 64),
                     target);
            return;
        }
    c->path_off = (size_t)(target + 1 - c->buf);
    c->path_len = tlen - 1;
    c->scope_len = (size_t)(slash - target - 1);
}

/* One header line: NAME ":" OWS VALUE OWS, dispatched to the table. */
static void parse_header(struct hconn *c, struct head *hd, const char *p, size_t n)
{
    const char *colon = memchr(p, ':', n), *v, *end = p + n;
    size_t nlen;

    if (p[0] == ' ' || p[0] == '\t') {
        head_bad(hd, 400, "folded header line");
        return;
    }
    if (!colon || colon == p) {
        head_bad(hd, 400, "header line without a name");
        return;
    }
    nlen = (size_t)(colon - p);
    for (size_t i = 0; i < nlen; i++)
        if (!is_tchar((unsigned char)p[i])) {
            head_bad(hd, 400, "malformed header name");
            return;
        }
    for (v = colon + 1; v < end && (*v == ' ' || *v == '\t'); v++)
        ;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    for (const char *q = v; q < end; q++)
        if ((unsigned char)*q < 0x20 && *q != '\t') {
            head_bad(hd, 400, "control character in header '%.*s'", (int)(nlen < 32 ? nlen : 32),
                     p);
            return;
        }
    for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++)
        if (strlen(headers[i].name) == nlen && !strncasecmp(headers[i].name, p, nlen))
            headers[i].run(c, hd, v, (size_t)(end - v));
}

/* Parses the head (buf[0..head_len), ending in the blank line): 0, or the status to refuse
 * with and hd->why. Lines end in CRLF; a lone CR or LF, or a NUL, is malformed. */
static int parse_head(struct hconn *c, struct head *hd)
{
    const char *p = c->buf, *end = c->buf + c->head_len - 2;
    bool first = true, http11 = false;

    while (p < end && !hd->status) {
        const char *eol = memchr(p, '\r', (size_t)(end - p));
        size_t n = (size_t)(eol - p);
        if (!eol || eol[1] != '\n' || memchr(p, '\n', n) || memchr(p, '\0', n)) {
            head_bad(hd, 400, "line not ended by CRLF, or with a NUL");
            break;
        }
        if (first)
            parse_request_line(c, hd, p, n, &http11);
        else
            parse_header(c, hd, p, n);
        first = false;
        p = eol + 2;
    }
    if (!hd->status && http11 && !hd->has_host)
        head_bad(hd, 400, "HTTP/1.1 request without Host");
    if (!hd->status && c->method->needs_length && !c->has_length)
        head_bad(hd, 411, "no Content-Length in a '%s'", c->method->name);
    if (!hd->status && c->body_len > c->h->body_max)
        head_bad(hd, 413, "body of %zu bytes, over the limit of %zu", c->body_len, c->h->body_max);
    return hd->status;
}

/* Runs after every read: answers the request once it is whole, or refuses it as soon as what
 * arrived shows it is bad. */
static void process(struct hconn *c)
{
    struct head hd = {0};

    if (!c->head_len) {
        size_t from = c->scanned > 3 ? c->scanned - 3 : 0;
        const char *end = memmem(c->buf + from, c->len - from, "\r\n\r\n", 4);
        c->scanned = c->len;
        if (!end) {
            if (c->len >= c->h->header_max)
                refuse(c, 431, "request line and headers longer than %zu bytes", c->h->header_max);
            return;
        }
        c->head_len = (size_t)(end - c->buf) + 4;
        if (parse_head(c, &hd)) {
            refuse(c, hd.status, "%s", hd.why);
            return;
        }
        c->limit = c->head_len + c->body_len;
    }
    if (c->len > c->limit) {
        refuse(c, 400, "%zu bytes after the body of Content-Length %zu", c->len - c->limit,
               c->body_len);
        return;
    }
    if (c->len == c->limit) {
        c->path = c->buf + c->path_off;
        c->method->run(c);
    }
}

/* --- connections --------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct hconn *c = handle->data;
    size_t want = c->limit - c->len;

    (void)suggested;
    if (want > READ_CHUNK)
        want = READ_CHUNK;
    if (c->cap - c->len < want) {
        size_t cap = c->cap * 2 > c->len + want ? c->cap * 2 : c->len + want;
        char *nb;
        if (cap > c->limit)
            cap = c->limit;
        nb = realloc(c->buf, cap);
        if (!nb) {
            *buf = uv_buf_init(NULL, 0); /* on_read gets UV_ENOBUFS */
            return;
        }
        c->buf = nb;
        c->cap = cap;
    }
    *buf = uv_buf_init(c->buf + c->len, (unsigned)want);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct hconn *c = stream->data;

    (void)buf;
    if (nread == UV_ENOBUFS) {
        refuse(c, 507, "out of memory for a request of %zu bytes", c->limit);
        return;
    }
    if (nread < 0) {
        if (c->len && refusals_note(&c->h->refusals, now_ms(c->h), c->addr,
                                    "went away in the middle of a request"))
            log_warn("horovod rendezvous: '%s' went away in the middle of a request (%zu bytes): "
                     "%s",
                     c->peer, c->len, nread == UV_EOF ? "end of stream" : uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    c->len += (size_t)nread;
    if (nread > 0)
        process(c);
}

static void on_conn_closed(uv_handle_t *handle)
{
    struct hconn *c = handle->data;
    struct hvd_server *h = c->h;

    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->nconns--;
    free(c->buf);
    free(c);
    /* A slot is free: the connection libuv holds for us comes in. */
    if (h->accept_pending && !h->closing && h->nconns < h->conns_max) {
        h->accept_pending = false;
        accept_one(h);
    }
    maybe_free(h);
}

static void accept_one(struct hvd_server *h)
{
    struct hconn *c = calloc(1, sizeof(*c));
    struct sockaddr_storage ss, local;
    int len = sizeof(ss), ret;

    if (!c) {
        /* Left in libuv until a close frees memory and a slot. */
        log_error("horovod rendezvous: cannot accept: out of memory");
        h->accept_pending = true;
        return;
    }
    c->h = h;
    c->limit = h->header_max;
    snprintf(c->peer, sizeof(c->peer), "?");
    snprintf(c->addr, sizeof(c->addr), "?");
    uv_tcp_init(h->loop, &c->tcp);
    c->tcp.data = c;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h->nconns++;
    c->deadline_ms = now_ms(h) + h->timeout_ms;
    ret = uv_accept((uv_stream_t *)&h->listener, (uv_stream_t *)&c->tcp);
    if (ret == 0)
        ret = uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len);
    if (ret == 0) {
        int port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, c->addr, sizeof(c->addr));
            snprintf(c->peer, sizeof(c->peer), "[%s]:%d", c->addr, port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, c->addr, sizeof(c->addr));
            snprintf(c->peer, sizeof(c->peer), "%s:%d", c->addr, port);
        }
        len = sizeof(local);
        ret = uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&local, &len);
    }
    /* A stranger is closed unread: not a byte of its request is kept or answered. */
    if (ret == 0 &&
        !hvd_peer_allowed((struct sockaddr *)&ss, (struct sockaddr *)&local, h->allow, h->nallow)) {
        if (refusals_note(&h->refusals, now_ms(h), c->addr, "not one of the job's hosts"))
            log_warn("horovod rendezvous: refused a connection from '%s': not one of the job's "
                     "hosts",
                     c->peer);
        conn_close(c);
        return;
    }
    if (ret == 0)
        ret = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (ret < 0) {
        log_warn("horovod rendezvous: cannot accept '%s': %s", c->peer, uv_strerror(ret));
        conn_close(c);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    struct hvd_server *h = server->data;

    if (status < 0) {
        log_error("horovod rendezvous: cannot accept: %s", uv_strerror(status));
        return;
    }
    /* At the limit the connection stays in libuv, which stops accepting until uv_accept takes
     * it: the rest wait in the kernel's backlog. */
    if (h->nconns >= h->conns_max) {
        h->accept_pending = true;
        return;
    }
    accept_one(h);
}

/* Logs the refusal summaries due at now (every one when flush). */
static void log_refusals(struct hvd_server *h, int64_t now, bool flush)
{
    char line[256];

    while (refusals_next(&h->refusals, now, flush, line, sizeof(line)))
        log_warn("horovod rendezvous: %s", line);
}

static void on_tick(uv_timer_t *t)
{
    struct hvd_server *h = t->data;
    int64_t now = now_ms(h);

    for (struct hconn *c = h->conns, *next; c; c = next) {
        next = c->next;
        if (c->closing || now < c->deadline_ms)
            continue;
        if (c->state == CONN_READING)
            refuse(c, 408, "no whole request within %d ms (%zu bytes came)", h->timeout_ms, c->len);
        else if (c->state == CONN_DRAINING)
            conn_close(c);
        else {
            if (refusals_note(&h->refusals, now, c->addr, "did not take its response"))
                log_warn("horovod rendezvous: '%s' did not take its response within %d ms", c->peer,
                         h->timeout_ms);
            conn_close(c);
        }
    }
    log_refusals(h, now, false);
}

/* --- lifecycle ----------------------------------------------------------------------------- */

static void free_hosts(struct hvd_server *h)
{
    for (int i = 0; h->hosts && i < h->nnodes; i++)
        free(h->hosts[i]);
    free(h->hosts);
    h->hosts = NULL;
}

static void maybe_free(struct hvd_server *h)
{
    if (!h->closing || h->handles_open > 0 || h->conns)
        return;
    store_clear(h, true);
    free(h->entries.b);
    free(h->scopes.b);
    free_hosts(h);
    free(h->allow);
    free(h);
}

static void on_handle_closed(uv_handle_t *handle)
{
    struct hvd_server *h = handle->data;

    h->handles_open--;
    maybe_free(h);
}

int hvd_server_start(uv_loop_t *loop, const struct hvd_config *cfg, struct hvd_server **out)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss), ret = -1;
    struct hvd_server *h = calloc(1, sizeof(*h));

    if (!h)
        return -ENOMEM;
    h->loop = loop;
    h->header_max = cfg->header_max ? cfg->header_max : HVD_HEADER_MAX;
    h->body_max = h->cfg_body_max = cfg->body_max ? cfg->body_max : HVD_BODY_MAX;
    h->bytes_max = h->cfg_bytes_max =
        cfg->store_bytes_max ? cfg->store_bytes_max : HVD_STORE_BYTES_MAX;
    h->keys_max = h->cfg_keys_max = cfg->store_keys_max ? cfg->store_keys_max : HVD_STORE_KEYS_MAX;
    refusals_init(&h->refusals, REFUSAL_WINDOW_MS);
    h->conns_max = cfg->conns_max > 0 ? cfg->conns_max : HVD_CONNS_MAX;
    h->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : HVD_TIMEOUT_MS;
    if (uv_ip4_addr(cfg->bind_addr, 0, (struct sockaddr_in *)&ss) < 0 &&
        uv_ip6_addr(cfg->bind_addr, 0, (struct sockaddr_in6 *)&ss) < 0) {
        log_error("horovod rendezvous: cannot listen on '%s': not a numeric address",
                  cfg->bind_addr);
        free(h);
        return -EINVAL;
    }
    uv_tcp_init(loop, &h->listener);
    h->listener.data = h;
    h->handles_open++;
    uv_timer_init(loop, &h->tick);
    h->tick.data = h;
    h->handles_open++;
    ret = uv_tcp_bind(&h->listener, (struct sockaddr *)&ss, 0);
    if (ret == 0)
        ret = uv_listen((uv_stream_t *)&h->listener, SOMAXCONN, on_connection);
    if (ret == 0)
        ret = uv_tcp_getsockname(&h->listener, (struct sockaddr *)&ss, &len);
    if (ret == 0)
        ret = uv_timer_start(&h->tick, on_tick, TICK_MS, TICK_MS);
    if (ret < 0) {
        log_error("horovod rendezvous: cannot listen on '%s:0': %s", cfg->bind_addr,
                  uv_strerror(ret));
        hvd_server_close(h);
        return ret;
    }
    h->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out = h;
    return 0;
}

int hvd_server_port(const struct hvd_server *h)
{
    return h ? h->port : 0;
}

/* sa's IP as 16 bytes, an IPv4 one IPv4-mapped (::ffff:a.b.c.d); false for another family. */
static bool ip_bytes(const struct sockaddr *sa, unsigned char out[16])
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    if (sa->sa_family == AF_INET) {
        memcpy(out, mapped, sizeof(mapped));
        memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

bool hvd_peer_allowed(const struct sockaddr *peer, const struct sockaddr *local,
                      const struct sockaddr_storage *allow, int n)
{
    unsigned char p[16], x[16];

    if (!ip_bytes(peer, p))
        return false;
    if (local && ip_bytes(local, x) && !memcmp(p, x, sizeof(p)))
        return true;
    for (int i = 0; i < n; i++)
        if (ip_bytes((const struct sockaddr *)&allow[i], x) && !memcmp(p, x, sizeof(p)))
            return true;
    return false;
}

int hvd_server_allow(struct hvd_server *h, int n, const char *const *addrs)
{
    struct sockaddr_storage *a = calloc(n > 0 ? (size_t)n : 1, sizeof(*a));
    int kept = 0;

    if (!a)
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        if (uv_ip4_addr(addrs[i], 0, (struct sockaddr_in *)&a[kept]) == 0 ||
            uv_ip6_addr(addrs[i], 0, (struct sockaddr_in6 *)&a[kept]) == 0)
            kept++;
    free(h->allow);
    h->allow = a;
    h->nallow = kept;
    return kept;
}

void hvd_store_need(int nnodes, int nprocs, size_t *bytes, size_t *keys, size_t *body)
{
    size_t world = (size_t)nnodes * (size_t)nprocs;
    /* A rank's peers in its three scopes, itself counted in each: a bound. */
    size_t peers = world + (size_t)nprocs + (size_t)nnodes;
    size_t b = world * (HVD_GLOO_ADDR_BYTES * peers + HVD_RANK_SLACK);
    size_t k = world * HVD_RANK_KEYS;

    *bytes = b > HVD_STORE_MIN ? b : HVD_STORE_MIN;
    *keys = k > HVD_STORE_KEYS_MIN ? k : HVD_STORE_KEYS_MIN;
    *body = HVD_GLOO_ADDR_BYTES * world + HVD_RANK_SLACK;
}

size_t hvd_server_bytes_max(const struct hvd_server *h)
{
    return h->bytes_max;
}

static bool host_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;

    if (n == 0 || n > NAME_MAX_HVD)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return false;
    return true;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether every name is usable and distinct (sorted copy: a job may have thousands). */
static bool hosts_usable(int n, const char *const *hosts)
{
    const char **sorted;
    bool ok = true;

    for (int i = 0; i < n; i++)
        if (!host_name_ok(hosts[i]))
            return false;
    sorted = malloc((size_t)n * sizeof(*sorted));
    if (!sorted)
        return false;
    memcpy(sorted, hosts, (size_t)n * sizeof(*sorted));
    qsort(sorted, (size_t)n, sizeof(*sorted), cmp_str);
    for (int i = 1; i < n && ok; i++)
        ok = strcmp(sorted[i - 1], sorted[i]) != 0;
    free(sorted);
    return ok;
}

/* Adds a layout scope named prefix + suffix of size members. */
static int add_layout_scope(struct hvd_server *h, const char *prefix, const char *suffix, int size)
{
    char name[128];
    int n = snprintf(name, sizeof(name), "%s%s", prefix, suffix);

    return scope_add(h, name, (size_t)n, size) ? 0 : -ENOMEM;
}

int hvd_server_layout(struct hvd_server *h, int nnodes, int nprocs, const char *const *hosts)
{
    bool usable = hosts_usable(nnodes, hosts);
    char **names = calloc((size_t)nnodes, sizeof(*names));
    size_t need_bytes, need_keys, need_body;
    int ret = -ENOMEM;

    if (!names)
        return -ENOMEM;
    for (int i = 0; i < nnodes; i++) {
        if (usable)
            names[i] = strdup(hosts[i]);
        else if (asprintf(&names[i], "node%d", i) < 0)
            names[i] = NULL;
        if (!names[i])
            goto out;
    }
    if (!usable && nnodes > 1)
        log_info("horovod rendezvous: node names are not distinct URL-safe names; "
                 "HOROVOD_HOSTNAME is node0..node%d",
                 nnodes - 1);
    store_clear(h, true);
    free_hosts(h);
    h->hosts = names;
    h->nnodes = nnodes;
    h->nprocs = nprocs;
    names = NULL;
    hvd_store_need(nnodes, nprocs, &need_bytes, &need_keys, &need_body);
    h->bytes_max = need_bytes < h->cfg_bytes_max ? need_bytes : h->cfg_bytes_max;
    h->keys_max = need_keys < h->cfg_keys_max ? need_keys : h->cfg_keys_max;
    h->body_max = need_body < h->cfg_body_max ? need_body : h->cfg_body_max;
    /* RendezvousHTTPServer._extract_scope_size: "global" holds every rank, "local_" + host
     * that host's ranks, "cross_" + local rank the ranks of that local rank on every host. */
    ret = add_layout_scope(h, "global", "", nnodes * nprocs);
    for (int i = 0; i < nnodes && ret == 0; i++)
        ret = add_layout_scope(h, "local_", h->hosts[i], nprocs);
    for (int j = 0; j < nprocs && ret == 0; j++) {
        char lr[16];
        snprintf(lr, sizeof(lr), "%d", j);
        ret = add_layout_scope(h, "cross_", lr, nnodes);
    }
out:
    for (int i = 0; names && i < nnodes; i++)
        free(names[i]);
    free(names);
    return ret;
}

const char *hvd_server_host(const struct hvd_server *h, int node)
{
    return h && h->hosts && node >= 0 && node < h->nnodes ? h->hosts[node] : NULL;
}

void hvd_server_reset(struct hvd_server *h)
{
    if (h)
        store_clear(h, false);
}

size_t hvd_server_bytes(const struct hvd_server *h)
{
    return h->bytes;
}

size_t hvd_server_keys(const struct hvd_server *h)
{
    return h->entries.n;
}

size_t hvd_server_puts(const struct hvd_server *h)
{
    return h ? h->puts : 0;
}

void hvd_server_close(struct hvd_server *h)
{
    if (!h || h->closing)
        return;
    h->closing = true;
    log_refusals(h, now_ms(h), true);
    for (struct hconn *c = h->conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&h->listener, on_handle_closed);
    uv_close((uv_handle_t *)&h->tick, on_handle_closed);
}

int hvd_iface_of(const char *addr, char *out, size_t cap)
{
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    uv_interface_address_t *ifs;
    bool v4 = uv_ip4_addr(addr, 0, &in4) == 0;
    int n, ret = -ENOENT;

    if (!v4 && uv_ip6_addr(addr, 0, &in6) < 0)
        return -EINVAL;
    ret = uv_interface_addresses(&ifs, &n);
    if (ret < 0)
        return ret;
    ret = -ENOENT;
    for (int i = 0; i < n && ret; i++) {
        const uv_interface_address_t *f = &ifs[i];
        bool match =
            v4 ? f->address.address4.sin_family == AF_INET &&
                     f->address.address4.sin_addr.s_addr == in4.sin_addr.s_addr
               : f->address.address6.sin6_family == AF_INET6 &&
                     !memcmp(&f->address.address6.sin6_addr, &in6.sin6_addr, sizeof(in6.sin6_addr));
        if (match && (size_t)snprintf(out, cap, "%s", f->name) < cap)
            ret = 0;
    }
    uv_free_interface_addresses(ifs, n);
    return ret;
}
