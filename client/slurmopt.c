/* The values of Slurm's job options (slurmopt.h): sizes, times, signals, mail types,
 * dependencies and GRES, each read as sbatch reads it. */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "slurmopt.h"
#include "banned.h"

/* The longest time limit accepted: a year, far beyond any partition's MaxTime. */
#define TIME_LIMIT_MAX (365L * 24 * 3600)

/* One field of a Slurm time: digits only, at most 9 of them so that sums cannot overflow. */
static int time_field(const char *s, size_t n, long *out)
{
    long v = 0;

    if (n == 0 || n > 9)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -EINVAL;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int slurmopt_parse_time(const char *s, long *seconds)
{
    long f[3] = {0, 0, 0}, days = 0, total;
    const char *p = s, *dash;
    int n = 0;

    if (!strcmp(s, "UNLIMITED") || !strcmp(s, "INFINITE")) {
        *seconds = 0;
        return 0;
    }
    dash = strchr(s, '-');
    if (dash) {
        if (time_field(s, (size_t)(dash - s), &days) < 0)
            return -EINVAL;
        p = dash + 1;
    }
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (n == 3 || time_field(p, len, &f[n]) < 0)
            return -EINVAL;
        n++;
        if (!colon)
            break;
        p = colon + 1;
    }
    if (dash) /* days-hours[:minutes[:seconds]] */
        total = days * 86400 + f[0] * 3600 + f[1] * 60 + f[2];
    else if (n == 1) /* minutes */
        total = f[0] * 60;
    else if (n == 2) /* minutes:seconds */
        total = f[0] * 60 + f[1];
    else /* hours:minutes:seconds */
        total = f[0] * 3600 + f[1] * 60 + f[2];
    /* sbatch's 0 (any spelling of it) is no limit, as UNLIMITED is. */
    if (total > TIME_LIMIT_MAX)
        return -ERANGE;
    *seconds = total;
    return 0;
}

/* SIG of --signal (len bytes of s): a number, or a name with or without "SIG" in either case.
 * Returns the signal's number, or 0 when it is none. */
static int signal_number(const char *s, size_t len)
{
    char word[16];
    const char *bare;
    long v;

    if (len == 0 || len >= sizeof(word))
        return 0;
    snprintf(word, sizeof(word), "%.*s", (int)len, s);
    if (isdigit((unsigned char)word[0]))
        return time_field(word, len, &v) == 0 && v >= 1 && v <= SLURMOPT_SIGNAL_MAX ? (int)v : 0;
    bare = strncasecmp(word, "SIG", 3) == 0 ? word + 3 : word;
    for (int sig = 1; sig <= SLURMOPT_SIGNAL_MAX; sig++) {
        const char *abbrev = sigabbrev_np(sig);
        if (abbrev && !strcasecmp(abbrev, bare))
            return sig;
    }
    return 0;
}

/* The largest TIME of --signal: Slurm keeps it in 16 bits. */
#define SIGNAL_TIME_MAX 65535

int slurmopt_parse_signal(const char *s, struct slurmopt_signal *sig, struct errmsg *err)
{
    struct slurmopt_signal out = {.text = s, .time_s = SLURMOPT_SIGNAL_TIME_DEFAULT};
    const char *p = s, *colon = strchr(s, ':'), *at;
    size_t len;
    long t;

    /* The flags, as sbatch reads them: R, B, or both in either order. */
    if (colon) {
        for (const char *f = s; f < colon; f++) {
            int c = toupper((unsigned char)*f);
            if (c == 'R' && !out.reservation)
                out.reservation = true;
            else if (c == 'B' && !out.batch_only)
                out.batch_only = true;
            else
                return errmsg_set(err, -EINVAL,
                                  "--signal: '%.*s' is not R, B or RB (the flags before ':' in "
                                  "[{R|B}:]SIG[@TIME])",
                                  (int)(colon - s), s);
        }
        p = colon + 1;
    }
    at = strchr(p, '@');
    len = at ? (size_t)(at - p) : strlen(p);
    out.sig = signal_number(p, len);
    if (!out.sig)
        return errmsg_set(
            err, -EINVAL,
            "--signal: '%.*s' is not a signal (a number 1..%d, or a name such as USR1 "
            "or SIGUSR1)",
            (int)len, p, SLURMOPT_SIGNAL_MAX);
    /* The daemons pass on USR1 and USR2; any other would be theirs (TERM, INT, HUP cancel
     * the job) or kill them (ALRM...), not reach the ranks. */
    if (out.sig != SIGUSR1 && out.sig != SIGUSR2)
        return errmsg_set(
            err, -EINVAL,
            "--signal: '%.*s': gpurun passes only USR1 or USR2 on to the ranks (the time "
            "limit itself ends them with SIGTERM)",
            (int)len, p);
    if (at) {
        if (time_field(at + 1, strlen(at + 1), &t) < 0 || t > SIGNAL_TIME_MAX)
            return errmsg_set(err, -EINVAL, "--signal: '%s' is not a TIME of 0..%d seconds", at + 1,
                              SIGNAL_TIME_MAX);
        out.time_s = (int)t;
    }
    *sig = out;
    return 0;
}

/* The largest size in MiB: what slurmctld's 64-bit field holds below its MEM_PER_CPU flag
 * bit and NO_VAL64 markers, far above any node's memory. */
#define MEM_MB_MAX (1ULL << 62)

/* sbatch's units (str_to_mbytes): the power of 1024 of a MiB each stands for; K rounds up. */
static const struct {
    char unit;
    int shift; /* MiB = value << shift; -10: value / 1024, rounded up */
} mem_units[] = {{'K', -10}, {'M', 0}, {'G', 10}, {'T', 20}};

int slurmopt_parse_mem(const char *s, unsigned long long *mb)
{
    unsigned long long v = 0;
    const char *p = s;

    if (!isdigit((unsigned char)*p))
        return -EINVAL;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (MEM_MB_MAX - 9) / 10)
            return -ERANGE;
        v = v * 10 + (unsigned)(*p - '0');
    }
    if (*p == '\0') {
        *mb = v;
        return 0;
    }
    if (!(p[1] == '\0' || (toupper((unsigned char)p[1]) == 'B' && p[2] == '\0')))
        return -EINVAL;
    for (size_t i = 0; i < sizeof(mem_units) / sizeof(mem_units[0]); i++) {
        int sh = mem_units[i].shift;
        if (toupper((unsigned char)*p) != mem_units[i].unit)
            continue;
        if (sh < 0) {
            *mb = (v + 1023) >> 10;
            return 0;
        }
        if (v > MEM_MB_MAX >> sh)
            return -ERANGE;
        *mb = v << sh;
        return 0;
    }
    return -EINVAL;
}

void slurmopt_format_mem(char *buf, size_t n, unsigned long long mb)
{
    static const char units[] = "MGT";
    size_t u = 0;

    while (mb && mb % 1024 == 0 && u + 1 < sizeof(units) - 1) {
        mb /= 1024;
        u++;
    }
    snprintf(buf, n, "%llu%c", mb, units[u]);
}

/* --mail-type's words, as Slurm's parse_mail_type reads them. */
static const struct {
    const char *word;
    unsigned bits;
} mail_words[] = {
    {"NONE", 0},
    {"BEGIN", SLURMOPT_MAIL_BEGIN},
    {"END", SLURMOPT_MAIL_END},
    {"FAIL", SLURMOPT_MAIL_FAIL},
    {"REQUEUE", SLURMOPT_MAIL_REQUEUE},
    {"ALL", SLURMOPT_MAIL_BEGIN | SLURMOPT_MAIL_END | SLURMOPT_MAIL_FAIL | SLURMOPT_MAIL_REQUEUE |
                SLURMOPT_MAIL_STAGE_OUT | SLURMOPT_MAIL_INVALID_DEPEND},
    {"INVALID_DEPEND", SLURMOPT_MAIL_INVALID_DEPEND},
    {"STAGE_OUT", SLURMOPT_MAIL_STAGE_OUT},
    {"TIME_LIMIT", SLURMOPT_MAIL_TIME100},
    {"TIME_LIMIT_90", SLURMOPT_MAIL_TIME90},
    {"TIME_LIMIT_80", SLURMOPT_MAIL_TIME80},
    {"TIME_LIMIT_50", SLURMOPT_MAIL_TIME50},
    {"ARRAY_TASKS", SLURMOPT_MAIL_ARRAY_TASKS},
};

int slurmopt_parse_mail_type(const char *s, char *bad, size_t n)
{
    unsigned bits = 0;
    const char *p = s;

    for (;;) {
        size_t len = strcspn(p, ",");
        size_t i, count = sizeof(mail_words) / sizeof(mail_words[0]);
        for (i = 0; i < count; i++)
            if (strlen(mail_words[i].word) == len && !strncasecmp(p, mail_words[i].word, len))
                break;
        if (i == count) {
            snprintf(bad, n, "%.*s", (int)len, p);
            return -EINVAL;
        }
        /* NONE ends the list, as in Slurm: nothing is mailed. */
        if (mail_words[i].bits == 0)
            return 0;
        bits |= mail_words[i].bits;
        if (!p[len])
            return (int)bits;
        p += len + 1;
    }
}

/* --dependency's types that take job ids; "singleton" takes none. */
static const char *const dependency_types[] = {
    "after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok",
};

/* Whether s[0..len) is digits only (and at least one). */
static bool all_digits(const char *s, size_t len)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)s[i]))
            return false;
    return true;
}

/* One job id of a TYPE:ID list (len bytes): ID, ID_TASK or ID_*, then "+MINUTES" for after. */
static bool dependency_id_ok(const char *s, size_t len, bool after)
{
    size_t id = 0, rest;

    while (id < len && isdigit((unsigned char)s[id]))
        id++;
    if (id == 0)
        return false;
    rest = id;
    if (rest < len && s[rest] == '_') {
        size_t t = rest + 1;
        if (t < len && s[t] == '*')
            t++;
        else
            while (t < len && isdigit((unsigned char)s[t]))
                t++;
        if (t == rest + 1)
            return false;
        rest = t;
    }
    if (rest < len && s[rest] == '+' && after)
        return all_digits(s + rest + 1, len - rest - 1);
    return rest == len;
}

/* One item of a --dependency list (len bytes). */
static int dependency_item(const char *s, size_t len, struct errmsg *why)
{
    const char *colon = memchr(s, ':', len);
    size_t tlen = colon ? (size_t)(colon - s) : len;
    bool known = false;

    if (tlen == strlen("singleton") && !strncmp(s, "singleton", tlen))
        return colon ? errmsg_set(why, -EINVAL, "'singleton' takes no job id") : 0;
    for (size_t i = 0; i < sizeof(dependency_types) / sizeof(dependency_types[0]); i++)
        known = known ||
                (strlen(dependency_types[i]) == tlen && !strncmp(s, dependency_types[i], tlen));
    if (!known)
        return errmsg_set(why, -EINVAL,
                          "'%.*s' is not after, afterany, afterburstbuffer, aftercorr, "
                          "afternotok, afterok or singleton",
                          (int)tlen, s);
    if (!colon)
        return errmsg_set(why, -EINVAL, "'%.*s' needs a job id (%.*s:ID)", (int)tlen, s, (int)tlen,
                          s);
    for (const char *p = colon + 1, *end = s + len;;) {
        const char *next = memchr(p, ':', (size_t)(end - p));
        size_t ilen = next ? (size_t)(next - p) : (size_t)(end - p);
        if (!dependency_id_ok(p, ilen, tlen == strlen("after")))
            return errmsg_set(why, -EINVAL, "'%.*s' is not a job id", (int)ilen, p);
        if (!next)
            return 0;
        p = next + 1;
    }
}

int slurmopt_check_dependency(const char *s, struct errmsg *why)
{
    bool comma = strchr(s, ',') != NULL, any = strchr(s, '?') != NULL;
    char sep = any ? '?' : ',';
    const char *p = s;

    if (comma && any)
        return errmsg_set(why, -EINVAL, "',' (all of) and '?' (any of) cannot be mixed");
    for (;;) {
        const char *next = strchr(p, sep);
        size_t len = next ? (size_t)(next - p) : strlen(p);
        int r = dependency_item(p, len, why);
        if (r < 0)
            return r;
        if (!next)
            return 0;
        p = next + 1;
    }
}

int slurmopt_check_gres(const char *s, struct errmsg *why)
{
    const char *p = s;

    if (strlen(s) > SLURMOPT_GRES_LEN_MAX)
        return errmsg_set(why, -EINVAL, "longer than %d bytes", SLURMOPT_GRES_LEN_MAX);
    for (;;) {
        size_t len = strcspn(p, ","), name;
        const char *item = p;
        if (len >= 5 && (!strncmp(item, "gres:", 5) || !strncmp(item, "gres/", 5)))
            item += 5, len -= 5;
        name = strcspn(item, ":,");
        if (name > len)
            name = len;
        if (name == 0)
            return errmsg_set(why, -EINVAL, "an item without a name ('%.*s')", (int)len, item);
        if (name == 3 && !strncmp(item, "gpu", 3))
            return errmsg_set(why, -EINVAL, "the GPUs are --gpus-per-node's (or --no-gpus)");
        for (size_t i = 0; i < len; i++)
            if (isspace((unsigned char)item[i]) || item[i] == '"')
                return errmsg_set(why, -EINVAL, "'%.*s' is not name[:type][:count]", (int)len,
                                  item);
        p = item + len;
        if (!*p)
            return 0;
        p++;
    }
}

/* A GPU item's "[TYPE][:N]" after "gpu:" (p, len bytes) into *gpus and type. */
static int gres_gpu_item(const char *p, size_t len, int *gpus, char *type, size_t tn,
                         struct errmsg *why)
{
    const char *colon = memchr(p, ':', len), *num = colon ? colon + 1 : p;
    size_t tlen = colon ? (size_t)(colon - p) : 0, nlen = len - (size_t)(num - p);
    long n = 0;

    /* "gpu:a100": a TYPE, one GPU. */
    if (!colon && len > 0 && strspn(p, "0123456789") < len) {
        tlen = len;
        nlen = 0;
    }
    if (tlen > SLURMOPT_GPU_TYPE_MAX || tlen >= tn)
        return errmsg_set(why, -EINVAL, "the GPU type '%.*s' is longer than %d bytes", (int)tlen, p,
                          SLURMOPT_GPU_TYPE_MAX);
    for (size_t i = 0; i < tlen; i++)
        if (!isalnum((unsigned char)p[i]) && !strchr("_-.", p[i]))
            return errmsg_set(why, -EINVAL, "'%.*s' is not a GPU type", (int)tlen, p);
    if (colon && tlen == 0)
        return errmsg_set(why, -EINVAL, "an empty GPU type");
    if (colon && nlen == 0)
        return errmsg_set(why, -EINVAL, "'' is not a number of GPUs");
    for (size_t i = 0; i < nlen; i++) {
        if (!isdigit((unsigned char)num[i]) || n > 1024)
            return errmsg_set(why, -EINVAL, "'%.*s' is not a number of GPUs", (int)nlen, num);
        n = n * 10 + (num[i] - '0');
    }
    if (nlen == 0)
        n = 1;
    if (n < 1 || n > 1024)
        return errmsg_set(why, -EINVAL, "%ld GPUs: must be 1..1024 per node", n);
    memcpy(type, p, tlen);
    type[tlen] = '\0';
    *gpus = (int)n;
    return 0;
}

int slurmopt_split_gres(const char *s, int *gpus, char *type, size_t tn, char *rest, size_t rn,
                        struct errmsg *why)
{
    size_t out = 0;

    *gpus = 0;
    type[0] = rest[0] = '\0';
    if (strlen(s) > SLURMOPT_GRES_LEN_MAX || rn <= strlen(s))
        return errmsg_set(why, -EINVAL, "longer than %d bytes", SLURMOPT_GRES_LEN_MAX);
    for (const char *p = s;;) {
        size_t len = strcspn(p, ","), skip = 0;
        if (len >= 5 && (!strncmp(p, "gres:", 5) || !strncmp(p, "gres/", 5)))
            skip = 5;
        if (len - skip >= 3 && !strncmp(p + skip, "gpu", 3) &&
            (len - skip == 3 || p[skip + 3] == ':')) {
            int r;
            if (*gpus)
                return errmsg_set(why, -EINVAL, "more than one GPU item");
            r = gres_gpu_item(p + skip + 3 + (len - skip > 3), len - skip - 3 - (len - skip > 3),
                              gpus, type, tn, why);
            if (r < 0)
                return r;
        } else {
            out += (size_t)snprintf(rest + out, rn - out, "%s%.*s", out ? "," : "", (int)len, p);
        }
        if (!p[len])
            return 0;
        p += len + 1;
    }
}
