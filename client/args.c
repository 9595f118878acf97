/* The command line as tables: one row per subcommand, one row per option with its kind, the
 * field it fills, its range and the subcommands that take it. Help is generated from the
 * same rows, so an option cannot exist without its help line. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "traincfg.h"
#include "banned.h"

struct cmd_row {
    const char *name;
    const char *hint; /* where a refused command line should look */
    const char *usage;
    const char *summary;
};

static const struct cmd_row cmds[CMD_COUNT] = {
    [CMD_RUN] = {"gpurun", "gpurun --help",
                 "gpurun [options] (train.cfg [section.key=value...] | -- CMD [ARGS...])",
                 "Runs CMD (or gpurun-train with the train.cfg) as every rank of a distributed\n"
                 "job, with RANK, WORLD_SIZE, MASTER_ADDR and the rest of torch's env://\n"
                 "variables set. Submits the job to Slurm through libslurm and prints\n"
                 "\"Submitted job ID\"; --wait stays until it ends. With --local the job runs\n"
                 "on this machine: one rendezvousd per node, all on loopback. A train.cfg's\n"
                 "[job] keys (nodes, gpus_per_node, time, partition, account, job_name,\n"
                 "output, max_restarts) apply where no option is given.\n"
                 "Subcommands: gpurun status|logs|cancel --help."},
    [CMD_STATUS] = {"status", "gpurun status --help",
                    "gpurun status [JOBID | --job-dir DIR] [--json] [--watch]",
                    "Slurm's view of the job (state, reason while pending, nodes, elapsed, time\n"
                    "limit) and, while it runs, its leader's live view: every rank's phase,\n"
                    "step, loss and tokens/s, and a progress bar. After the job has ended,\n"
                    "its summary: outcome, first failure, phase timings. Without a JOBID:\n"
                    "your gpurun jobs, one per line. The --json layout is documented in\n"
                    "README.md (\"gpurun status --json\") and only grows."},
    [CMD_LOGS] = {"logs", "gpurun logs --help",
                  "gpurun logs [JOBID | --job-dir DIR] [--rank R] [-f]",
                  "Prints the job's rank logs: every rank's lines prefixed \"[R] \", or one\n"
                  "rank's log as it was written. -f keeps printing until the job ends."},
    [CMD_CANCEL] = {"cancel", "gpurun cancel --help", "gpurun cancel JOBID",
                    "Cancels a job: a Slurm job through slurm_kill_job (every node's\n"
                    "rendezvousd tears its ranks down: SIGTERM, then SIGKILL), a local one by\n"
                    "SIGTERM to its leader. Returns once the job's processes are gone."},
};

enum arg_kind {
    ARG_FLAG,     /* bool, no value */
    ARG_INT,      /* int in [min, max] */
    ARG_SECONDS,  /* seconds with up to 3 decimals, stored as int milliseconds in [min, max] */
    ARG_TIME,     /* Slurm time limit, stored as long seconds */
    ARG_STRING,   /* non-empty const char *, borrowed from argv */
    ARG_EXPORT,   /* NAME=VALUE appended to spec.env */
    ARG_LOGLEVEL, /* error|warn|info|debug */
};

#define ON_RUN    (1u << CMD_RUN)
#define ON_STATUS (1u << CMD_STATUS)
#define ON_LOGS   (1u << CMD_LOGS)
#define ON_CANCEL (1u << CMD_CANCEL)
#define ON_ALL    (ON_RUN | ON_STATUS | ON_LOGS | ON_CANCEL)

/* The most ranks a job can have: jobspec's 65536 nodes times 1024 ranks per node. */
#define RANK_MAX (65536 * 1024 - 1)

/* The longest time limit accepted: a year, far beyond any partition's MaxTime. */
#define TIME_LIMIT_MAX (365L * 24 * 3600)

#define FIELD(f) offsetof(struct gpurun_args, f)

struct opt_row {
    char short_name; /* 0: long name only */
    const char *long_name;
    enum arg_kind kind;
    size_t offset; /* the field of struct gpurun_args it fills */
    int min, max;  /* ARG_INT: the range; ARG_SECONDS: the range in milliseconds */
    unsigned cmds; /* ON_* of the subcommands that take it */
    const char *metavar;
    const char *help;
};

static const struct opt_row opts[] = {
    {'N', "nodes", ARG_INT, FIELD(spec.nnodes), 1, 65536, ON_RUN, "N",
     "nodes to run on: one rendezvousd each"},
    {0, "gpus-per-node", ARG_INT, FIELD(spec.nprocs), 1, 1024, ON_RUN, "N",
     "ranks per node, one GPU each"},
    {0, "cpus-per-gpu", ARG_INT, FIELD(cpus_per_gpu), 1, 1024, ON_RUN, "N",
     "CPUs Slurm gives each rank"},
    {0, "no-gpus", ARG_FLAG, FIELD(no_gpus), 0, 0, ON_RUN, NULL,
     "ask Slurm for no GPUs: the ranks run on CPUs"},
    {'t', "time", ARG_TIME, FIELD(time_limit_s), 0, 0, ON_RUN, "TIME",
     "time limit as for sbatch (90, 1:30:00, 2-0...); exit 124 past it"},
    {'p', "partition", ARG_STRING, FIELD(partition), 0, 0, ON_RUN, "NAME", "Slurm partition"},
    {'A', "account", ARG_STRING, FIELD(account), 0, 0, ON_RUN, "NAME", "Slurm account"},
    {'J', "job-name", ARG_STRING, FIELD(job_name), 0, 0, ON_RUN, "NAME", "job name"},
    {'o', "output", ARG_STRING, FIELD(output), 0, 0, ON_RUN, "FILE",
     "the merged \"[R] line\" stream to FILE (%j: job id)"},
    {0, "max-restarts", ARG_INT, FIELD(spec.max_restarts), 0, 1000, ON_RUN, "N",
     "restart the ranks up to N times after a failure"},
    {0, "wait", ARG_FLAG, FIELD(wait), 0, 0, ON_RUN, NULL,
     "stay until the job ends, print its output, exit with its status"},
    {0, "emit-sbatch", ARG_FLAG, FIELD(emit_sbatch), 0, 0, ON_RUN, NULL,
     "print the batch script instead of submitting it"},
    {0, "local", ARG_FLAG, FIELD(local), 0, 0, ON_RUN, NULL, "run on this machine, without Slurm"},
    {0, "job-dir", ARG_STRING, FIELD(job_dir), 0, 0, ON_ALL, "DIR",
     "the job directory (default $GPURUN_JOBS/<id>/, ~/.gpurun/jobs)"},
    {0, "hang-timeout", ARG_SECONDS, FIELD(spec.hang_timeout_ms), 0, 86400000, ON_RUN, "SEC",
     "fail the job when no rank reports progress for SEC (0: never)"},
    {0, "kill-grace", ARG_SECONDS, FIELD(spec.kill_grace_ms), 0, 600000, ON_RUN, "SEC",
     "time from SIGTERM to SIGKILL when ranks are torn down"},
    {0, "heartbeat", ARG_SECONDS, FIELD(spec.hb_interval_ms), 10, 600000, ON_RUN, "SEC",
     "heartbeat interval between daemons"},
    {0, "heartbeat-timeout", ARG_SECONDS, FIELD(spec.hb_timeout_ms), 20, 3600000, ON_RUN, "SEC",
     "silence after which a daemon counts as lost (default 10 heartbeats)"},
    {0, "join-timeout", ARG_SECONDS, FIELD(spec.join_timeout_ms), 10, 86400000, ON_RUN, "SEC",
     "how long the leader waits for every node to join"},
    {0, "export", ARG_EXPORT, 0, 0, 0, ON_RUN, "K=V",
     "add K=V to every rank's environment (repeatable)"},
    {0, "json", ARG_FLAG, FIELD(json), 0, 0, ON_STATUS, NULL, "print the status as JSON"},
    {'w', "watch", ARG_FLAG, FIELD(watch), 0, 0, ON_STATUS, NULL,
     "refresh the status every 2 s until the job ends"},
    {0, "rank", ARG_INT, FIELD(rank), 0, RANK_MAX, ON_LOGS, "R", "print only rank R's log"},
    {'f', "follow", ARG_FLAG, FIELD(follow), 0, 0, ON_LOGS, NULL,
     "keep printing as the logs grow, until the job ends"},
    {0, "log-level", ARG_LOGLEVEL, FIELD(log_level), 0, 0, ON_ALL, "LEVEL",
     "error, warn, info or debug (for gpurun and its daemons)"},
    {'h', "help", ARG_FLAG, FIELD(help), 0, 0, ON_ALL, NULL, "print this help"},
    {0, "version", ARG_FLAG, FIELD(version), 0, 0, ON_RUN, NULL, "print gpurun's version"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* args.given has one bit per row. */
_Static_assert(N_OPTS <= 64, "more option rows than bits in gpurun_args.given");

/* Names the daemon sets for each rank: an --export of one of them would lie to the rank. */
static const char *const reserved_env[] = {
    "RANK",        "LOCAL_RANK",  "WORLD_SIZE",  "LOCAL_WORLD_SIZE", "NODE_RANK",     "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "GPURUN_SOCK", "GPURUN_TOKEN",     "GPURUN_JOB_DIR"};

void args_init(struct gpurun_args *args)
{
    memset(args, 0, sizeof(*args));
    jobspec_init(&args->spec);
    args->cmd = CMD_RUN;
    args->rank = -1;
    args->cpus_per_gpu = 1;
    args->log_level = LOG_WARN;
    args->log_level_name = "warn";
}

void args_release(struct gpurun_args *args)
{
    jobspec_release(&args->spec);
    args_init(args);
}

const char *args_cmd_name(enum gpurun_cmd cmd)
{
    return (unsigned)cmd < CMD_COUNT ? cmds[cmd].name : "?";
}

static int fail(struct args_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct args_error *err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err->text, sizeof(err->text), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* Strict decimal: optional sign, digits, nothing after; no blanks. */
static int parse_long(const char *s, long *out)
{
    char *end;

    if (!(isdigit((unsigned char)s[0]) ||
          ((s[0] == '-' || s[0] == '+') && isdigit((unsigned char)s[1]))))
        return -EINVAL;
    errno = 0;
    *out = strtol(s, &end, 10);
    if (*end)
        return -EINVAL;
    if (errno == ERANGE)
        return -ERANGE;
    return 0;
}

/* "12", "0.5", "1.250": seconds with a fraction, to milliseconds (digits past the third
 * decimal are dropped). No sign, exponent or blank: a timeout is written by a person. */
static int parse_ms(const char *s, long *ms)
{
    long whole = 0, frac = 0;
    int scale = 100;
    const char *p = s;

    if (!isdigit((unsigned char)*p))
        return -EINVAL;
    for (; isdigit((unsigned char)*p); p++) {
        if (whole > LONG_MAX / 10000)
            return -ERANGE;
        whole = whole * 10 + (*p - '0');
    }
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return -EINVAL;
        for (; isdigit((unsigned char)*p); p++) {
            frac += scale * (*p - '0');
            scale /= 10;
        }
    }
    if (*p)
        return -EINVAL;
    *ms = whole * 1000 + frac;
    return 0;
}

/* Milliseconds as seconds for a message: 10 -> "0.01", 600000 -> "600". */
static void format_ms(char *buf, size_t n, long ms)
{
    if (ms % 1000 == 0)
        snprintf(buf, n, "%ld", ms / 1000);
    else if (ms % 100 == 0)
        snprintf(buf, n, "%ld.%ld", ms / 1000, (ms % 1000) / 100);
    else if (ms % 10 == 0)
        snprintf(buf, n, "%ld.%02ld", ms / 1000, (ms % 1000) / 10);
    else
        snprintf(buf, n, "%ld.%03ld", ms / 1000, ms % 1000);
}

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

int args_parse_time(const char *s, long *seconds)
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
    if (total <= 0 || total > TIME_LIMIT_MAX)
        return -ERANGE;
    *seconds = total;
    return 0;
}

static bool env_name_ok(const char *kv, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)kv[0]) || kv[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)kv[i]) || kv[i] == '_'))
            return false;
    return true;
}

static int set_export(struct gpurun_args *args, const char *name, const char *kv,
                      struct args_error *err)
{
    const char *eq = strchr(kv, '=');

    if (!eq || !env_name_ok(kv, (size_t)(eq - kv)))
        return fail(err, "--%s: '%s' is not NAME=VALUE", name, kv);
    for (size_t i = 0; i < sizeof(reserved_env) / sizeof(reserved_env[0]); i++)
        if (strlen(reserved_env[i]) == (size_t)(eq - kv) &&
            !strncmp(kv, reserved_env[i], (size_t)(eq - kv)))
            return fail(err, "--%s: '%s' is set by gpurun for every rank", name, reserved_env[i]);
    if (jobspec_add_env(&args->spec, kv) < 0)
        return fail(err, "--%s: out of memory", name);
    return 0;
}

/* Stores val (NULL for a flag) into the field of row o. */
static int set_value(struct gpurun_args *args, const struct opt_row *o, const char *val,
                     struct args_error *err)
{
    void *field = (char *)args + o->offset;
    const char *name = o->long_name;
    long v;
    int r;

    switch (o->kind) {
    case ARG_FLAG:
        *(bool *)field = true;
        return 0;
    case ARG_INT:
        r = parse_long(val, &v);
        if (r == -EINVAL)
            return fail(err, "--%s: '%s' is not a number", name, val);
        if (r < 0 || v < o->min || v > o->max)
            return fail(err, "--%s: must be %d..%d", name, o->min, o->max);
        *(int *)field = (int)v;
        return 0;
    case ARG_SECONDS:
        r = parse_ms(val, &v);
        if (r == -EINVAL)
            return fail(err, "--%s: '%s' is not a number of seconds", name, val);
        if (r < 0 || v < o->min || v > o->max) {
            char lo[32], hi[32];
            format_ms(lo, sizeof(lo), o->min);
            format_ms(hi, sizeof(hi), o->max);
            return fail(err, "--%s: must be %s..%s seconds", name, lo, hi);
        }
        *(int *)field = (int)v;
        return 0;
    case ARG_TIME:
        r = args_parse_time(val, &v);
        if (r == -EINVAL)
            return fail(err,
                        "--%s: '%s' is not a time (minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]])",
                        name, val);
        if (r < 0)
            return fail(err, "--%s: must be 1 second..365 days", name);
        *(long *)field = v;
        return 0;
    case ARG_STRING:
        if (!*val)
            return fail(err, "--%s: empty value", name);
        *(const char **)field = val;
        return 0;
    case ARG_EXPORT:
        return set_export(args, name, val, err);
    case ARG_LOGLEVEL:
        if (log_level_parse(val, (enum log_level *)field) < 0)
            return fail(err, "--%s: '%s' is not error, warn, info or debug", name, val);
        args->log_level_name = val;
        return 0;
    }
    return fail(err, "--%s: bad option row", name);
}

static const struct opt_row *find_long(const char *name, size_t n)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].long_name) == n && !strncmp(opts[i].long_name, name, n))
            return &opts[i];
    return NULL;
}

static const struct opt_row *find_short(char c)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].short_name && opts[i].short_name == c)
            return &opts[i];
    return NULL;
}

static bool takes_value(const struct opt_row *o)
{
    return o->kind != ARG_FLAG;
}

/* Handles the option at argv[*i] (which starts with '-' and is not "--" or "-"), taking its
 * value from the same word or the next one. */
static int parse_option(struct gpurun_args *args, int argc, char **argv, int *i, bool *hb_seen,
                        struct args_error *err)
{
    const char *word = argv[*i], *val = NULL;
    const struct opt_row *o;

    if (word[1] == '-') {
        const char *name = word + 2, *eq = strchr(name, '=');
        o = find_long(name, eq ? (size_t)(eq - name) : strlen(name));
        if (!o)
            return fail(err, "unknown option '%.*s' (see '%s')",
                        (int)(eq ? (size_t)(eq - word) : strlen(word)), word, cmds[args->cmd].hint);
        if (eq)
            val = eq + 1;
    } else {
        o = find_short(word[1]);
        if (!o)
            return fail(err, "unknown option '-%c' (see '%s')", word[1], cmds[args->cmd].hint);
        if (word[2])
            val = word + 2;
    }
    if (!(o->cmds & (1u << args->cmd)))
        return fail(err, "option '--%s' does not apply to '%s' (see '%s')", o->long_name,
                    args->cmd == CMD_RUN ? "gpurun" : args_cmd_name(args->cmd),
                    cmds[args->cmd].hint);
    if (!takes_value(o) && val)
        return fail(err, "option '--%s' takes no value", o->long_name);
    if (takes_value(o) && !val) {
        if (*i + 1 >= argc)
            return fail(err, "option '--%s' needs a value", o->long_name);
        val = argv[++*i];
    }
    if (o->offset == FIELD(spec.hb_timeout_ms) && o->kind == ARG_SECONDS)
        *hb_seen = true;
    args->given |= 1ull << (o - opts);
    return set_value(args, o, val, err);
}

/* The positional arguments: run takes one train.cfg and its "section.key=value" overrides,
 * the others one JOBID. */
static int parse_positional(struct gpurun_args *args, const char *word, struct args_error *err)
{
    if (args->cmd == CMD_RUN && traincfg_is_override(word)) {
        if (args->n_overrides == ARGS_MAX_OVERRIDES)
            return fail(err, "more than %d overrides", ARGS_MAX_OVERRIDES);
        args->overrides[args->n_overrides++] = word;
        return 0;
    }
    if (args->target)
        return fail(err,
                    args->cmd == CMD_RUN ? "unexpected argument '%s' (to run a command, put it "
                                           "after '--': gpurun [options] -- CMD ARGS...)"
                                         : "unexpected argument '%s'",
                    word);
    args->target = word;
    return 0;
}

/* The heartbeat timeout follows the interval unless it was given: ten beats of silence. */
static int finish_heartbeat(struct gpurun_args *args, bool hb_seen, struct args_error *err)
{
    struct jobspec *s = &args->spec;

    if (!hb_seen) {
        long t = 10L * s->hb_interval_ms;
        const struct opt_row *o = find_long("heartbeat-timeout", strlen("heartbeat-timeout"));
        s->hb_timeout_ms = (int)(t > o->max ? o->max : t);
    }
    if (s->hb_timeout_ms <= s->hb_interval_ms) {
        char t[32], iv[32];
        format_ms(t, sizeof(t), s->hb_timeout_ms);
        format_ms(iv, sizeof(iv), s->hb_interval_ms);
        return fail(err, "--heartbeat-timeout: %s seconds is not longer than the heartbeat (%s)", t,
                    iv);
    }
    return 0;
}

int args_parse(struct gpurun_args *args, int argc, char **argv, struct args_error *err)
{
    bool hb_seen = false, dashdash = false;
    int i = 1, r;

    if (argc > 1) {
        for (int c = CMD_STATUS; c < CMD_COUNT; c++) {
            if (!strcmp(argv[1], cmds[c].name)) {
                args->cmd = (enum gpurun_cmd)c;
                i = 2;
                break;
            }
        }
    }
    for (; i < argc; i++) {
        const char *word = argv[i];
        if (!strcmp(word, "--")) {
            dashdash = true;
            i++;
            break;
        }
        if (word[0] == '-' && word[1])
            r = parse_option(args, argc, argv, &i, &hb_seen, err);
        else
            r = parse_positional(args, word, err);
        if (r < 0)
            return r;
    }
    if (i < argc) {
        if (args->cmd != CMD_RUN) {
            for (; i < argc; i++)
                if ((r = parse_positional(args, argv[i], err)) < 0)
                    return r;
        } else if (args->target) {
            return fail(err, "give a train.cfg or '-- CMD', not both");
        } else if (args->n_overrides > 0) {
            return fail(err, "'%s': overrides are for a train.cfg, not for '-- CMD'",
                        args->overrides[0]);
        } else {
            args->cmd_argv = argv + i;
            args->cmd_argc = argc - i;
        }
    } else if (args->cmd == CMD_RUN && dashdash && !args->target) {
        return fail(err, "nothing after '--': name the command to run");
    }
    return finish_heartbeat(args, hb_seen, err);
}

bool args_given(const struct gpurun_args *args, const char *long_name)
{
    const struct opt_row *o = find_long(long_name, strlen(long_name));

    return o && (args->given & (1ull << (o - opts)));
}

void args_usage(FILE *out, enum gpurun_cmd cmd)
{
    struct gpurun_args def;

    args_init(&def);
    fprintf(out, "usage: %s\n\n%s\n\noptions:\n", cmds[cmd].usage, cmds[cmd].summary);
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt_row *o = &opts[i];
        char left[64], dflt[48] = "";
        const void *field = (const char *)&def + o->offset;

        if (!(o->cmds & (1u << cmd)))
            continue;
        snprintf(left, sizeof(left), "%c%c%c --%s%s%s", o->short_name ? '-' : ' ',
                 o->short_name ? o->short_name : ' ', o->short_name ? ',' : ' ', o->long_name,
                 o->metavar ? " " : "", o->metavar ? o->metavar : "");
        if (o->kind == ARG_INT && o->offset != FIELD(rank))
            snprintf(dflt, sizeof(dflt), " [%d]", *(const int *)field);
        else if (o->kind == ARG_SECONDS && o->offset != FIELD(spec.hb_timeout_ms)) {
            char s[32];
            format_ms(s, sizeof(s), *(const int *)field);
            snprintf(dflt, sizeof(dflt), " [%s]", s);
        } else if (o->kind == ARG_LOGLEVEL)
            snprintf(dflt, sizeof(dflt), " [%s]", def.log_level_name);
        fprintf(out, "  %-28s %s%s\n", left, o->help, dflt);
    }
    if (cmd == CMD_RUN)
        fprintf(out, "\nexit status: the job's own; 124 time limit, 125 gpurun failed, 126 cannot\n"
                     "execute, 127 command not found, 128+N gpurun killed by signal N.\n");
    args_release(&def);
}
