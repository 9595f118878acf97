/* JSON text built by hand where jansson's trees cost too much (summary.json's line of each of
 * 100,000 ranks): a growing buffer and the pieces of a compact object, each written exactly as
 * json_dumpb(..., JSON_COMPACT) writes it (tests/test_jtext.c holds them to that). */
#ifndef GPURUN_JTEXT_H
#define GPURUN_JTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* A text: p holds len bytes (NUL-terminated), room for cap. ok turns false at the first
 * allocation that fails; every later call then does nothing. */
struct jtext {
    char *p;
    size_t len, cap;
    bool ok;
};

void jtext_init(struct jtext *t);
void jtext_release(struct jtext *t);
/* Appends n bytes of s as they are. */
void jtext_raw(struct jtext *t, const char *s, size_t n);
/* Appends s (a C string) as it is. */
void jtext_lit(struct jtext *t, const char *s);
/* Appends n bytes of UTF-8 as a JSON string, quotes included ('"', '\' and the control bytes
 * escaped as jansson escapes them). */
void jtext_str(struct jtext *t, const char *s, size_t n);
/* Appends an integer, a number as json_real dumps it ("%.17g", ".0" where it would read as an
 * integer; v finite), and true or false. */
void jtext_int(struct jtext *t, long long v);
void jtext_real(struct jtext *t, double v);
void jtext_bool(struct jtext *t, bool v);
/* Appends v's compact dump (v borrowed). */
void jtext_json(struct jtext *t, const json_t *v);
/* Appends ,"key": (or "key": first: a key of a compact object; key needs no escaping). */
void jtext_key(struct jtext *t, const char *key, bool first);

#endif
