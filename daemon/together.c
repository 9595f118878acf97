/* Whether a job's ranks ever met (together.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "together.h"
#include "banned.h"

/* The port of "HEXADDR:HEXPORT" at *p, moving *p past it; -1 when it does not parse. */
static int endpoint_port(const char **p, const char *end)
{
    const char *s = *p, *colon = NULL;
    long port = 0;
    int digits = 0;

    while (s < end && *s == ' ')
        s++;
    while (s < end && *s != ' ' && *s != '\n') {
        if (*s == ':')
            colon = s;
        s++;
    }
    *p = s;
    if (!colon)
        return -1;
    for (const char *h = colon + 1; h < s; h++, digits++) {
        int v = *h >= '0' && *h <= '9'   ? *h - '0'
                : *h >= 'A' && *h <= 'F' ? *h - 'A' + 10
                : *h >= 'a' && *h <= 'f' ? *h - 'a' + 10
                                         : -1;
        if (v < 0 || digits >= 4)
            return -1;
        port = port * 16 + v;
    }
    return digits == 4 ? (int)port : -1;
}

bool together_tcp_uses_port(const char *text, size_t len, int port)
{
    const char *p = text, *end = text + len;

    if (port <= 0)
        return false;
    /* The header line names the columns. */
    p = memchr(p, '\n', len);
    while (p && ++p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p)), *colon;
        const char *stop = eol ? eol : end;
        /* A line without its end was cut (a read of a table that grew). */
        if (!eol)
            break;
        colon = memchr(p, ':', (size_t)(stop - p));
        if (colon && colon < stop) {
            const char *q = colon + 1;
            int local = endpoint_port(&q, stop), remote = endpoint_port(&q, stop);
            if (local == port || remote == port)
                return true;
        }
        p = eol;
    }
    return false;
}

bool together_runs_python(const char *argv0, const char *head)
{
    const char *base = argv0 ? strrchr(argv0, '/') : NULL, *eol;

    base = base ? base + 1 : argv0 ? argv0 : "";
    if (!strncmp(base, "python", 6))
        return true;
    if (!head || strncmp(head, "#!", 2))
        return false;
    eol = strchr(head, '\n');
    head = strstr(head, "python");
    return head && (!eol || head < eol);
}

enum together_verdict together_judge(int world_size, bool judged, bool master_port_seen,
                                     bool store_used)
{
    if (world_size <= 1 || !judged)
        return TOGETHER_NOT_APPLICABLE;
    return master_port_seen || store_used ? TOGETHER_MET : TOGETHER_ALONE;
}

/* Whether the n bytes at p hold word. */
static bool holds(const char *p, size_t n, const char *word)
{
    size_t w = strlen(word);

    for (size_t i = 0; p && n >= w && i <= n - w; i++)
        if (!memcmp(p + i, word, w))
            return true;
    return false;
}

void together_fix(char *const *argv, const char *text, size_t n, int world_size, char *out,
                  size_t outn)
{
    bool fairseq = false, mpi = holds(text, n, "mpi4py");

    for (char *const *a = argv; a && *a && !fairseq; a++) {
        const char *base = strrchr(*a, '/');
        base = base ? base + 1 : *a;
        fairseq = !strncmp(base, "fairseq", 7);
        /* python3 fairseq_cli/hydra_train.py: the folder names it. */
        fairseq = fairseq || strstr(*a, "fairseq_cli/") != NULL;
        mpi = mpi || strstr(*a, "mpi4py") != NULL;
    }
    if (fairseq)
        snprintf(out, outn,
                 "fairseq trains alone while its distributed_world_size is 1: add "
                 "distributed_training.distributed_world_size=%d to its command",
                 world_size);
    else if (mpi)
        snprintf(out, outn,
                 "an MPI program's ranks started by gpurun are MPI singletons, each a world of "
                 "1 (MPI_Init finds no process manager): start it with mpirun or srun "
                 "--mpi=pmix, or join its %d ranks with torch.distributed (env://)",
                 world_size);
    else
        snprintf(out, outn,
                 "if they were meant to train together, the script must join them "
                 "(torch.distributed.init_process_group with env://, or its framework's world "
                 "size set to %d)",
                 world_size);
}
