/* Message decoding and validation: one table row per message type, its fields the type's
 * contract, read from a jansson tree or, for flat messages, in one pass (the fast path). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "errmsg.h"
#include "jtext.h"
#include "proto.h"
#include "banned.h"

/* A field of a message: its key, its kind (json_unpack's letters: s string, i int, I 64-bit
 * integer, F number, b boolean, o any JSON value, borrowed) and where it goes in struct msg.
 * Every message also has "type"; a key that is not listed is refused. */
struct field {
    const char *key;
    char kind;
    bool optional;
    size_t off;
};

#define FIELDS_MAX 12

struct proto_row {
    const char *name;
    struct field f[FIELDS_MAX]; /* up to the first with key NULL */
};

#define REQ(k, kind, member)                                                                       \
    {                                                                                              \
        k, kind, false, offsetof(struct msg, member)                                               \
    }
#define OPT(k, kind, member)                                                                       \
    {                                                                                              \
        k, kind, true, offsetof(struct msg, member)                                                \
    }

/* The progress record's fields (PROGRESS_FIELDS, proto.h): the report's row, and the table
 * proto_progress_pack/unpack walk. */
#define REPORT_FIELD(k, kind, req, member, range)                                                  \
    {k, kind, !(req), offsetof(struct msg, progress.member)},
#define RECORD_FIELD(k, kind, req, member, range)                                                  \
    {k, kind, !(req), offsetof(struct proto_progress, member)},
/* Every member of struct proto_progress has its line, of its type. */
#define KIND_OF(x) _Generic((x), json_int_t : 'I', double : 'F')
#define RECORD_KIND(k, kind, req, member, range)                                                   \
    _Static_assert(KIND_OF(((struct proto_progress *)0)->member) == (kind),                        \
                   "proto_progress." #member " is not of the kind PROGRESS_FIELDS says");
#define RECORD_SIZE(k, kind, req, member, range) +sizeof(((struct proto_progress *)0)->member)
PROGRESS_FIELDS(RECORD_KIND)
_Static_assert(0 PROGRESS_FIELDS(RECORD_SIZE) == sizeof(struct proto_progress),
               "struct proto_progress has a member that PROGRESS_FIELDS does not list");

static const struct field progress_fields[] = {PROGRESS_FIELDS(RECORD_FIELD)};
#define N_PROGRESS_FIELDS (sizeof(progress_fields) / sizeof(progress_fields[0]))

/* Indexed by enum msg_type: each row is the contract of its type. */
static const struct proto_row rows[MSG_TYPE_COUNT] = {
    [MSG_HELLO] = {"hello", {REQ("rank", 'i', rank), REQ("token", 's', value)}},
    [MSG_JOIN] = {"join",
                  {REQ("node_rank", 'i', node_rank), REQ("hostname", 's', hostname),
                   REQ("addr", 's', addr), REQ("nprocs", 'i', nprocs), REQ("gpus", 's', gpus),
                   OPT("preflight", 's', preflight),
                   OPT("preflight_skipped", 's', preflight_skipped),
                   OPT("mem_port", 'i', mem_port)}},
    [MSG_ASSIGN] = {"assign",
                    {REQ("generation", 'i', generation), REQ("world_size", 'i', world_size),
                     REQ("rank_base", 'i', rank_base), REQ("nnodes", 'i', nnodes),
                     REQ("master_addr", 's', master_addr), REQ("master_port", 'i', master_port),
                     OPT("hvd_port", 'i', hvd_port), OPT("hvd_host", 's', hvd_host),
                     OPT("spare", 'b', spare), OPT("mem_addr", 's', mem_addr),
                     OPT("mem_port", 'i', mem_port), OPT("mem_node", 'i', mem_node)}},
    [MSG_HB] = {"hb", {{0}}},
    [MSG_KV_PUT] = {"kv_put",
                    {REQ("id", 'I', id), REQ("key", 's', key), REQ("value", 's', value),
                     OPT("quiet", 'b', quiet)}},
    [MSG_KV_GET] = {"kv_get",
                    {REQ("id", 'I', id), REQ("key", 's', key), REQ("timeout_ms", 'I', timeout_ms)}},
    [MSG_KV_DEL] = {"kv_del", {REQ("id", 'I', id), REQ("key", 's', key)}},
    [MSG_BARRIER] = {"barrier",
                     {REQ("id", 'I', id), REQ("name", 's', key), OPT("count", 'i', count)}},
    [MSG_BARRIER_DONE] = {"barrier_done", {REQ("name", 's', key)}},
    [MSG_REPORT] = {"report", {PROGRESS_FIELDS(REPORT_FIELD)}},
    [MSG_PROGRESS] = {"progress",
                      {REQ("ranks", 'o', array), OPT("waiting", 'o', waiting),
                       OPT("output", 'o', output), OPT("active", 'o', active), OPT("met", 'b', met),
                       OPT("loaded", 'o', loaded), OPT("regroup_ok", 'o', regroup_ok)}},
    [MSG_PREEMPT] = {"preempt", {REQ("id", 'I', id)}},
    [MSG_SIGNAL] = {"signal", {OPT("id", 'I', id), REQ("signal", 'i', signal)}},
    [MSG_FINALIZE] = {"finalize", {REQ("id", 'I', id)}},
    [MSG_RANK_EXIT] = {"rank_exit",
                       {REQ("rank", 'i', rank), REQ("code", 'i', code), REQ("signal", 'i', signal),
                        REQ("oom", 'b', oom), REQ("killed", 'b', killed), REQ("tail", 's', value),
                        OPT("stack", 's', stack), OPT("error", 'o', error)}},
    [MSG_ABORT] = {"abort",
                   {REQ("cause", 's', value), OPT("status", 'i', status),
                    OPT("stacks", 'b', stacks)}},
    [MSG_FINISH] = {"finish", {REQ("status", 'i', status)}},
    [MSG_STATUS] = {"status", {REQ("id", 'I', id)}},
    [MSG_STATUS_REPLY] = {"status_reply", {REQ("id", 'I', id), REQ("job", 'o', array)}},
    [MSG_OK] = {"ok", {REQ("id", 'I', id)}},
    [MSG_KV_VAL] = {"kv_val", {REQ("id", 'I', id), REQ("value", 's', value)}},
    [MSG_ERROR] = {"error", {REQ("id", 'I', id), REQ("code", 's', key), REQ("msg", 's', value)}},
    [MSG_PROBE] = {"probe", {REQ("seq", 'i', count)}},
    [MSG_MEM_SAVE] = {"mem_save",
                      {REQ("id", 'I', id), REQ("name", 's', key), REQ("step", 'I', step)}},
    [MSG_MEM_LOAD] = {"mem_load", {REQ("id", 'I', id), REQ("name", 's', key)}},
    [MSG_MEM_COPY] = {"mem_copy",
                      {REQ("id", 'I', id), REQ("path", 's', value), REQ("step", 'I', step),
                       REQ("size", 'I', size)}},
    [MSG_MEM_PUT] = {"mem_put",
                     {REQ("id", 'I', id), REQ("rank", 'i', rank), REQ("name", 's', key),
                      REQ("step", 'I', step), REQ("size", 'I', size)}},
    [MSG_MEM_GET] = {"mem_get",
                     {REQ("id", 'I', id), REQ("rank", 'i', rank), REQ("name", 's', key)}},
    [MSG_REGROUP_OK] = {"regroup_ok", {REQ("id", 'I', id)}},
    [MSG_REGROUP] = {"regroup",
                     {OPT("id", 'I', id), REQ("generation", 'i', generation),
                      OPT("mem_addr", 's', mem_addr), OPT("mem_port", 'i', mem_port),
                      OPT("mem_node", 'i', mem_node)}},
};

bool proto_mem_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;

    if (n == 0 || n > PROTO_MEM_NAME_MAX || name[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

int proto_mem_path(char *buf, size_t n, const char *dir, int rank, const char *name, bool tmp)
{
    int len;

    if (!proto_mem_name_ok(name) || rank < 0)
        return -EINVAL;
    len = snprintf(buf, n, "%s/r%d.%s%s", dir, rank, name, tmp ? ".tmp" : "");
    return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

int proto_mem_dir(char *buf, size_t n, const char *job_id, int node)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    int len;

    if (!job_id || !*job_id || strchr(job_id, '/') || node < 0)
        return -EINVAL;
    len = snprintf(buf, n, "%s/gpurun-%s-n%d", base && *base ? base : "/tmp", job_id, node);
    return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

const char *proto_type_name(enum msg_type t)
{
    return (unsigned)t < MSG_TYPE_COUNT ? rows[t].name : "?";
}

static int find_type(const char *name)
{
    for (int i = 0; i < MSG_TYPE_COUNT; i++)
        if (!strcmp(rows[i].name, name))
            return i;
    return -1;
}

/* The limits the formats cannot say: lengths and ranges. */
static int check_limits(const struct msg *m, struct proto_error *err)
{
    const char *what = proto_type_name(m->type);

    if (m->key && strlen(m->key) > PROTO_KEY_MAX)
        return errmsg_set(&err->why, -EBADMSG, "'%s': key longer than %d bytes", what,
                          PROTO_KEY_MAX);
    if (m->value && strlen(m->value) > PROTO_VALUE_MAX)
        return errmsg_set(&err->why, -EBADMSG, "'%s': value longer than %d bytes", what,
                          PROTO_VALUE_MAX);
    /* Exit statuses are 0..255 (256 would read as success) and signals below 128, so that
     * 128 + signal is one too. */
    if (m->node_rank < 0 || m->nprocs < 0 || m->rank < 0 || m->count < 0 || m->world_size < 0 ||
        m->rank_base < 0 || m->nnodes < 0 || m->generation < 0 || m->master_port < 0 ||
        m->master_port > 65535 || m->hvd_port < 0 || m->hvd_port > 65535 || m->status < 0 ||
        m->status > 255 || m->code < 0 || m->code > 255 || m->signal < 0 || m->signal > 127)
        return errmsg_set(&err->why, -EBADMSG, "'%s': negative or out-of-range number", what);
    if (m->hvd_host && strlen(m->hvd_host) > PROTO_NAME_MAX)
        return errmsg_set(&err->why, -EBADMSG, "'%s': hvd_host longer than %d bytes", what,
                          PROTO_NAME_MAX);
    if (m->stack && strlen(m->stack) > PROTO_STACK_MAX)
        return errmsg_set(&err->why, -EBADMSG, "'%s': stack longer than %d bytes", what,
                          PROTO_STACK_MAX);
    if (m->error && !json_is_object(m->error))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'error' must be an object", what);
    if (m->progress.total_steps < 0 || (m->type == MSG_SIGNAL && m->signal == 0))
        return errmsg_set(&err->why, -EBADMSG, "'%s': negative or out-of-range number", what);
    if (m->type == MSG_PROGRESS && !json_is_array(m->array))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'ranks' must be an array", what);
    if (m->waiting && !json_is_array(m->waiting))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'waiting' must be an array", what);
    if (m->output && !json_is_array(m->output))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'output' must be an array", what);
    if (m->active && !json_is_array(m->active))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'active' must be an array", what);
    if (m->loaded && !json_is_array(m->loaded))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'loaded' must be an array", what);
    if (m->regroup_ok && !json_is_array(m->regroup_ok))
        return errmsg_set(&err->why, -EBADMSG, "'%s': 'regroup_ok' must be an array", what);
    if (m->type == MSG_STATUS_REPLY && !json_is_object(m->array))
        return errmsg_set(&err->why, -EBADMSG, "'status_reply': 'job' must be an object");
    return 0;
}

static const char *kind_name(char kind)
{
    switch (kind) {
    case 's':
        return "a string";
    case 'i':
    case 'I':
        return "an integer";
    case 'F':
        return "a number";
    case 'b':
        return "true or false";
    default:
        return "a JSON value";
    }
}

/* Stores what v (of the field's kind) holds at its place in m; -EBADMSG with err said when v
 * is not of the kind, or not in int's range for an 'i'. */
static int store_json(const struct proto_row *row, const struct field *f, json_t *v, struct msg *m,
                      struct proto_error *err)
{
    char *at = (char *)m + f->off;
    bool ok;

    switch (f->kind) {
    case 's':
        ok = json_is_string(v);
        if (ok)
            *(const char **)at = json_string_value(v);
        if (ok && !strcmp(f->key, "value"))
            m->value_len = json_string_length(v);
        break;
    case 'i':
        ok = json_is_integer(v);
        if (ok && (json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX))
            return errmsg_set(&err->why, -EBADMSG, "'%s': '%s' out of range", row->name, f->key);
        if (ok)
            *(int *)at = (int)json_integer_value(v);
        break;
    case 'I':
        ok = json_is_integer(v);
        if (ok)
            *(json_int_t *)at = json_integer_value(v);
        break;
    case 'F':
        ok = json_is_number(v);
        if (ok)
            *(double *)at = json_number_value(v);
        break;
    case 'b':
        ok = json_is_boolean(v);
        if (ok)
            *(int *)at = json_is_true(v);
        break;
    default:
        ok = true;
        *(json_t **)at = v;
        break;
    }
    if (!ok)
        return errmsg_set(&err->why, -EBADMSG, "'%s': '%s' must be %s", row->name, f->key,
                          kind_name(f->kind));
    return 0;
}

/* Fills m from root, an object whose "type" names row t: every field of the row, each of its
 * kind, the required ones present, no other key. */
static int decode_root(json_t *root, struct msg *m, struct proto_error *err)
{
    const struct proto_row *row;
    size_t found = 1; /* "type" */
    json_t *jt, *v;
    int t;

    if (!json_is_object(root))
        return errmsg_set(&err->why, -EBADMSG, "message is not a JSON object");
    jt = json_object_get(root, "type");
    if (!json_is_string(jt))
        return errmsg_set(&err->why, -EBADMSG, "message has no string 'type'");
    t = find_type(json_string_value(jt));
    if (t < 0)
        return errmsg_set(&err->why, -EBADMSG, "unknown message type '%.64s'",
                          json_string_value(jt));
    row = &rows[t];
    memset(m, 0, sizeof(*m));
    m->type = (enum msg_type)t;
    for (const struct field *f = row->f; f < row->f + FIELDS_MAX && f->key; f++) {
        v = json_object_get(root, f->key);
        if (!v && f->optional && f->kind == 'F')
            *(double *)((char *)m + f->off) = NAN; /* a number not given: unknown, not 0 */
        if (!v && f->optional)
            continue;
        if (!v)
            return errmsg_set(&err->why, -EBADMSG, "'%s': '%s' missing", row->name, f->key);
        found++;
        if (store_json(row, f, v, m, err) < 0)
            return -EBADMSG;
    }
    if (json_object_size(root) != found) {
        const char *key;
        json_object_foreach(root, key, v)
        {
            bool known = !strcmp(key, "type");
            for (const struct field *f = row->f; !known && f < row->f + FIELDS_MAX && f->key; f++)
                known = !strcmp(key, f->key);
            if (!known) {
                errmsg_set(&err->why, -EBADMSG, "'%s': surplus key '%.64s'", row->name, key);
                break;
            }
        }
        return -EBADMSG;
    }
    return check_limits(m, err);
}

/* --- the fast path: flat messages without a JSON tree ------------------------------------ */

/* Nearly every message on the busy paths (store requests, barriers, joins, exits) is one flat
 * object of plain ASCII strings and integers, as this project's senders write them (compact,
 * no escapes). Those are read here in one pass, their strings copied into one block: at
 * 12,500 agents building and freeing a jansson tree per message was a fifth of the leader's
 * time. Anything else (spaces, escapes, non-ASCII, reals, null, nested values, a duplicate or
 * unknown key, a missing field, a value out of range) is left to decode_root, which gives
 * the same result for what both accept and is the one that explains a refusal; the tests
 * hold the two to the same output (tests/test_proto.c, and the fuzz harness). */

#define FAST_FIELDS_MAX (FIELDS_MAX + 1)

struct fast_field {
    const char *key, *str; /* str: NUL-terminated in the block, for a string */
    size_t key_len, str_len;
    char kind; /* 's', 'n' (integer in num) or 'b' (num 0 or 1) */
    long long num;
};

/* A string of printable ASCII without escapes: p at its opening quote. Returns the length
 * read past the closing quote's end, or 0 when the fast path must not take it. */
static size_t fast_string(const char *p, const char *end, size_t *len)
{
    const char *q = p + 1;

    while (q < end && *q != '"') {
        if (*q < 0x20 || *q > 0x7e || *q == '\\')
            return 0;
        q++;
    }
    if (q >= end)
        return 0;
    *len = (size_t)(q - p - 1);
    return (size_t)(q + 1 - p);
}

/* An integer as JSON writes it, at most 18 digits (no overflow of long long). */
static size_t fast_number(const char *p, const char *end, long long *out)
{
    const char *q = p;
    long long v = 0;
    bool neg = false;
    int digits = 0;

    if (q < end && *q == '-') {
        neg = true;
        q++;
    }
    if (q >= end || *q < '0' || *q > '9' ||
        (*q == '0' && q + 1 < end && q[1] >= '0' && q[1] <= '9'))
        return 0;
    while (q < end && *q >= '0' && *q <= '9' && digits < 18) {
        v = v * 10 + (*q++ - '0');
        digits++;
    }
    if (q < end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E'))
        return 0;
    *out = neg ? -v : v;
    return (size_t)(q - p);
}

/* Splits text (len bytes, a copy the strings are cut in) into fields; false when it is not a
 * flat object the fast path takes. */
static bool fast_split(char *text, size_t len, struct fast_field *ff, int *n)
{
    char *p = text, *end = text + len;

    *n = 0;
    if (len < 2 || *p++ != '{' || end[-1] != '}')
        return false;
    end--;
    if (p == end)
        return true;
    for (;;) {
        struct fast_field *f = &ff[*n];
        size_t k, vlen = 0;

        if (*n == FAST_FIELDS_MAX || p >= end || *p != '"' ||
            !(k = fast_string(p, end, &f->key_len)))
            return false;
        f->key = p + 1;
        p[k - 1] = '\0';
        p += k;
        if (p >= end || *p++ != ':' || p >= end)
            return false;
        if (*p == '"') {
            if (!(k = fast_string(p, end, &vlen)))
                return false;
            f->kind = 's';
            f->str = p + 1;
            f->str_len = vlen;
            p[k - 1] = '\0';
        } else if (end - p >= 4 && !memcmp(p, "true", 4)) {
            f->kind = 'b', f->num = 1, k = 4;
        } else if (end - p >= 5 && !memcmp(p, "false", 5)) {
            f->kind = 'b', f->num = 0, k = 5;
        } else if (!(k = fast_number(p, end, &f->num))) {
            return false;
        } else {
            f->kind = 'n';
        }
        p += k;
        (*n)++;
        if (p == end)
            return true;
        if (*p++ != ',')
            return false;
    }
}

/* Stores field f from hit, the message's field of that key, into m; false when its kind is
 * not f's (or an 'i' is out of int's range): the message is then for decode_root. */
static bool fast_store(const struct field *f, const struct fast_field *hit, struct msg *m)
{
    char *at = (char *)m + f->off;

    if (f->kind == 's' && hit->kind == 's') {
        *(const char **)at = hit->str;
        if (!strcmp(f->key, "value"))
            m->value_len = hit->str_len;
    } else if (f->kind == 'i' && hit->kind == 'n' && hit->num >= INT_MIN && hit->num <= INT_MAX) {
        *(int *)at = (int)hit->num;
    } else if (f->kind == 'I' && hit->kind == 'n') {
        *(json_int_t *)at = (json_int_t)hit->num;
    } else if (f->kind == 'F' && hit->kind == 'n') {
        *(double *)at = (double)hit->num;
    } else if (f->kind == 'b' && hit->kind == 'b') {
        *(int *)at = (int)hit->num;
    } else {
        return false;
    }
    return true;
}

/* Fills m from the n fields of a message of type t: every field of its row once, of the
 * row's kind, the required ones present, nothing else. False when the message is for
 * decode_root. */
static bool fast_fill(int t, const struct fast_field *ff, int n, struct msg *m)
{
    const struct proto_row *row = &rows[t];
    struct proto_error ignored;
    int matched = 0;

    memset(m, 0, sizeof(*m));
    m->type = (enum msg_type)t;
    for (const struct field *f = row->f; f < row->f + FIELDS_MAX && f->key; f++) {
        const struct fast_field *hit = NULL;
        for (int i = 0; i < n; i++) {
            /* The first byte first: most pairs differ there (strcmp here was 2% of a large
             * job's leader at its start). */
            if (ff[i].key[0] != f->key[0] || strcmp(ff[i].key, f->key))
                continue;
            if (hit)
                return false; /* a duplicate */
            hit = &ff[i];
        }
        if (!hit && f->optional && f->kind == 'F')
            *(double *)((char *)m + f->off) = NAN; /* not given: unknown */
        if (!hit && !f->optional)
            return false;
        if (hit && !fast_store(f, hit, m))
            return false;
        matched += hit != NULL;
    }
    /* "type" once, and no key the row does not have. */
    return matched + 1 == n && check_limits(m, &ignored) == 0;
}

/* Decodes buf the fast way into m: true when done (m owns its block), false when the message
 * is for decode_root. */
static bool fast_decode(const uint8_t *buf, size_t len, struct msg *m)
{
    struct fast_field ff[FAST_FIELDS_MAX];
    int n, t = -1;
    char *text;

    /* The message as it came (for proto_msg_json), then the copy its strings are cut in. */
    if (len > PROTO_FAST_MAX || !(text = malloc(2 * len + 2)))
        return false;
    memcpy(text, buf, len);
    text[len] = '\0';
    memcpy(text + len + 1, buf, len);
    text[2 * len + 1] = '\0';
    if (fast_split(text + len + 1, len, ff, &n)) {
        for (int i = 0; i < n; i++)
            if (ff[i].key_len == 4 && !memcmp(ff[i].key, "type", 4) && ff[i].kind == 's' && t < 0)
                t = find_type(ff[i].str);
    }
    if (t >= 0 && fast_fill(t, ff, n, m)) {
        m->text = text;
        m->text_len = len;
        return true;
    }
    free(text);
    memset(m, 0, sizeof(*m));
    return false;
}

/* jansson's reading of len bytes of buf into m (the tree kept in m->root). */
static int tree_decode(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err)
{
    json_error_t je;
    json_t *root;
    int ret;

    root = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return errmsg_set(&err->why, -EBADMSG, "not JSON at byte %d: %s", je.position, je.text);
    ret = decode_root(root, m, err);
    if (ret < 0) {
        json_t *id = json_object_get(root, "id");
        if (json_is_integer(id))
            err->id = json_integer_value(id);
        json_decref(root);
        memset(m, 0, sizeof(*m));
        return ret;
    }
    m->root = root;
    return 0;
}

/* Both decoders: no JSON text holds a NUL byte (a string's is escaped), so one ends the
 * message, and what follows it is a probe's pad, which nothing reads. */
static int decode(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err, bool fast)
{
    const uint8_t *nul = memchr(buf, '\0', len);
    size_t at = nul ? (size_t)(nul - buf) : len;
    int ret = 0;

    memset(m, 0, sizeof(*m));
    err->id = 0;
    if (!fast || !fast_decode(buf, at, m))
        ret = tree_decode(buf, at, m, err);
    if (ret == 0 && nul && m->type != MSG_PROBE) {
        err->id = m->id;
        proto_msg_release(m);
        return errmsg_set(&err->why, -EBADMSG,
                          "a NUL byte at byte %zu: only a probe has bytes after its message", at);
    }
    if (ret == 0)
        m->tail_len = nul ? len - at - 1 : 0;
    return ret;
}

int proto_decode(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err)
{
    return decode(buf, len, m, err, true);
}

int proto_decode_tree(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err)
{
    return decode(buf, len, m, err, false);
}

static bool same_str(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

bool proto_msg_same(const struct msg *a, const struct msg *b)
{
    const struct proto_row *row = &rows[a->type];

    if (a->type != b->type || a->value_len != b->value_len)
        return false;
    for (const struct field *f = row->f; f < row->f + FIELDS_MAX && f->key; f++) {
        const char *x = (const char *)a + f->off, *y = (const char *)b + f->off;
        switch (f->kind) {
        case 's':
            if (!same_str(*(const char *const *)x, *(const char *const *)y))
                return false;
            break;
        case 'i':
        case 'b':
            if (*(const int *)x != *(const int *)y)
                return false;
            break;
        case 'I':
            if (*(const json_int_t *)x != *(const json_int_t *)y)
                return false;
            break;
        case 'F': /* NAN (not given) equals NAN */
            if (memcmp(x, y, sizeof(double)))
                return false;
            break;
        default:
            if (!(*(json_t *const *)x == *(json_t *const *)y ||
                  json_equal(*(json_t *const *)x, *(json_t *const *)y)))
                return false;
            break;
        }
    }
    return true;
}

json_t *proto_msg_json(struct msg *m)
{
    /* A message the fast path read is parsed only when asked for: the block's first half is
     * the message as it came. */
    if (!m->root && m->text)
        m->root = json_loadb(m->text, m->text_len, JSON_REJECT_DUPLICATES, NULL);
    return m->root;
}

void proto_msg_release(struct msg *m)
{
    json_decref(m->root);
    free(m->text);
    memset(m, 0, sizeof(*m));
}

void proto_set_number(json_t *o, const char *key, double v)
{
    if (o && isfinite(v))
        json_object_set_new(o, key, json_real(v));
}

bool proto_progress_in_range(double v, enum proto_progress_range r)
{
    if (!isfinite(v))
        return false;
    return r == PROGRESS_ANY || (r == PROGRESS_NONNEG && v >= 0) || (r == PROGRESS_POS && v > 0);
}

void proto_progress_init(struct proto_progress *p)
{
    memset(p, 0, sizeof(*p));
    for (size_t i = 0; i < N_PROGRESS_FIELDS; i++)
        if (progress_fields[i].kind == 'F')
            *(double *)((char *)p + progress_fields[i].off) = NAN;
}

int proto_progress_pack(json_t *o, const struct proto_progress *p)
{
    for (size_t i = 0; i < N_PROGRESS_FIELDS; i++) {
        const struct field *f = &progress_fields[i];
        const void *x = (const char *)p + f->off;
        json_t *v;

        if (f->kind == 'F' && !isfinite(*(const double *)x))
            continue; /* unknown: left out, not 0 */
        v = f->kind == 'F' ? json_real(*(const double *)x) : json_integer(*(const json_int_t *)x);
        if (!v || json_object_set_new(o, f->key, v) < 0)
            return -ENOMEM;
    }
    return 0;
}

void proto_ok_text(struct jtext *t, json_int_t id)
{
    jtext_lit(t, "{\"type\":\"ok\",\"id\":");
    jtext_int(t, id);
    jtext_lit(t, "}");
}

void proto_assign_text(struct jtext *t, const struct proto_assign *a)
{
    jtext_lit(t, "{\"type\":\"assign\",\"generation\":");
    jtext_int(t, a->generation);
    jtext_key(t, "world_size", false);
    jtext_int(t, a->world_size);
    jtext_key(t, "rank_base", false);
    jtext_int(t, a->rank_base);
    jtext_key(t, "nnodes", false);
    jtext_int(t, a->nnodes);
    jtext_key(t, "master_addr", false);
    jtext_str(t, a->master_addr, strlen(a->master_addr));
    jtext_key(t, "master_port", false);
    jtext_int(t, a->master_port);
    jtext_key(t, "hvd_port", false);
    jtext_int(t, a->hvd_port);
    jtext_key(t, "hvd_host", false);
    jtext_str(t, a->hvd_host, strlen(a->hvd_host));
    jtext_key(t, "spare", false);
    jtext_bool(t, a->spare);
    jtext_key(t, "mem_addr", false);
    jtext_str(t, a->mem_addr, strlen(a->mem_addr));
    jtext_key(t, "mem_port", false);
    jtext_int(t, a->mem_port);
    jtext_key(t, "mem_node", false);
    jtext_int(t, a->mem_node);
    jtext_lit(t, "}");
}

void proto_kv_val_text(struct jtext *t, json_int_t id, const char *value)
{
    jtext_lit(t, "{\"type\":\"kv_val\",\"id\":");
    jtext_int(t, id);
    jtext_lit(t, ",\"value\":");
    jtext_str(t, value, strlen(value));
    jtext_lit(t, "}");
}

void proto_progress_text(struct jtext *t, const struct proto_progress *p)
{
    for (size_t i = 0; i < N_PROGRESS_FIELDS; i++) {
        const struct field *f = &progress_fields[i];
        const void *x = (const char *)p + f->off;

        if (f->kind == 'F' && !isfinite(*(const double *)x))
            continue;
        jtext_key(t, f->key, false);
        if (f->kind == 'F')
            jtext_real(t, *(const double *)x);
        else
            jtext_int(t, (long long)*(const json_int_t *)x);
    }
}

int proto_progress_unpack(const json_t *o, bool required_step, struct proto_progress *p,
                          struct errmsg *err)
{
    proto_progress_init(p);
    if (!json_is_object(o))
        return errmsg_set(err, -EBADMSG, "a progress record must be an object");
    for (size_t i = 0; i < N_PROGRESS_FIELDS; i++) {
        const struct field *f = &progress_fields[i];
        json_t *v = json_object_get(o, f->key);
        void *x = (char *)p + f->off;

        if (!v && !f->optional && required_step)
            return errmsg_set(err, -EBADMSG, "'%s' missing", f->key);
        if (!v)
            continue;
        if (f->kind == 'I') {
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                return errmsg_set(err, -EBADMSG, "'%s' must be an integer, not negative", f->key);
            *(json_int_t *)x = json_integer_value(v);
        } else {
            if (!json_is_number(v))
                return errmsg_set(err, -EBADMSG, "'%s' must be a number", f->key);
            *(double *)x = json_number_value(v);
        }
    }
    return 0;
}

json_t *proto_pack(const char *fmt, ...)
{
    struct proto_error err;
    json_error_t je;
    struct msg m;
    json_t *root;
    va_list ap;

    va_start(ap, fmt);
    root = json_vpack_ex(&je, 0, fmt, ap);
    va_end(ap);
    if (!root)
        return NULL;
    if (decode_root(root, &m, &err) < 0) {
        json_decref(root);
        return NULL;
    }
    return root;
}
