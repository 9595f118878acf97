/* Signal names through glibc's sigabbrev_np, with the "SIG" people expect in front. */
#include <stdio.h>
#include <string.h>

#include "signame.h"
#include "banned.h"

char *signame(int sig, char out[SIGNAME_LEN])
{
    const char *s = sigabbrev_np(sig);

    if (s)
        snprintf(out, SIGNAME_LEN, "SIG%.12s", s);
    else
        snprintf(out, SIGNAME_LEN, "signal %d", sig);
    return out;
}
