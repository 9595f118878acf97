/* Message decoding and validation: one table row per message type, each with the
 * json_unpack_ex(JSON_STRICT) format that is its contract. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"
#include "banned.h"

typedef int (*unpack_fn)(json_t *root, struct msg *m, const char *fmt, json_error_t *je);

struct proto_row {
    const char *name;
    const char *fmt;
    unpack_fn unpack;
};

#define UNPACK(root, je, fmt, ...) json_unpack_ex((root), (je), JSON_STRICT, (fmt), __VA_ARGS__)

static int un_hello(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "rank", &m->rank, "token", &m->value);
}

static int un_join(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "node_rank", &m->node_rank, "hostname",
                  &m->hostname, "addr", &m->addr, "nprocs", &m->nprocs, "gpus", &m->gpus);
}

static int un_assign(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "generation", &m->generation, "world_size",
                  &m->world_size, "rank_base", &m->rank_base, "nnodes", &m->nnodes, "master_addr",
                  &m->master_addr, "master_port", &m->master_port, "hvd_port", &m->hvd_port,
                  "hvd_host", &m->hvd_host);
}

static int un_type_only(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    (void)m;
    return UNPACK(r, je, f, "type", &(const char *){0});
}

static int un_kv_put(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "key", &m->key, "value",
                  &m->value);
}

static int un_kv_get(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "key", &m->key, "timeout_ms",
                  &m->timeout_ms);
}

static int un_id_key(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "key", &m->key);
}

static int un_barrier(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "name", &m->key, "count",
                  &m->count);
}

static int un_barrier_done(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "name", &m->key);
}

static int un_report(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "step", &m->step, "loss", &m->loss, "lr",
                  &m->lr, "tokens_per_s", &m->tokens_per_s, "grad_norm", &m->grad_norm,
                  "total_steps", &m->total_steps);
}

static int un_progress(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "ranks", &m->array);
}

static int un_id(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id);
}

static int un_rank_exit(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "rank", &m->rank, "code", &m->code,
                  "signal", &m->signal, "oom", &m->oom, "killed", &m->killed, "tail", &m->value,
                  "stack", &m->stack, "error", &m->error);
}

static int un_abort(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "cause", &m->value, "status", &m->status,
                  "stacks", &m->stacks);
}

static int un_signal(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "signal", &m->signal);
}

static int un_finish(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "status", &m->status);
}

static int un_status_reply(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "job", &m->array);
}

static int un_kv_val(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "value", &m->value);
}

static int un_error(json_t *r, struct msg *m, const char *f, json_error_t *je)
{
    return UNPACK(r, je, f, "type", &(const char *){0}, "id", &m->id, "code", &m->key, "msg",
                  &m->value);
}

/* Indexed by enum msg_type. "s?i" marks the fields that only some senders fill. */
static const struct proto_row rows[MSG_TYPE_COUNT] = {
    [MSG_HELLO] = {"hello", "{s:s, s:i, s:s}", un_hello},
    [MSG_JOIN] = {"join", "{s:s, s:i, s:s, s:s, s:i, s:s}", un_join},
    [MSG_ASSIGN] = {"assign", "{s:s, s:i, s:i, s:i, s:i, s:s, s:i, s?i, s?s}", un_assign},
    [MSG_HB] = {"hb", "{s:s}", un_type_only},
    [MSG_KV_PUT] = {"kv_put", "{s:s, s:I, s:s, s:s}", un_kv_put},
    [MSG_KV_GET] = {"kv_get", "{s:s, s:I, s:s, s:I}", un_kv_get},
    [MSG_KV_DEL] = {"kv_del", "{s:s, s:I, s:s}", un_id_key},
    [MSG_BARRIER] = {"barrier", "{s:s, s:I, s:s, s?i}", un_barrier},
    [MSG_BARRIER_DONE] = {"barrier_done", "{s:s, s:s}", un_barrier_done},
    [MSG_REPORT] = {"report", "{s:s, s:I, s:F, s:F, s:F, s:F, s?I}", un_report},
    [MSG_PROGRESS] = {"progress", "{s:s, s:o}", un_progress},
    [MSG_PREEMPT] = {"preempt", "{s:s, s:I}", un_id},
    [MSG_SIGNAL] = {"signal", "{s:s, s?I, s:i}", un_signal},
    [MSG_FINALIZE] = {"finalize", "{s:s, s:I}", un_id},
    [MSG_RANK_EXIT] = {"rank_exit", "{s:s, s:i, s:i, s:i, s:b, s:b, s:s, s?s, s?o}", un_rank_exit},
    [MSG_ABORT] = {"abort", "{s:s, s:s, s?i, s?b}", un_abort},
    [MSG_FINISH] = {"finish", "{s:s, s:i}", un_finish},
    [MSG_STATUS] = {"status", "{s:s, s:I}", un_id},
    [MSG_STATUS_REPLY] = {"status_reply", "{s:s, s:I, s:o}", un_status_reply},
    [MSG_OK] = {"ok", "{s:s, s:I}", un_id},
    [MSG_KV_VAL] = {"kv_val", "{s:s, s:I, s:s}", un_kv_val},
    [MSG_ERROR] = {"error", "{s:s, s:I, s:s, s:s}", un_error},
};

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

    if (m->key && strlen(m->key) > PROTO_KEY_MAX) {
        snprintf(err->text, sizeof(err->text), "'%s': key longer than %d bytes", what,
                 PROTO_KEY_MAX);
        return -EBADMSG;
    }
    if (m->value && strlen(m->value) > PROTO_VALUE_MAX) {
        snprintf(err->text, sizeof(err->text), "'%s': value longer than %d bytes", what,
                 PROTO_VALUE_MAX);
        return -EBADMSG;
    }
    /* Exit statuses are 0..255 (256 would read as success) and signals below 128, so that
     * 128 + signal is one too. */
    if (m->node_rank < 0 || m->nprocs < 0 || m->rank < 0 || m->count < 0 || m->world_size < 0 ||
        m->rank_base < 0 || m->nnodes < 0 || m->generation < 0 || m->master_port < 0 ||
        m->master_port > 65535 || m->hvd_port < 0 || m->hvd_port > 65535 || m->status < 0 ||
        m->status > 255 || m->code < 0 || m->code > 255 || m->signal < 0 || m->signal > 127) {
        snprintf(err->text, sizeof(err->text), "'%s': negative or out-of-range number", what);
        return -EBADMSG;
    }
    if (m->hvd_host && strlen(m->hvd_host) > PROTO_NAME_MAX) {
        snprintf(err->text, sizeof(err->text), "'%s': hvd_host longer than %d bytes", what,
                 PROTO_NAME_MAX);
        return -EBADMSG;
    }
    if (m->stack && strlen(m->stack) > PROTO_STACK_MAX) {
        snprintf(err->text, sizeof(err->text), "'%s': stack longer than %d bytes", what,
                 PROTO_STACK_MAX);
        return -EBADMSG;
    }
    if (m->error && !json_is_object(m->error)) {
        snprintf(err->text, sizeof(err->text), "'%s': 'error' must be an object", what);
        return -EBADMSG;
    }
    if (m->total_steps < 0 || (m->type == MSG_SIGNAL && m->signal == 0)) {
        snprintf(err->text, sizeof(err->text), "'%s': negative or out-of-range number", what);
        return -EBADMSG;
    }
    if (m->type == MSG_PROGRESS && !json_is_array(m->array)) {
        snprintf(err->text, sizeof(err->text), "'%s': 'ranks' must be an array", what);
        return -EBADMSG;
    }
    if (m->type == MSG_STATUS_REPLY && !json_is_object(m->array)) {
        snprintf(err->text, sizeof(err->text), "'status_reply': 'job' must be an object");
        return -EBADMSG;
    }
    return 0;
}

/* json_unpack's "i" keeps the low bits of a number an int cannot hold (4294967297 reads as
 * 1), so every integer field but the 64-bit ones (id, timeout_ms, step, total_steps) is checked
 * against int's range before the row's format reads it. */
static int check_int_range(json_t *root, const char *what, struct proto_error *err)
{
    const char *name;
    json_t *v;

    json_object_foreach(root, name, v)
    {
        json_int_t x;

        if (!json_is_integer(v) || !strcmp(name, "id") || !strcmp(name, "timeout_ms") ||
            !strcmp(name, "step") || !strcmp(name, "total_steps"))
            continue;
        x = json_integer_value(v);
        if (x < INT_MIN || x > INT_MAX) {
            snprintf(err->text, sizeof(err->text), "'%s': '%.64s' out of range", what, name);
            return -EBADMSG;
        }
    }
    return 0;
}

static int decode_root(json_t *root, struct msg *m, struct proto_error *err)
{
    json_error_t je;
    json_t *jt;
    int t;

    if (!json_is_object(root)) {
        snprintf(err->text, sizeof(err->text), "message is not a JSON object");
        return -EBADMSG;
    }
    jt = json_object_get(root, "type");
    if (!json_is_string(jt)) {
        snprintf(err->text, sizeof(err->text), "message has no string 'type'");
        return -EBADMSG;
    }
    t = find_type(json_string_value(jt));
    if (t < 0) {
        snprintf(err->text, sizeof(err->text), "unknown message type '%.64s'",
                 json_string_value(jt));
        return -EBADMSG;
    }
    if (check_int_range(root, rows[t].name, err) < 0)
        return -EBADMSG;
    memset(m, 0, sizeof(*m));
    m->type = (enum msg_type)t;
    if (rows[t].unpack(root, m, rows[t].fmt, &je) < 0) {
        snprintf(err->text, sizeof(err->text), "'%s': %s", rows[t].name, je.text);
        return -EBADMSG;
    }
    return check_limits(m, err);
}

int proto_decode(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err)
{
    json_error_t je;
    json_t *root;
    int ret;

    memset(m, 0, sizeof(*m));
    err->id = 0;
    root = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err->text, sizeof(err->text), "not JSON at byte %d: %s", je.position, je.text);
        return -EBADMSG;
    }
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

void proto_msg_release(struct msg *m)
{
    json_decref(m->root);
    memset(m, 0, sizeof(*m));
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
