/* The one way a module fills its caller's error text, and strerror() in our messages' case. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "errmsg.h"
#include "banned.h"

/* Longer than glibc's longest strerror() text (49 bytes: "Invalid or incomplete multibyte or
 * wide character"). */
#define STRERROR_MAX 64

int errmsg_vset(struct errmsg *e, int ret, const char *fmt, va_list ap)
{
    vsnprintf(e->text, sizeof(e->text), fmt, ap);
    return ret;
}

int errmsg_set(struct errmsg *e, int ret, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    errmsg_vset(e, ret, fmt, ap);
    va_end(ap);
    return ret;
}

const char *errmsg_strerror(int err)
{
    static _Thread_local char buf[STRERROR_MAX];

    snprintf(buf, sizeof(buf), "%s", strerror(err < 0 ? -err : err));
    /* "Connection refused" -> "connection refused"; an acronym ("RFS specific error") stays. */
    if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
        buf[0] = (char)(buf[0] - 'A' + 'a');
    return buf;
}
