/* Whether a cancel explains the job's first failure (cancel.h). */
#include <signal.h>

#include "cancel.h"
#include "banned.h"

bool cancel_explains(int sig, int64_t failed_ms, int64_t cancel_ms)
{
    if (sig != SIGTERM && sig != SIGINT && sig != SIGHUP)
        return false;
    return cancel_ms >= failed_ms && cancel_ms - failed_ms <= CANCEL_EXPLAINS_MS;
}
