/* The job's value of the job mark (jobmark.h) from its key: apart from jobmark.c, so that
 * the rank shim (daemon/shim/main.c), which parses and sweeps marks but never makes one,
 * links without libcrypto. */
#include <stdint.h>

#include "auth.h"
#include "jobmark.h"
#include "banned.h"

/* The label of the job's value: HMAC(key, label) (auth_key_derive). */
#define JOB_LABEL "gpurun job mark"

uint64_t jobmark_job(const struct auth_key *key)
{
    uint8_t mac[AUTH_TAG_LEN];
    uint64_t v = 0;

    auth_key_derive(key, JOB_LABEL, mac);
    for (int i = 0; i < 8; i++)
        v = v << 8 | mac[i];
    return v;
}
