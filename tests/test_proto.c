/* Tests of lib/proto: one valid example of every message type, and each example broken in
 * every way the decoder must notice (a field missing, an extra field, a field of the wrong
 * type or out of range, a key over the limit), plus payloads that are not JSON objects or
 * name no known type, and proto_pack's refusals. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "proto.h"
#include "jtext.h"
#include "test.h"
#include "banned.h"

struct example {
    enum msg_type type;
    const char *json;
    const char *optional; /* the fields the sender may leave out, blank-separated, or NULL */
};

/* One row per message type, in enum order. */
static const struct example examples[] = {
    {MSG_HELLO, "{\"type\":\"hello\",\"rank\":3,\"token\":\"00ff\"}", NULL},
    {MSG_JOIN,
     "{\"type\":\"join\",\"node_rank\":1,\"hostname\":\"n1\",\"addr\":\"10.0.0.2\",\"nprocs\":4,"
     "\"gpus\":\"0,1,2,3\"}",
     NULL},
    {MSG_ASSIGN,
     "{\"type\":\"assign\",\"generation\":2,\"world_size\":8,\"rank_base\":4,\"nnodes\":2,"
     "\"master_addr\":\"10.0.0.1\",\"master_port\":29500,\"hvd_port\":41000,"
     "\"hvd_host\":\"n1\",\"mem_addr\":\"10.0.0.3\",\"mem_port\":41001,\"mem_node\":2}",
     "hvd_port hvd_host mem_addr mem_port mem_node"},
    {MSG_HB, "{\"type\":\"hb\"}", NULL},
    {MSG_KV_PUT, "{\"type\":\"kv_put\",\"id\":11,\"key\":\"nccl/id\",\"value\":\"dmFs\"}", NULL},
    {MSG_KV_GET, "{\"type\":\"kv_get\",\"id\":12,\"key\":\"nccl/id\",\"timeout_ms\":5000}", NULL},
    {MSG_KV_DEL, "{\"type\":\"kv_del\",\"id\":13,\"key\":\"nccl/id\"}", NULL},
    {MSG_BARRIER, "{\"type\":\"barrier\",\"id\":14,\"name\":\"start\",\"count\":4}", "count"},
    {MSG_BARRIER_DONE, "{\"type\":\"barrier_done\",\"name\":\"start\"}", NULL},
    {MSG_REPORT,
     "{\"type\":\"report\",\"step\":100,\"loss\":2.5,\"lr\":0.001,\"tokens_per_s\":12000.5,"
     "\"grad_norm\":1.25,\"total_steps\":5000000000}",
     "loss lr tokens_per_s grad_norm total_steps"},
    {MSG_PROGRESS, "{\"type\":\"progress\",\"ranks\":[{\"rank\":0,\"step\":100}]}", NULL},
    {MSG_PREEMPT, "{\"type\":\"preempt\",\"id\":20}", NULL},
    {MSG_SIGNAL, "{\"type\":\"signal\",\"id\":21,\"signal\":10}", "id"},
    {MSG_FINALIZE, "{\"type\":\"finalize\",\"id\":15}", NULL},
    {MSG_RANK_EXIT,
     "{\"type\":\"rank_exit\",\"rank\":5,\"code\":7,\"signal\":0,\"oom\":true,\"killed\":false,"
     "\"tail\":\"Traceback\",\"stack\":\"Thread 0x1\",\"error\":{\"type\":\"ValueError\"}}",
     "stack error"},
    {MSG_ABORT, "{\"type\":\"abort\",\"cause\":\"rank 5 hung\",\"status\":124,\"stacks\":true}",
     "status stacks"},
    {MSG_FINISH, "{\"type\":\"finish\",\"status\":7}", NULL},
    {MSG_STATUS, "{\"type\":\"status\",\"id\":16}", NULL},
    {MSG_STATUS_REPLY, "{\"type\":\"status_reply\",\"id\":16,\"job\":{\"job_id\":\"j1\"}}", NULL},
    {MSG_OK, "{\"type\":\"ok\",\"id\":17}", NULL},
    {MSG_KV_VAL, "{\"type\":\"kv_val\",\"id\":18,\"value\":\"dmFs\"}", NULL},
    {MSG_ERROR, "{\"type\":\"error\",\"id\":19,\"code\":\"timeout\",\"msg\":\"no key 'k'\"}", NULL},
    {MSG_PROBE, "{\"type\":\"probe\",\"seq\":3}", NULL},
    {MSG_MEM_SAVE, "{\"type\":\"mem_save\",\"id\":22,\"name\":\"state\",\"step\":5000000000}",
     NULL},
    {MSG_MEM_LOAD, "{\"type\":\"mem_load\",\"id\":23,\"name\":\"state\"}", NULL},
    {MSG_MEM_COPY,
     "{\"type\":\"mem_copy\",\"id\":23,\"path\":\"/dev/shm/x/r0.state\",\"step\":7,"
     "\"size\":6000000000}",
     NULL},
    {MSG_MEM_PUT,
     "{\"type\":\"mem_put\",\"id\":24,\"rank\":3,\"name\":\"state\",\"step\":7,"
     "\"size\":6000000000}",
     NULL},
    {MSG_MEM_GET, "{\"type\":\"mem_get\",\"id\":25,\"rank\":3,\"name\":\"state\"}", NULL},
    {MSG_REGROUP_OK, "{\"type\":\"regroup_ok\",\"id\":26}", NULL},
    {MSG_REGROUP,
     "{\"type\":\"regroup\",\"id\":27,\"generation\":2,\"mem_addr\":\"10.0.0.3\","
     "\"mem_port\":40123,\"mem_node\":2}",
     "id mem_addr mem_port mem_node"},
};
#define N_EXAMPLES (sizeof(examples) / sizeof(examples[0]))

/* Fields that carry 64-bit integers; every other integer field is a C int. */
static const char *const wide_fields[] = {"id", "timeout_ms", "step", "total_steps", "size"};

/* Whether field is one of e's optional fields. */
static bool is_optional(const struct example *e, const char *field)
{
    size_t n = strlen(field);

    for (const char *p = e->optional; p && *p; p += strcspn(p, " "), p += *p == ' ') {
        if (strcspn(p, " ") == n && !strncmp(p, field, n))
            return true;
    }
    return false;
}

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root)
        test_fail(__FILE__, __LINE__, "bad example '%s': %s", text, je.text);
    return root;
}

/* Decodes root's text; returns proto_decode's result, the message released. */
static int decode_json(json_t *root, struct proto_error *err)
{
    char *text = json_dumps(root, JSON_COMPACT);
    struct msg m;
    int rc;

    CHECK(text);
    memset(err, 0, sizeof(*err));
    rc = proto_decode((const uint8_t *)text, strlen(text), &m, err);
    if (rc == 0) {
        CHECK(proto_msg_json(&m));
        proto_msg_release(&m);
    } else {
        CHECK(m.root == NULL && m.text == NULL);
        CHECK(err->why.text[0] != '\0');
    }
    free(text);
    return rc;
}

static int decode_text(const char *text, struct proto_error *err)
{
    struct msg m;
    int rc;

    memset(err, 0, sizeof(*err));
    rc = proto_decode((const uint8_t *)text, strlen(text), &m, err);
    if (rc == 0)
        proto_msg_release(&m);
    return rc;
}

/* Expects root (a variant of example e made by what) to be refused, naming the type. */
static void expect_refused(const struct example *e, json_t *root, const char *what)
{
    struct proto_error err;
    char *text = json_dumps(root, JSON_COMPACT);
    int rc = decode_json(root, &err);

    if (rc != -EBADMSG)
        test_fail(__FILE__, __LINE__, "'%s' with %s: decode returned %d, not -EBADMSG: %s",
                  proto_type_name(e->type), what, rc, text);
    free(text);
}

static void expect_accepted(const struct example *e, json_t *root, const char *what)
{
    struct proto_error err;
    char *text = json_dumps(root, JSON_COMPACT);
    int rc = decode_json(root, &err);

    if (rc != 0)
        test_fail(__FILE__, __LINE__, "'%s' with %s: refused (%s): %s", proto_type_name(e->type),
                  what, err.why.text, text);
    free(text);
}

TEST(proto_examples_cover_every_type)
{
    CHECK_EQ(N_EXAMPLES, MSG_TYPE_COUNT);
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        json_t *root = parse(examples[i].json);
        CHECK_EQ(examples[i].type, i);
        CHECK_STR(json_string_value(json_object_get(root, "type")),
                  proto_type_name(examples[i].type));
        json_decref(root);
    }
    CHECK_STR(proto_type_name(MSG_TYPE_COUNT), "?");
    CHECK_STR(proto_type_name((enum msg_type) - 1), "?");
}

/* Every example decodes, to the type and field values it holds. */
TEST(proto_valid_messages_decode)
{
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        const struct example *e = &examples[i];
        struct proto_error err = {{{0}}};
        struct msg m;
        int rc = proto_decode((const uint8_t *)e->json, strlen(e->json), &m, &err);

        if (rc != 0)
            test_fail(__FILE__, __LINE__, "'%s' refused: %s", proto_type_name(e->type),
                      err.why.text);
        CHECK_EQ(m.type, e->type);
        switch (e->type) {
        case MSG_HELLO:
            CHECK_EQ(m.rank, 3);
            CHECK_STR(m.value, "00ff");
            break;
        case MSG_JOIN:
            CHECK_EQ(m.node_rank, 1);
            CHECK_STR(m.hostname, "n1");
            CHECK_STR(m.addr, "10.0.0.2");
            CHECK_EQ(m.nprocs, 4);
            CHECK_STR(m.gpus, "0,1,2,3");
            break;
        case MSG_ASSIGN:
            CHECK_EQ(m.generation, 2);
            CHECK_EQ(m.world_size, 8);
            CHECK_EQ(m.rank_base, 4);
            CHECK_EQ(m.nnodes, 2);
            CHECK_STR(m.master_addr, "10.0.0.1");
            CHECK_EQ(m.master_port, 29500);
            break;
        case MSG_KV_PUT:
            CHECK_EQ(m.id, 11);
            CHECK_STR(m.key, "nccl/id");
            CHECK_STR(m.value, "dmFs");
            break;
        case MSG_KV_GET:
            CHECK_EQ(m.id, 12);
            CHECK_STR(m.key, "nccl/id");
            CHECK_EQ(m.timeout_ms, 5000);
            break;
        case MSG_KV_DEL:
            CHECK_EQ(m.id, 13);
            CHECK_STR(m.key, "nccl/id");
            break;
        case MSG_BARRIER:
            CHECK_EQ(m.id, 14);
            CHECK_STR(m.key, "start");
            CHECK_EQ(m.count, 4);
            break;
        case MSG_BARRIER_DONE:
            CHECK_STR(m.key, "start");
            break;
        case MSG_REPORT:
            CHECK_EQ(m.progress.step, 100);
            CHECK(m.progress.loss == 2.5 && m.progress.lr == 0.001 &&
                  m.progress.tokens_per_s == 12000.5 && m.progress.grad_norm == 1.25);
            break;
        case MSG_PROGRESS:
            CHECK(json_is_array(m.array));
            break;
        case MSG_FINALIZE:
            CHECK_EQ(m.id, 15);
            break;
        case MSG_RANK_EXIT:
            CHECK_EQ(m.rank, 5);
            CHECK_EQ(m.code, 7);
            CHECK_EQ(m.signal, 0);
            CHECK_EQ(m.oom, 1);
            CHECK_EQ(m.killed, 0);
            CHECK_STR(m.value, "Traceback");
            break;
        case MSG_ABORT:
            CHECK_STR(m.value, "rank 5 hung");
            CHECK_EQ(m.status, 124);
            break;
        case MSG_FINISH:
            CHECK_EQ(m.status, 7);
            break;
        case MSG_STATUS:
            CHECK_EQ(m.id, 16);
            break;
        case MSG_STATUS_REPLY:
            CHECK_EQ(m.id, 16);
            CHECK(json_is_object(m.array));
            CHECK_STR(json_string_value(json_object_get(m.array, "job_id")), "j1");
            break;
        case MSG_OK:
            CHECK_EQ(m.id, 17);
            break;
        case MSG_KV_VAL:
            CHECK_EQ(m.id, 18);
            CHECK_STR(m.value, "dmFs");
            break;
        case MSG_ERROR:
            CHECK_EQ(m.id, 19);
            CHECK_STR(m.key, "timeout");
            CHECK_STR(m.value, "no key 'k'");
            break;
        case MSG_PROBE:
            CHECK_EQ(m.count, 3);
            CHECK_EQ(m.tail_len, 0);
            break;
        case MSG_MEM_SAVE:
            CHECK_EQ(m.id, 22);
            CHECK_STR(m.key, "state");
            CHECK_EQ(m.step, 5000000000);
            break;
        case MSG_MEM_LOAD:
            CHECK_STR(m.key, "state");
            break;
        case MSG_MEM_COPY:
            CHECK_STR(m.value, "/dev/shm/x/r0.state");
            CHECK_EQ(m.step, 7);
            CHECK_EQ(m.size, 6000000000);
            break;
        default:
            break;
        }
        proto_msg_release(&m);
        CHECK(m.root == NULL);
    }
}

TEST(proto_missing_field_refused)
{
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        const struct example *e = &examples[i];
        json_t *root = parse(e->json);
        const char *field;
        json_t *v;

        json_object_foreach(root, field, v)
        {
            json_t *copy = json_deep_copy(root);
            char what[64];
            CHECK(copy);
            json_object_del(copy, field);
            snprintf(what, sizeof(what), "'%s' missing", field);
            if (is_optional(e, field))
                expect_accepted(e, copy, what);
            else
                expect_refused(e, copy, what);
            json_decref(copy);
        }
        json_decref(root);
    }
}

TEST(proto_extra_field_refused)
{
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        json_t *root = parse(examples[i].json);
        json_object_set_new(root, "extra", json_integer(1));
        expect_refused(&examples[i], root, "an extra field");
        json_decref(root);
    }
}

/* Each field in turn holds a value of another JSON type: a string for a number, an object or
 * a boolean, a number for a string, a real for an integer, a number for a boolean. */
TEST(proto_wrong_type_refused)
{
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        const struct example *e = &examples[i];
        json_t *root = parse(e->json);
        const char *field;
        json_t *v;

        json_object_foreach(root, field, v)
        {
            json_t *wrong[3] = {NULL, NULL, NULL};
            char what[64];

            if (json_is_string(v)) {
                wrong[0] = json_integer(5);
                wrong[1] = json_null();
                wrong[2] = json_pack("[s]", json_string_value(v));
            } else if (json_is_integer(v)) {
                wrong[0] = json_string("5");
                wrong[1] = json_real(1.5);
                wrong[2] = json_null();
            } else if (json_is_real(v)) {
                wrong[0] = json_string("1.5");
                wrong[1] = json_true();
            } else if (json_is_boolean(v)) {
                wrong[0] = json_integer(1);
                wrong[1] = json_string("true");
            } else {
                wrong[0] = json_string("x");
                wrong[1] = json_integer(1);
            }
            for (int w = 0; w < 3; w++) {
                json_t *copy;
                if (!wrong[w])
                    continue;
                copy = json_deep_copy(root);
                CHECK(copy);
                json_object_set(copy, field, wrong[w]);
                snprintf(what, sizeof(what), "'%s' of the wrong type", field);
                expect_refused(e, copy, what);
                json_decref(copy);
                json_decref(wrong[w]);
            }
        }
        json_decref(root);
    }
}

/* Integer fields that hold a C int refuse what an int cannot hold, rather than keep its low
 * 32 bits; counts, ranks and ports refuse negative numbers. */
TEST(proto_integer_out_of_range_refused)
{
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        const struct example *e = &examples[i];
        json_t *root = parse(e->json);
        const char *field;
        json_t *v;

        json_object_foreach(root, field, v)
        {
            bool wide = false;
            json_t *copy;
            char what[64];

            if (!json_is_integer(v))
                continue;
            for (size_t w = 0; w < sizeof(wide_fields) / sizeof(wide_fields[0]); w++)
                wide |= !strcmp(field, wide_fields[w]);
            copy = json_deep_copy(root);
            json_object_set_new(copy, field, json_integer(((json_int_t)1 << 32) + 1));
            snprintf(what, sizeof(what), "'%s' = 2^32 + 1", field);
            if (wide)
                expect_accepted(e, copy, what);
            else
                expect_refused(e, copy, what);
            json_decref(copy);
        }
        json_decref(root);
    }
}

TEST(proto_negative_counts_refused)
{
    static const char *const bad[] = {
        "{\"type\":\"hello\",\"rank\":-1,\"token\":\"00\"}",
        "{\"type\":\"join\",\"node_rank\":-1,\"hostname\":\"h\",\"addr\":\"a\",\"nprocs\":1,"
        "\"gpus\":\"\"}",
        "{\"type\":\"join\",\"node_rank\":0,\"hostname\":\"h\",\"addr\":\"a\",\"nprocs\":-4,"
        "\"gpus\":\"\"}",
        "{\"type\":\"assign\",\"generation\":0,\"world_size\":8,\"rank_base\":0,\"nnodes\":2,"
        "\"master_addr\":\"a\",\"master_port\":65536}",
        "{\"type\":\"assign\",\"generation\":0,\"world_size\":-8,\"rank_base\":0,\"nnodes\":2,"
        "\"master_addr\":\"a\",\"master_port\":1}",
        "{\"type\":\"assign\",\"generation\":0,\"world_size\":8,\"rank_base\":0,\"nnodes\":2,"
        "\"master_addr\":\"a\",\"master_port\":1,\"hvd_port\":65536}",
        "{\"type\":\"assign\",\"generation\":0,\"world_size\":8,\"rank_base\":0,\"nnodes\":2,"
        "\"master_addr\":\"a\",\"master_port\":1,\"hvd_port\":-1}",
        "{\"type\":\"barrier\",\"id\":1,\"name\":\"b\",\"count\":-1}",
        "{\"type\":\"report\",\"step\":1,\"loss\":1.0,\"lr\":0.0,\"tokens_per_s\":0.0,"
        "\"grad_norm\":0.0,\"total_steps\":-1}",
        "{\"type\":\"signal\",\"signal\":0}",
        "{\"type\":\"signal\",\"signal\":128}",
    };
    struct proto_error err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (decode_text(bad[i], &err) != -EBADMSG)
            test_fail(__FILE__, __LINE__, "accepted: %s", bad[i]);
    CHECK_EQ(decode_text("{\"type\":\"assign\",\"generation\":0,\"world_size\":8,\"rank_base\":0,"
                         "\"nnodes\":2,\"master_addr\":\"a\",\"master_port\":65535}",
                         &err),
             0);
}

/* Every field that carries a store key or a barrier name: PROTO_KEY_MAX bytes pass, one more
 * is refused. */
TEST(proto_key_over_limit_refused)
{
    char *key = malloc(PROTO_KEY_MAX + 2);
    int n_keyed = 0;

    CHECK(key);
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        const struct example *e = &examples[i];
        json_t *root = parse(e->json);
        const char *field = json_object_get(root, "key") ? "key" : "name";

        if (!json_object_get(root, field)) {
            json_decref(root);
            continue;
        }
        n_keyed++;
        memset(key, 'k', PROTO_KEY_MAX);
        key[PROTO_KEY_MAX] = '\0';
        json_object_set_new(root, field, json_string(key));
        expect_accepted(e, root, "a key of PROTO_KEY_MAX bytes");
        key[PROTO_KEY_MAX] = 'k';
        key[PROTO_KEY_MAX + 1] = '\0';
        json_object_set_new(root, field, json_string(key));
        expect_refused(e, root, "a key over PROTO_KEY_MAX");
        json_decref(root);
    }
    /* kv_put, kv_get, kv_del, barrier, barrier_done, mem_save, mem_load, mem_put, mem_get. */
    CHECK_EQ(n_keyed, 9);
    free(key);
}

TEST(proto_value_over_limit_refused)
{
    char *value = malloc(PROTO_VALUE_MAX + 2);
    json_t *root;

    CHECK(value);
    memset(value, 'v', PROTO_VALUE_MAX);
    value[PROTO_VALUE_MAX] = '\0';
    root = parse(examples[MSG_KV_PUT].json);
    json_object_set_new(root, "value", json_string(value));
    expect_accepted(&examples[MSG_KV_PUT], root, "a value of PROTO_VALUE_MAX bytes");
    value[PROTO_VALUE_MAX] = 'v';
    value[PROTO_VALUE_MAX + 1] = '\0';
    json_object_set_new(root, "value", json_string(value));
    expect_refused(&examples[MSG_KV_PUT], root, "a value over PROTO_VALUE_MAX");
    json_decref(root);
    free(value);
}

TEST(proto_not_json_refused)
{
    static const char *const bad[] = {
        "",         "{", "nul", "{\"type\":\"hb\"", "{\"type\":\"hb\"} trailing", "{type:\"hb\"}",
        "\xff\xfe",
    };
    struct proto_error err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ(decode_text(bad[i], &err), -EBADMSG);
        CHECK_CONTAINS(err.why.text, "not JSON");
    }
    /* A NUL inside the payload ends nothing: the length says where the payload ends. */
    CHECK_EQ(proto_decode((const uint8_t *)"{\"type\":\"hb\"}\0x", 15, &(struct msg){0}, &err),
             -EBADMSG);
    CHECK_EQ(decode_text("{\"type\":\"hello\",\"rank\":1,\"token\":\"a\\u0000b\"}", &err),
             -EBADMSG);
}

/* A probe's pad follows its message after a NUL byte, and is counted, not read: any bytes (a
 * NUL, invalid UTF-8) or none. Every other message with bytes after it is refused. */
TEST(proto_probe_tail)
{
    static const char probe[] = "{\"type\":\"probe\",\"seq\":1}\0pa\0\xff";
    static const char put[] = "{\"type\":\"kv_put\",\"id\":9,\"key\":\"k\",\"value\":\"v\"}\0p";
    struct proto_error err;
    struct msg m;

    CHECK_EQ(proto_decode((const uint8_t *)probe, sizeof(probe) - 1, &m, &err), 0);
    CHECK_EQ(m.type, MSG_PROBE);
    CHECK_EQ(m.count, 1);
    CHECK_EQ(m.tail_len, 4);
    proto_msg_release(&m);
    CHECK_EQ(proto_decode((const uint8_t *)probe, 24, &m, &err), 0);
    CHECK_EQ(m.tail_len, 0);
    proto_msg_release(&m);
    CHECK_EQ(proto_decode((const uint8_t *)probe, 25, &m, &err), 0);
    CHECK_EQ(m.tail_len, 0);
    proto_msg_release(&m);
    CHECK_EQ(proto_decode((const uint8_t *)put, sizeof(put) - 1, &m, &err), -EBADMSG);
    CHECK(m.root == NULL && m.text == NULL);
    CHECK_EQ(err.id, 9);
    CHECK_CONTAINS(err.why.text, "a NUL byte at byte 46: only a probe");
    /* jansson alone would read past a NUL between tokens: both decoders end the message there
     * (the frame fuzzer's find). */
    CHECK_EQ(proto_decode_tree((const uint8_t *)"{\"type\":\"hb\"\0}", 15, &m, &err), -EBADMSG);
    CHECK_EQ(proto_decode((const uint8_t *)"{\"type\":\"hb\"\0}", 15, &m, &err), -EBADMSG);
    /* The message before the NUL is checked as any other. */
    CHECK_EQ(proto_decode((const uint8_t *)"{\"type\":\"probe\"}\0pad", 20, &m, &err), -EBADMSG);
    CHECK_CONTAINS(err.why.text, "seq");
}

TEST(proto_not_object_refused)
{
    static const char *const bad[] = {"[]", "[{\"type\":\"hb\"}]", "\"hb\"", "42", "null"};
    struct proto_error err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (decode_text(bad[i], &err) != -EBADMSG)
            test_fail(__FILE__, __LINE__, "accepted: %s", bad[i]);
    CHECK_EQ(decode_text("[1]", &err), -EBADMSG);
    CHECK_CONTAINS(err.why.text, "not a JSON object");
}

TEST(proto_unknown_or_missing_type_refused)
{
    struct proto_error err;

    CHECK_EQ(decode_text("{\"type\":\"launch_missiles\"}", &err), -EBADMSG);
    CHECK_CONTAINS(err.why.text, "unknown message type 'launch_missiles'");
    CHECK_EQ(decode_text("{\"type\":\"HB\"}", &err), -EBADMSG);
    CHECK_EQ(decode_text("{\"type\":\"\"}", &err), -EBADMSG);
    CHECK_EQ(decode_text("{\"id\":1}", &err), -EBADMSG);
    CHECK_CONTAINS(err.why.text, "'type'");
    CHECK_EQ(decode_text("{\"type\":3}", &err), -EBADMSG);
    CHECK_EQ(decode_text("{\"type\":null}", &err), -EBADMSG);
    CHECK_EQ(decode_text("{\"type\":\"hb\",\"type\":\"hb\"}", &err), -EBADMSG);
}

TEST(proto_error_text_names_type_and_field)
{
    struct proto_error err;

    CHECK_EQ(decode_text("{\"type\":\"join\",\"node_rank\":0,\"hostname\":\"h\",\"addr\":\"a\","
                         "\"nprocs\":\"four\",\"gpus\":\"\"}",
                         &err),
             -EBADMSG);
    CHECK_CONTAINS(err.why.text, "'join'");
    CHECK_EQ(decode_text("{\"type\":\"ok\",\"id\":1,\"surplus\":true}", &err), -EBADMSG);
    CHECK_CONTAINS(err.why.text, "'ok'");
    CHECK_CONTAINS(err.why.text, "surplus");
}

TEST(proto_decode_into_used_msg)
{
    struct proto_error err;
    struct msg m;

    CHECK_EQ(proto_decode((const uint8_t *)examples[MSG_ERROR].json,
                          strlen(examples[MSG_ERROR].json), &m, &err),
             0);
    proto_msg_release(&m);
    CHECK_EQ(proto_decode((const uint8_t *)examples[MSG_HB].json, strlen(examples[MSG_HB].json), &m,
                          &err),
             0);
    /* Nothing of the earlier message shows through. */
    CHECK(m.key == NULL && m.value == NULL && m.id == 0);
    proto_msg_release(&m);
    CHECK_EQ(decode_text("{", &err), -EBADMSG);
}

TEST(proto_pack_builds_valid_messages)
{
    json_t *m;
    char *text;

    m = proto_pack("{s:s, s:I, s:s, s:s}", "type", "kv_put", "id", (json_int_t)1, "key", "k",
                   "value", "v");
    CHECK(m);
    text = json_dumps(m, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_STR(text, "{\"id\":1,\"key\":\"k\",\"type\":\"kv_put\",\"value\":\"v\"}");
    free(text);
    json_decref(m);
    m = proto_pack("{s:s, s:I, s:s}", "type", "barrier", "id", (json_int_t)2, "name", "b");
    CHECK(m);
    json_decref(m);
    /* Every example, handed over as an object. */
    for (size_t i = 0; i < N_EXAMPLES; i++) {
        json_t *root = parse(examples[i].json);
        m = proto_pack("O", root);
        if (!m)
            test_fail(__FILE__, __LINE__, "proto_pack refused '%s'",
                      proto_type_name(examples[i].type));
        json_decref(m);
        json_decref(root);
    }
}

TEST(proto_pack_refuses_invalid_messages)
{
    char key[PROTO_KEY_MAX + 2];

    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    CHECK(!proto_pack("{s:s}", "type", "ok"));
    CHECK(!proto_pack("{s:s, s:I, s:i}", "type", "ok", "id", (json_int_t)1, "x", 2));
    CHECK(!proto_pack("{s:s, s:s}", "type", "ok", "id", "1"));
    CHECK(!proto_pack("{s:s, s:I, s:s}", "type", "kv_del", "id", (json_int_t)1, "key", key));
    CHECK(!proto_pack("{s:s}", "type", "no_such_type"));
    CHECK(!proto_pack("{s:i}", "id", 1));
    CHECK(!proto_pack("[i]", 1));
    CHECK(!proto_pack("{s:s", "type", "hb"));
    CHECK(!proto_pack("{s:s, s:i, s:s}", "type", "hello", "rank", -1, "token", "00"));
    CHECK(!proto_pack("{s:s, s:o}", "type", "progress", "ranks", json_string("x")));
    /* The ranks waiting on the others: an array, or nothing. */
    CHECK(!proto_pack("{s:s, s:o, s:o}", "type", "progress", "ranks", json_array(), "waiting",
                      json_integer(2)));
    json_t *ok =
        proto_pack("{s:s, s:o, s:[i]}", "type", "progress", "ranks", json_array(), "waiting", 2);
    CHECK(ok != NULL);
    json_decref(ok);
    /* The ranks active in the store: an array, or nothing. */
    CHECK(!proto_pack("{s:s, s:o, s:o}", "type", "progress", "ranks", json_array(), "active",
                      json_integer(2)));
    ok = proto_pack("{s:s, s:o, s:[{s:i, s:i}]}", "type", "progress", "ranks", json_array(),
                    "active", "rank", 2, "age_ms", 40);
    CHECK(ok != NULL);
    json_decref(ok);
    /* Where the ranks' memory checkpoints came from: an array, or nothing. */
    CHECK(!proto_pack("{s:s, s:o, s:o}", "type", "progress", "ranks", json_array(), "loaded",
                      json_string("node 0")));
    ok = proto_pack("{s:s, s:o, s:[{s:i, s:s, s:i}]}", "type", "progress", "ranks", json_array(),
                    "loaded", "rank", 1, "from", "node 0", "step", 11);
    CHECK(ok != NULL);
    json_decref(ok);
}

/* Decodes text both ways: proto_decode (the fast path first) and proto_decode_tree (jansson
 * alone). They must agree: both refuse, or both accept with the same fields. Returns whether
 * the fast path read it. */
static bool decode_both(const char *text)
{
    struct proto_error e1, e2;
    struct msg a, b;
    int r1 = proto_decode((const uint8_t *)text, strlen(text), &a, &e1);
    int r2 = proto_decode_tree((const uint8_t *)text, strlen(text), &b, &e2);
    bool fast = r1 == 0 && a.text != NULL;

    if (r1 != r2)
        test_fail(__FILE__, __LINE__, "%s: decode %d, tree %d (%s)", text, r1, r2,
                  r1 ? e1.why.text : e2.why.text);
    else if (r1 == 0 && !proto_msg_same(&a, &b))
        test_fail(__FILE__, __LINE__, "%s: the two paths read different fields", text);
    else if (r1 != 0 && strcmp(e1.why.text, e2.why.text))
        test_fail(__FILE__, __LINE__, "%s: different refusals '%s', '%s'", text, e1.why.text,
                  e2.why.text);
    if (r1 == 0) {
        /* What the fast path read parses on demand to the tree's message. */
        CHECK(json_equal(proto_msg_json(&a), b.root));
        proto_msg_release(&a);
        proto_msg_release(&b);
    }
    return fast;
}

/* The fast path reads the flat messages of the busy paths, and reads them as jansson does;
 * everything it does not take (spaces, escapes, reals, nesting, a duplicate key...) goes to
 * jansson, with the same result and the same refusal. */
TEST(proto_fast_path_matches_tree)
{
    static const char *const tricky[] = {
        "{\"type\":\"ok\",\"id\":1}",
        "{\"id\":1,\"type\":\"ok\"}",
        "{ \"type\":\"ok\",\"id\":1}",
        "{\"type\":\"ok\",\"id\":01}",
        "{\"type\":\"ok\",\"id\":-0}",
        "{\"type\":\"ok\",\"id\":1.0}",
        "{\"type\":\"ok\",\"id\":1e3}",
        "{\"type\":\"ok\",\"id\":9223372036854775807}",
        "{\"type\":\"ok\",\"id\":99999999999999999999}",
        "{\"type\":\"ok\",\"id\":123456789012345678}",
        "{\"type\":\"ok\",\"id\":1234567890123456789}",
        "{\"type\":\"ok\",\"id\":\"1\"}",
        "{\"type\":\"ok\",\"id\":true}",
        "{\"type\":\"ok\",\"id\":null}",
        "{\"type\":\"ok\"}",
        "{\"type\":\"ok\",\"id\":1,\"id\":2}",
        "{\"type\":\"ok\",\"type\":\"ok\",\"id\":1}",
        "{\"type\":\"ok\",\"id\":1,\"x\":1}",
        "{\"type\":\"ok\",\"id\":1,}",
        "{\"type\":\"ok\",\"id\":1",
        "{\"type\":\"ok\",\"id\":1}}",
        "{}",
        "{\"type\":\"nope\",\"id\":1}",
        "{\"type\":\"\\u006fk\",\"id\":1}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"a\\u0000b\"}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"caf\xc3\xa9\"}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"\xff\"}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"tab\there\"}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"v\",\"quiet\":true}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"v\",\"quiet\":false}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"v\",\"quiet\":1}",
        "{\"type\":\"kv_put\",\"id\":1,\"key\":\"\",\"value\":\"\"}",
        "{\"type\":\"join\",\"node_rank\":4294967297,\"hostname\":\"h\",\"addr\":\"a\","
        "\"nprocs\":1,\"gpus\":\"\"}",
        "{\"type\":\"join\",\"node_rank\":-1,\"hostname\":\"h\",\"addr\":\"a\",\"nprocs\":1,"
        "\"gpus\":\"\"}",
        "{\"type\":\"rank_exit\",\"rank\":1,\"code\":0,\"signal\":0,\"oom\":false,"
        "\"killed\":true,\"tail\":\"\"}",
        "{\"type\":\"rank_exit\",\"rank\":1,\"code\":0,\"signal\":0,\"oom\":0,\"killed\":true,"
        "\"tail\":\"\"}",
        "{\"type\":\"rank_exit\",\"rank\":1,\"code\":300,\"signal\":0,\"oom\":false,"
        "\"killed\":true,\"tail\":\"\"}",
        "{\"type\":\"report\",\"step\":3,\"loss\":2,\"lr\":0,\"tokens_per_s\":5,\"grad_norm\":1}",
        "{\"type\":\"abort\",\"cause\":\"x\",\"stacks\":true}",
        "{\"type\":\"barrier\",\"id\":1,\"name\":\"b\",\"count\":-3}",
        "{\"type\":\"hb\"}",
        "{\"type\":\"hb\",\"id\":1}",
        "{\"type\":\"error\",\"id\":1,\"code\":\"c\",\"msg\":\"a \\\"quoted\\\" word\"}",
    };
    int fast = 0;

    for (size_t i = 0; i < N_EXAMPLES; i++)
        fast += decode_both(examples[i].json);
    /* Every example without reals, nesting or escapes. */
    CHECK_EQ(fast, (int)N_EXAMPLES - 4);
    for (size_t i = 0; i < sizeof(tricky) / sizeof(tricky[0]); i++)
        decode_both(tricky[i]);
    CHECK(
        decode_both("{\"type\":\"kv_put\",\"id\":1,\"key\":\"addr/5\",\"value\":\"10.0.0.1:1\"}"));
    /* An agent's forward of a rank's put, the busiest of a job's start. */
    CHECK(decode_both("{\"type\":\"kv_put\",\"id\":1,\"key\":\"addr/5\",\"value\":\"10.0.0.1:1\","
                      "\"quiet\":true}"));
    CHECK(decode_both("{\"type\":\"rank_exit\",\"rank\":1,\"code\":0,\"signal\":0,\"oom\":false,"
                      "\"killed\":true,\"tail\":\"\"}"));
    CHECK(!decode_both("{\"type\":\"ok\", \"id\":1}"));
}

/* The progress record: what pack writes, unpack reads back, the unknown numbers left out. */
TEST(proto_progress_round_trip)
{
    struct proto_progress p, q;
    struct errmsg err;
    json_t *o = json_object();

    proto_progress_init(&p);
    CHECK(p.step == 0 && p.total_steps == 0 && isnan(p.loss) && isnan(p.lr) &&
          isnan(p.tokens_per_s) && isnan(p.grad_norm) && isnan(p.step_time));
    p.step = 1LL << 40;
    p.total_steps = 5000;
    p.loss = 2.5;
    p.step_time = 0.125;
    CHECK_EQ(proto_progress_pack(o, &p), 0);
    /* Known numbers and both integers; NANs stay out. */
    CHECK_EQ(json_object_size(o), 4);
    CHECK(!json_object_get(o, "lr") && !json_object_get(o, "grad_norm"));
    CHECK_EQ(proto_progress_unpack(o, true, &q, &err), 0);
    CHECK(q.step == p.step && q.total_steps == 5000 && q.loss == 2.5 && q.step_time == 0.125 &&
          isnan(q.lr) && isnan(q.tokens_per_s) && isnan(q.grad_norm));
    /* Other keys are the caller's. */
    json_object_set_new(o, "rank", json_integer(3));
    CHECK_EQ(proto_progress_unpack(o, true, &q, &err), 0);
    json_decref(o);
}

TEST(proto_progress_unpack_refuses_bad_fields)
{
    static const char *const bad[] = {
        "{\"step\":\"7\"}",
        "{\"step\":-1}",
        "{\"step\":1,\"total_steps\":-5}",
        "{\"step\":1,\"loss\":\"x\"}",
        "{\"step\":1.5}",
        "{\"step\":1,\"step_time\":null}",
        "[1]",
    };
    struct proto_progress p;
    struct errmsg err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *o = json_loads(bad[i], 0, NULL);
        CHECK(o != NULL);
        CHECK_EQ(proto_progress_unpack(o, false, &p, &err), -EBADMSG);
        json_decref(o);
    }
    /* A missing step: refused where required (a progress entry), unknown where not. */
    json_t *o = json_pack("{s:f}", "loss", 1.0);
    CHECK_EQ(proto_progress_unpack(o, true, &p, &err), -EBADMSG);
    CHECK_CONTAINS(err.text, "'step' missing");
    CHECK_EQ(proto_progress_unpack(o, false, &p, &err), 0);
    CHECK(p.step == 0 && p.loss == 1.0);
    json_decref(o);
}

/* The store's replies as text are what proto_pack's tree dumps to, byte for byte: ids at
 * their edges, values with every kind of byte a JSON string escapes, and UTF-8. */
TEST(proto_reply_texts_match_the_tree)
{
    static const json_int_t ids[] = {0, 1, 17, 4294967296LL, 9007199254740993LL, INT64_MAX};
    static const char *const values[] = {
        "",
        "v",
        "10.0.0.1:29500",
        "a\"b\\c/d",
        "\n\r\t\b\f",
        "\x01\x1f\x7f",
        "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80",
    };

    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        struct jtext t;
        json_t *m = proto_pack("{s:s, s:I}", "type", "ok", "id", ids[i]);
        char *want = json_dumps(m, JSON_COMPACT);

        jtext_init(&t);
        proto_ok_text(&t, ids[i]);
        CHECK(t.ok);
        CHECK_STR(t.p, want);
        free(want);
        json_decref(m);
        jtext_release(&t);
        for (size_t k = 0; k < sizeof(values) / sizeof(values[0]); k++) {
            m = proto_pack("{s:s, s:I, s:s}", "type", "kv_val", "id", ids[i], "value", values[k]);
            CHECK(m != NULL);
            want = json_dumps(m, JSON_COMPACT);
            jtext_init(&t);
            proto_kv_val_text(&t, ids[i], values[k]);
            CHECK(t.ok);
            CHECK_STR(t.p, want);
            free(want);
            json_decref(m);
            jtext_release(&t);
        }
    }
}

/* An assign's text is what proto_pack() dumps of its fields, and decodes back to them: a
 * node of a job and a spare, addresses with characters to escape. */
TEST(proto_assign_text_matches_the_tree)
{
    static const struct proto_assign cases[] = {
        {0, 16, 8, 2, "10.0.0.1", 29500, 0, "", false, "", 0, -1},
        {3, 100000, 99992, 12500, "gpu-\"a\"\\b", 65535, 41000, "node\x01\xc3\xa9", false,
         "10.0.0.2", 40123, 7},
        {1, 8, 0, 1, "::1", 1, 2, "h", true, "a", 3, 0},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct proto_assign *a = &cases[i];
        json_t *m = proto_pack(
            "{s:s, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:s, s:b, s:s, s:i, s:i}", "type", "assign",
            "generation", a->generation, "world_size", a->world_size, "rank_base", a->rank_base,
            "nnodes", a->nnodes, "master_addr", a->master_addr, "master_port", a->master_port,
            "hvd_port", a->hvd_port, "hvd_host", a->hvd_host, "spare", a->spare, "mem_addr",
            a->mem_addr, "mem_port", a->mem_port, "mem_node", a->mem_node);
        char *want = m ? json_dumps(m, JSON_COMPACT) : NULL;
        struct proto_error err;
        struct msg d;
        struct jtext t;

        CHECK(want != NULL);
        jtext_init(&t);
        proto_assign_text(&t, a);
        CHECK(t.ok);
        if (want && t.ok)
            CHECK_STR(t.p, want);
        CHECK_EQ(proto_decode((const uint8_t *)t.p, t.len, &d, &err), 0);
        CHECK_EQ(d.type, MSG_ASSIGN);
        CHECK_EQ(d.rank_base, a->rank_base);
        CHECK_EQ(d.world_size, a->world_size);
        CHECK_STR(d.master_addr, a->master_addr);
        CHECK_EQ(d.spare, a->spare);
        CHECK_EQ(d.mem_node, a->mem_node);
        proto_msg_release(&d);
        free(want);
        json_decref(m);
        jtext_release(&t);
    }
}
