/* The text of one failure, filled by the module that failed and printed, logged or sent by its
 * caller: what failed, 'subject', then why (docs/design.md, section 9, rule 9). */
#ifndef GPURUN_ERRMSG_H
#define GPURUN_ERRMSG_H

#include <limits.h>
#include <stdarg.h>

/* Room for a message that names one path of any length (PATH_MAX) with its reason; a longer
 * one is cut, never an error. */
#define ERRMSG_MAX (PATH_MAX + 128)

#ifdef __cplusplus
extern "C" {
#endif

struct errmsg {
    char text[ERRMSG_MAX];
};

/* Writes fmt and its arguments into e (borrowed) and returns ret, so that a failure is one
 * statement: `return errmsg_set(err, -EINVAL, "'%s' is not a number", s);`. Thread context:
 * any (e is the caller's). */
int errmsg_set(struct errmsg *e, int ret, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* errmsg_set() with the arguments in ap, for a module's own wrapper that does more than record
 * the text (marks a link broken, picks where the text goes). */
int errmsg_vset(struct errmsg *e, int ret, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* strerror() of err (a negative errno or a positive one) in the grammar of our messages:
 * "connection refused", not "Connection refused". Returns a thread-local buffer, valid until
 * the calling thread's next call. */
const char *errmsg_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif
