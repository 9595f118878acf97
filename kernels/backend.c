/* What the training backends share (backend.h): the one way a backend records its failure. */
#include <stdarg.h>
#include <stdio.h>

#include "backend.h"
#include "banned.h"

int backend_fail(struct backend *b, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(b->err, sizeof(b->err), fmt, ap);
    va_end(ap);
    return err;
}
