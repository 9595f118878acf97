/* train.cfg through libinih. libinih hands us one key at a time without its line number, so
 * the file is fed to ini_parse_stream() by our own reader, one line per call: the reader knows
 * the line of every key the handler sees, checks section headers itself (so an empty unknown
 * section is still an error) and strips leading blanks (libinih would otherwise take an
 * indented line as the continuation of the previous value). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "errmsg.h"
#include "fsutil.h"
#include "traincfg.h"
#include "banned.h"

/* A train.cfg is a page of text; anything this large is not one. */
#define TRAINCFG_FILE_MAX (1024 * 1024)
/* libinih's line buffer (INI_MAX_LINE, built in) holds 200 bytes with the newline and NUL;
 * the reader refuses longer lines rather than let libinih cut them in two. */
#define TRAINCFG_LINE_MAX 197

#define OFF(field) offsetof(struct traincfg, field)

static const char *const device_names[] = {"cpu", "cuda", NULL};
static const char *const dtype_names[] = {"bf16", "fp32", NULL};
static const char *const attention_names[] = {"auto", "cudnn", "own", NULL};

/* The rows. Defaults follow llm.c and nanoGPT's GPT-2 runs where they have one; the model's
 * shape defaults to GPT-2 small with the byte-level vocabulary of `gpurun-train prep`. */
static const struct traincfg_key keys[] = {
    {"job", "nodes", TRAINCFG_INT, OFF(nodes), "1", 1, 100000, NULL, "nodes of the job"},
    {"job", "gpus_per_node", TRAINCFG_INT, OFF(gpus_per_node), "1", 1, 1024, NULL,
     "ranks per node, one per GPU"},
    {"job", "time", TRAINCFG_TIME, OFF(time_min), NULL, 0, 0, NULL,
     "time limit: MINUTES, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]"},
    {"job", "partition", TRAINCFG_STRING, OFF(partition), NULL, 0, 0, NULL, "Slurm partition"},
    {"job", "account", TRAINCFG_STRING, OFF(account), NULL, 0, 0, NULL, "Slurm account"},
    {"job", "job_name", TRAINCFG_STRING, OFF(job_name), NULL, 0, 0, NULL, "Slurm job name"},
    {"job", "output", TRAINCFG_STRING, OFF(output), NULL, 0, 0, NULL,
     "batch output file pattern (sbatch --output)"},
    {"job", "max_restarts", TRAINCFG_INT, OFF(max_restarts), "0", 0, 1000, NULL,
     "restarts from the last checkpoint after a failure"},

    {"model", "n_layer", TRAINCFG_INT, OFF(n_layer), "12", 1, 1024, NULL, "transformer blocks"},
    {"model", "n_head", TRAINCFG_INT, OFF(n_head), "12", 1, 1024, NULL, "attention heads"},
    {"model", "n_embd", TRAINCFG_INT, OFF(n_embd), "768", 1, 65536, NULL, "channels"},
    {"model", "seq_len", TRAINCFG_INT, OFF(seq_len), "1024", 1, 65536, NULL,
     "context length in tokens"},
    {"model", "vocab_size", TRAINCFG_INT, OFF(vocab_size), "256", 1, 65536, NULL,
     "vocabulary (256: byte-level; 50257: GPT-2)"},
    {"model", "init_from", TRAINCFG_PATH, OFF(init_from), NULL, 0, 0, NULL,
     "llm.c GPT-2 checkpoint to start from"},

    {"data", "train", TRAINCFG_PATHLIST, OFF(train), NULL, 0, 0, NULL,
     "training shards: paths or globs, comma-separated"},
    {"data", "val", TRAINCFG_PATHLIST, OFF(val), NULL, 0, 0, NULL,
     "validation shards: paths or globs, comma-separated"},

    {"optim", "lr", TRAINCFG_FLOAT, OFF(lr), "6e-4", 0, 10, NULL, "peak learning rate"},
    {"optim", "min_lr", TRAINCFG_FLOAT, OFF(min_lr), "0", 0, 10, NULL,
     "learning rate at the end of the cosine decay"},
    {"optim", "warmup_steps", TRAINCFG_INT, OFF(warmup_steps), "0", 0, 1000000000, NULL,
     "linear warmup steps"},
    {"optim", "weight_decay", TRAINCFG_FLOAT, OFF(weight_decay), "0.1", 0, 10, NULL,
     "AdamW decoupled weight decay (2D weights only)"},
    {"optim", "beta1", TRAINCFG_FLOAT, OFF(beta1), "0.9", 0, 1, NULL, "AdamW beta1, below 1"},
    {"optim", "beta2", TRAINCFG_FLOAT, OFF(beta2), "0.95", 0, 1, NULL, "AdamW beta2, below 1"},
    {"optim", "eps", TRAINCFG_FLOAT, OFF(eps), "1e-8", 0, 1, NULL, "AdamW epsilon"},
    {"optim", "grad_clip", TRAINCFG_FLOAT, OFF(grad_clip), "1.0", 0, 1e6, NULL,
     "clip the global gradient norm to this; 0: off"},

    {"train", "batch_size", TRAINCFG_INT, OFF(batch_size), "4", 1, 65536, NULL,
     "sequences per rank per micro-step"},
    {"train", "grad_accum", TRAINCFG_INT, OFF(grad_accum), "1", 1, 65536, NULL,
     "micro-steps per optimizer step"},
    {"train", "steps", TRAINCFG_INT, OFF(steps), "1000", 1, 1000000000, NULL, "optimizer steps"},
    {"train", "eval_every", TRAINCFG_INT, OFF(eval_every), "100", 0, 1000000000, NULL,
     "steps between validations; 0: at the end only"},
    {"train", "eval_batches", TRAINCFG_INT, OFF(eval_batches), "20", 1, 1000000, NULL,
     "validation batches per evaluation"},
    {"train", "ckpt_every", TRAINCFG_INT, OFF(ckpt_every), "0", 0, 1000000000, NULL,
     "steps between checkpoints; 0: at the end and on signals only"},
    {"train", "mem_ckpt_every", TRAINCFG_INT, OFF(mem_ckpt_every), "100", 0, 1000000000, NULL,
     "steps between memory checkpoints under gpurun (a restart's first source); 0: none"},
    {"train", "regroup", TRAINCFG_BOOL, OFF(regroup), "true", 0, 0, NULL,
     "under gpurun with a spare: the ranks of the nodes left keep running when a node is lost "
     "(cpu)"},
    {"train", "out_dir", TRAINCFG_PATH, OFF(out_dir), "out", 0, 0, NULL,
     "checkpoints and metrics.jsonl"},
    {"train", "resume", TRAINCFG_AUTOBOOL, OFF(resume), "auto", 0, 0, NULL,
     "auto: go on from out_dir's newest valid checkpoint if any; 1: must; 0: must not"},
    {"train", "seed", TRAINCFG_INT, OFF(seed), "1337", 0, INT_MAX, NULL, "random seed"},
    {"train", "device", TRAINCFG_ENUM, OFF(device), "cpu", 0, 0, device_names, "cpu or cuda"},
    {"train", "dtype", TRAINCFG_ENUM, OFF(dtype), "bf16", 0, 0, dtype_names,
     "cuda's parameters and activations: bf16 (fp32 master weights) or fp32"},
    {"train", "attention", TRAINCFG_ENUM, OFF(attention), "auto", 0, 0, attention_names,
     "cuda bf16 attention: auto (cuDNN's fused flash attention, else own kernels), cudnn, own"},
    {"train", "cuda_graphs", TRAINCFG_BOOL, OFF(cuda_graphs), "true", 0, 0, NULL,
     "cuda: launch each micro-step's kernels as one CUDA graph"},
    {"train", "zero", TRAINCFG_INT, OFF(zero), "0", 0, 1, NULL,
     "1: ZeRO-1, the optimizer state sharded over the ranks (cuda)"},
    {"train", "threads", TRAINCFG_INT, OFF(threads), "0", 0, 4096, NULL,
     "OpenMP threads per rank; 0: OMP_NUM_THREADS"},
    {"train", "sample_every", TRAINCFG_INT, OFF(sample_every), "0", 0, 1000000000, NULL,
     "steps between text samples; 0: at the end only"},
    {"train", "sample_tokens", TRAINCFG_INT, OFF(sample_tokens), "64", 0, 65536, NULL,
     "tokens per sample; 0: none"},
    {"train", "log_every", TRAINCFG_INT, OFF(log_every), "1", 1, 1000000000, NULL,
     "steps between printed progress lines"},
    {"train", "coll_timeout_s", TRAINCFG_INT, OFF(coll_timeout_s), "600", 1, 86400, NULL,
     "seconds a collective waits for a silent peer before the run fails"},
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))
_Static_assert(NKEYS <= TRAINCFG_MAX_KEYS, "raise TRAINCFG_MAX_KEYS");

static const char *const sections[] = {"job", "model", "data", "optim", "train"};
#define NSECTIONS (sizeof(sections) / sizeof(sections[0]))

const struct traincfg_key *traincfg_keys(size_t *n)
{
    *n = NKEYS;
    return keys;
}

static void *field(const struct traincfg *cfg, const struct traincfg_key *k)
{
    return (char *)cfg + k->offset;
}

static bool is_string_type(enum traincfg_type t)
{
    return t == TRAINCFG_STRING || t == TRAINCFG_PATH || t == TRAINCFG_PATHLIST;
}

static const struct traincfg_key *find_key(const char *section, const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static bool known_section(const char *name, size_t len)
{
    for (size_t i = 0; i < NSECTIONS; i++)
        if (strlen(sections[i]) == len && !strncmp(sections[i], name, len))
            return true;
    return false;
}

/* --- values --------------------------------------------------------------------------------- */

int traincfg_parse_time(const char *s, int *minutes)
{
    long long f[4] = {0};
    long long days = 0, total_s;
    int nf = 0;
    const char *p = s;
    bool has_days = false;

    if (!*p)
        return -EINVAL;
    /* D-... */
    if (strchr(p, '-')) {
        char *end;
        if (!isdigit((unsigned char)*p))
            return -EINVAL;
        errno = 0;
        days = strtoll(p, &end, 10);
        if (*end != '-' || errno)
            return -EINVAL;
        has_days = true;
        p = end + 1;
    }
    for (;;) {
        char *end;
        if (nf == 3 || !isdigit((unsigned char)*p))
            return -EINVAL;
        errno = 0;
        f[nf++] = strtoll(p, &end, 10);
        if (errno)
            return -ERANGE;
        if (*end == '\0')
            break;
        if (*end != ':')
            return -EINVAL;
        p = end + 1;
    }
    if (has_days) {
        /* D-HH, D-HH:MM, D-HH:MM:SS */
        long long h = f[0], m = nf > 1 ? f[1] : 0, sec = nf > 2 ? f[2] : 0;
        if (days > INT_MAX || h > INT_MAX || m > INT_MAX || sec > INT_MAX)
            return -ERANGE;
        total_s = ((days * 24 + h) * 60 + m) * 60 + sec;
    } else if (nf == 1) {
        if (f[0] > INT_MAX)
            return -ERANGE;
        total_s = f[0] * 60;
    } else if (nf == 2) {
        if (f[0] > INT_MAX || f[1] > INT_MAX)
            return -ERANGE;
        total_s = f[0] * 60 + f[1];
    } else {
        if (f[0] > INT_MAX || f[1] > INT_MAX || f[2] > INT_MAX)
            return -ERANGE;
        total_s = (f[0] * 60 + f[1]) * 60 + f[2];
    }
    if ((total_s + 59) / 60 > INT_MAX)
        return -ERANGE;
    *minutes = (int)((total_s + 59) / 60);
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};

    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(s, no[i])) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

/* The directory part of path, "" when it has none. */
static size_t dir_len(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? (size_t)(slash - path) + 1 : 0;
}

/* value made relative to the first dlen bytes of dir (which end in '/'); a comma-separated
 * list has each element resolved when list is set. Returns a new string or NULL. */
static char *resolve_paths(const char *value, const char *dir, size_t dlen, bool list)
{
    size_t cap = strlen(value) + dlen + 1, n = 0;
    char *out;
    const char *p = value;

    /* At most every element gets dir in front. */
    for (const char *c = value; *c; c++)
        if (*c == ',')
            cap += dlen;
    out = malloc(cap);
    if (!out)
        return NULL;
    for (;;) {
        size_t len = list ? strcspn(p, ",") : strlen(p);
        const char *e = p + len;
        while (p < e && isspace((unsigned char)*p))
            p++;
        while (e > p && isspace((unsigned char)e[-1]))
            e--;
        if (e > p && *p != '/' && dlen > 0) {
            memcpy(out + n, dir, dlen);
            n += dlen;
        }
        memcpy(out + n, p, (size_t)(e - p));
        n += (size_t)(e - p);
        p += strcspn(p, list ? "," : "");
        if (!list || *p != ',')
            break;
        out[n++] = ',';
        p++;
    }
    out[n] = '\0';
    return out;
}

/* "FILE:LINE" or "command line" for origin; buf must hold PATH_MAX + 16 bytes. */
static const char *where(const struct traincfg *cfg, int origin, char *buf, size_t len)
{
    if (origin == TRAINCFG_FROM_CMDLINE)
        return "command line";
    if (origin > 0)
        snprintf(buf, len, "%s:%d", cfg->path ? cfg->path : "(file)", origin);
    else
        snprintf(buf, len, "%s", cfg->path ? cfg->path : "defaults");
    return buf;
}

/* Stores value (borrowed) into k's field of cfg; origin says where it came from. dir/dlen:
 * what a relative path is resolved against (dlen 0: nothing). */
static int set_value(struct traincfg *cfg, const struct traincfg_key *k, const char *value,
                     int origin, const char *dir, size_t dlen, struct errmsg *err)
{
    char wbuf[PATH_MAX + 16];
    const char *at = where(cfg, origin, wbuf, sizeof(wbuf));
    void *f = field(cfg, k);

    switch (k->type) {
    case TRAINCFG_INT: {
        char *end;
        long long x;
        errno = 0;
        x = strtoll(value, &end, 10);
        if (!*value || *end || isspace((unsigned char)*value))
            return errmsg_set(err, -EINVAL, "%s: '%s.%s': '%s' is not an integer", at, k->section,
                              k->name, value);
        if (errno || x < (long long)k->min || x > (long long)k->max)
            return errmsg_set(err, -EINVAL, "%s: '%s.%s': %s is out of range %.0f..%.0f", at,
                              k->section, k->name, value, k->min, k->max);
        *(int *)f = (int)x;
        break;
    }
    case TRAINCFG_FLOAT: {
        char *end;
        double x;
        errno = 0;
        x = strtod(value, &end);
        if (!*value || *end || isspace((unsigned char)*value) || !isfinite(x))
            return errmsg_set(err, -EINVAL, "%s: '%s.%s': '%s' is not a number", at, k->section,
                              k->name, value);
        if (x < k->min || x > k->max)
            return errmsg_set(err, -EINVAL, "%s: '%s.%s': %s is out of range %g..%g", at,
                              k->section, k->name, value, k->min, k->max);
        *(double *)f = x;
        break;
    }
    case TRAINCFG_BOOL:
        if (parse_bool(value, (bool *)f) < 0)
            return errmsg_set(
                err, -EINVAL,
                "%s: '%s.%s': '%s' is not a boolean (true/false, yes/no, on/off, 1/0)", at,
                k->section, k->name, value);
        break;
    case TRAINCFG_AUTOBOOL: {
        bool b;
        if (!strcasecmp(value, "auto")) {
            *(int *)f = TRAINCFG_AUTO;
        } else if (parse_bool(value, &b) == 0) {
            *(int *)f = b;
        } else {
            return errmsg_set(err, -EINVAL,
                              "%s: '%s.%s': '%s' is not auto or a boolean (true/false, yes/no, "
                              "on/off, 1/0)",
                              at, k->section, k->name, value);
        }
        break;
    }
    case TRAINCFG_ENUM: {
        char names[128] = "";
        size_t n = 0;
        for (int i = 0; k->choices[i]; i++) {
            if (!strcmp(k->choices[i], value)) {
                *(int *)f = i;
                goto done;
            }
            n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
                                  k->choices[i]);
            if (n >= sizeof(names))
                n = sizeof(names) - 1;
        }
        return errmsg_set(err, -EINVAL, "%s: '%s.%s': '%s' is not one of %s", at, k->section,
                          k->name, value, names);
    }
    case TRAINCFG_TIME: {
        int rc = traincfg_parse_time(value, (int *)f);
        if (rc == -ERANGE)
            return errmsg_set(err, -EINVAL, "%s: '%s.%s': '%s' is too long", at, k->section,
                              k->name, value);
        if (rc < 0)
            return errmsg_set(err, -EINVAL,
                              "%s: '%s.%s': '%s' is not a time (MINUTES, MM:SS, HH:MM:SS, "
                              "D-HH[:MM[:SS]])",
                              at, k->section, k->name, value);
        break;
    }
    case TRAINCFG_STRING:
    case TRAINCFG_PATH:
    case TRAINCFG_PATHLIST: {
        char **s = f;
        char *copy = NULL;
        /* An empty value unsets the key: "data.val=" turns validation off. */
        if (*value) {
            if (k->type == TRAINCFG_STRING)
                copy = strdup(value);
            else
                copy = resolve_paths(value, dir, dlen, k->type == TRAINCFG_PATHLIST);
            if (!copy)
                return -ENOMEM;
        }
        free(*s);
        *s = copy;
        break;
    }
    }
done:
    cfg->origin[k - keys] = origin;
    return 0;
}

/* --- init, release -------------------------------------------------------------------------- */

void traincfg_release(struct traincfg *cfg)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (is_string_type(keys[i].type))
            free(*(char **)field(cfg, &keys[i]));
    free(cfg->path);
    memset(cfg, 0, sizeof(*cfg));
}

int traincfg_init(struct traincfg *cfg)
{
    struct errmsg err;

    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < NKEYS; i++) {
        if (!keys[i].def)
            continue;
        /* The table's defaults are valid by construction (the unit tests load them all); only
         * memory can fail here. */
        if (set_value(cfg, &keys[i], keys[i].def, TRAINCFG_FROM_DEFAULT, NULL, 0, &err) < 0) {
            traincfg_release(cfg);
            return -ENOMEM;
        }
    }
    return 0;
}

/* --- the file --------------------------------------------------------------------------------- */

struct parse {
    struct traincfg *cfg;
    struct errmsg *err;
    const char *p, *end; /* the rest of the file's text */
    int line;            /* of the last line handed to libinih */
    int failed;          /* 0, or the negative errno of the first failure (err holds it) */
    size_t dlen;         /* directory part of cfg->path */
};

/* libinih's reader: the next line, leading blanks and an inline '#' comment removed; NULL at
 * the end or after the first failure (libinih then stops). */
static char *read_line(char *str, int num, void *stream)
{
    struct parse *ps = stream;
    const char *nl, *s, *e;
    size_t len;
    char wbuf[PATH_MAX + 16];

    if (ps->failed || ps->p >= ps->end)
        return NULL;
    ps->line++;
    nl = memchr(ps->p, '\n', (size_t)(ps->end - ps->p));
    e = nl ? nl : ps->end;
    s = ps->p;
    ps->p = nl ? nl + 1 : ps->end;
    if (memchr(s, '\0', (size_t)(e - s))) {
        ps->failed = errmsg_set(ps->err, -EINVAL, "%s: NUL byte in the line",
                                where(ps->cfg, ps->line, wbuf, sizeof(wbuf)));
        return NULL;
    }
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    /* '#' starts a comment at the start of a line or after a blank (libinih knows only ';'
     * inline), so "steps = 40  # short" means 40. */
    for (const char *c = s; c < e; c++)
        if (*c == '#' && (c == s || c[-1] == ' ' || c[-1] == '\t')) {
            e = c;
            break;
        }
    len = (size_t)(e - s);
    if (len > TRAINCFG_LINE_MAX || (int)len + 2 > num) {
        ps->failed = errmsg_set(ps->err, -EINVAL, "%s: line longer than %d characters",
                                where(ps->cfg, ps->line, wbuf, sizeof(wbuf)), TRAINCFG_LINE_MAX);
        return NULL;
    }
    if (len > 0 && *s == '[') {
        const char *close = memchr(s, ']', len);
        if (close && !known_section(s + 1, (size_t)(close - s - 1))) {
            ps->failed =
                errmsg_set(ps->err, -EINVAL, "%s: unknown section '%.*s'",
                           where(ps->cfg, ps->line, wbuf, sizeof(wbuf)), (int)(close - s + 1), s);
            return NULL;
        }
    }
    memcpy(str, s, len);
    str[len] = '\n';
    str[len + 1] = '\0';
    return str;
}

static int on_key(void *user, const char *section, const char *name, const char *value)
{
    struct parse *ps = user;
    const struct traincfg_key *k;
    char wbuf[PATH_MAX + 16];
    const char *at;
    int rc;

    if (ps->failed)
        return 0;
    at = where(ps->cfg, ps->line, wbuf, sizeof(wbuf));
    if (!*section) {
        ps->failed = errmsg_set(ps->err, -EINVAL, "%s: '%s' is outside any section", at, name);
        return 0;
    }
    k = find_key(section, name);
    if (!k) {
        ps->failed = errmsg_set(ps->err, -EINVAL, "%s: '%s.%s': unknown key", at, section, name);
        return 0;
    }
    if (ps->cfg->origin[k - keys] > 0) {
        ps->failed = errmsg_set(ps->err, -EINVAL, "%s: '%s.%s': given twice (first on line %d)", at,
                                section, name, ps->cfg->origin[k - keys]);
        return 0;
    }
    rc = set_value(ps->cfg, k, value, ps->line, ps->cfg->path, ps->dlen, ps->err);
    if (rc < 0) {
        if (rc == -ENOMEM)
            errmsg_set(ps->err, -EINVAL, "%s: out of memory", at);
        ps->failed = rc;
        return 0;
    }
    return 1;
}

int traincfg_load(struct traincfg *cfg, const char *path, struct errmsg *err)
{
    struct parse ps = {.cfg = cfg, .err = err};
    char *text = NULL;
    size_t len;
    int ret, rc;

    ret = fs_read_all(path, TRAINCFG_FILE_MAX, &text, &len);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot read '%s': %s", path,
                   ret == -EFBIG ? "larger than 1 MiB, not a train.cfg" : strerror(-ret));
        goto out;
    }
    free(cfg->path);
    cfg->path = strdup(path);
    if (!cfg->path) {
        ret = errmsg_set(err, -ENOMEM, "cannot read '%s': out of memory", path);
        goto out;
    }
    ps.p = text;
    ps.end = text + len;
    ps.dlen = dir_len(path);
    rc = ini_parse_stream(read_line, &ps, on_key, &ps);
    /* libinih goes on past a line it cannot parse and reports the first; the reader stops at
     * ours. Whichever came first is the one to report. */
    if (rc > 0 && (!ps.failed || rc < ps.line)) {
        char wbuf[PATH_MAX + 16];
        ret = errmsg_set(err, -EINVAL, "%s: expected '[section]' or 'key = value'",
                         where(cfg, rc, wbuf, sizeof(wbuf)));
        goto out;
    }
    if (ps.failed) {
        ret = ps.failed;
        goto out;
    }
    if (rc < 0) {
        ret = errmsg_set(err, -ENOMEM, "cannot parse '%s': out of memory", path);
        goto out;
    }
    ret = 0;
out:
    free(text);
    return ret;
}

/* --- overrides ------------------------------------------------------------------------------ */

bool traincfg_is_override(const char *arg)
{
    const char *eq = strchr(arg, '=');
    const char *dot = memchr(arg, '.', eq ? (size_t)(eq - arg) : 0);

    if (!eq || !dot || dot == arg || dot + 1 == eq)
        return false;
    for (const char *c = arg; c < eq; c++)
        if (c != dot && !(islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_'))
            return false;
    return true;
}

int traincfg_override(struct traincfg *cfg, const char *arg, struct errmsg *err)
{
    const char *eq = strchr(arg, '=');
    const char *dot = memchr(arg, '.', eq ? (size_t)(eq - arg) : 0);
    const struct traincfg_key *k;
    char section[64], name[64];
    int rc;

    if (!eq || !dot)
        return errmsg_set(err, -EINVAL, "command line: '%s': expected section.key=value", arg);
    if ((size_t)(dot - arg) >= sizeof(section) || (size_t)(eq - dot - 1) >= sizeof(name))
        return errmsg_set(err, -EINVAL, "command line: '%.*s': unknown key", (int)(eq - arg), arg);
    snprintf(section, sizeof(section), "%.*s", (int)(dot - arg), arg);
    snprintf(name, sizeof(name), "%.*s", (int)(eq - dot - 1), dot + 1);
    k = find_key(section, name);
    if (!k)
        return errmsg_set(err, -EINVAL, "command line: '%s.%s': unknown key", section, name);
    rc = set_value(cfg, k, eq + 1, TRAINCFG_FROM_CMDLINE, NULL, 0, err);
    if (rc == -ENOMEM)
        errmsg_set(err, -EINVAL, "command line: '%s': out of memory", arg);
    return rc;
}

/* --- checks between keys ---------------------------------------------------------------------- */

static int origin_of(const struct traincfg *cfg, const char *section, const char *name)
{
    const struct traincfg_key *k = find_key(section, name);
    return cfg->origin[k - keys];
}

/* Of two origins, the one set last: an override beats the file, a later line an earlier one,
 * anything beats a default. */
static int later(int a, int b)
{
    if (a == TRAINCFG_FROM_CMDLINE || b == TRAINCFG_FROM_CMDLINE)
        return TRAINCFG_FROM_CMDLINE;
    return a > b ? a : b;
}

int traincfg_check(const struct traincfg *cfg, struct errmsg *err)
{
    char wbuf[PATH_MAX + 16];
    int o;

    if (cfg->n_embd % cfg->n_head) {
        o = later(origin_of(cfg, "model", "n_head"), origin_of(cfg, "model", "n_embd"));
        return errmsg_set(err, -EINVAL, "%s: n_head (%d) must divide n_embd (%d)",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->n_head, cfg->n_embd);
    }
    if (cfg->min_lr > cfg->lr) {
        o = later(origin_of(cfg, "optim", "min_lr"), origin_of(cfg, "optim", "lr"));
        return errmsg_set(err, -EINVAL, "%s: min_lr (%g) must not exceed lr (%g)",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->min_lr, cfg->lr);
    }
    if (cfg->beta1 >= 1.0) {
        o = origin_of(cfg, "optim", "beta1");
        return errmsg_set(err, -EINVAL, "%s: beta1 (%g) must be below 1",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->beta1);
    }
    if (cfg->beta2 >= 1.0) {
        o = origin_of(cfg, "optim", "beta2");
        return errmsg_set(err, -EINVAL, "%s: beta2 (%g) must be below 1",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->beta2);
    }
    if (cfg->eps <= 0.0) {
        /* A zero epsilon divides by zero where a gradient has always been zero. */
        o = origin_of(cfg, "optim", "eps");
        return errmsg_set(err, -EINVAL, "%s: eps (%g) must be above 0",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->eps);
    }
    if ((long long)cfg->batch_size * cfg->seq_len > INT_MAX) {
        o = later(origin_of(cfg, "train", "batch_size"), origin_of(cfg, "model", "seq_len"));
        return errmsg_set(err, -EINVAL, "%s: batch_size (%d) times seq_len (%d) is too large",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->batch_size, cfg->seq_len);
    }
    if (cfg->vocab_size > 65536) {
        /* Unreachable through the table's range; kept beside the reason: tokens are uint16. */
        o = origin_of(cfg, "model", "vocab_size");
        return errmsg_set(err, -EINVAL, "%s: vocab_size (%d) must fit uint16 tokens",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->vocab_size);
    }
    /* The cpu backend computes in fp32 and keeps all of AdamW's state on every rank: the
     * cuda-only keys are refused rather than ignored. dtype's default is the cuda backend's,
     * so only an explicit bf16 is an error. */
    if (cfg->device == TRAINCFG_DEVICE_CPU && cfg->dtype == TRAINCFG_DTYPE_BF16 &&
        origin_of(cfg, "train", "dtype") != TRAINCFG_FROM_DEFAULT) {
        o = later(origin_of(cfg, "train", "dtype"), origin_of(cfg, "train", "device"));
        return errmsg_set(err, -EINVAL,
                          "%s: dtype 'bf16' needs device 'cuda' (the cpu backend computes in fp32)",
                          where(cfg, o, wbuf, sizeof(wbuf)));
    }
    if (cfg->device == TRAINCFG_DEVICE_CPU && cfg->zero) {
        o = later(origin_of(cfg, "train", "zero"), origin_of(cfg, "train", "device"));
        return errmsg_set(err, -EINVAL,
                          "%s: zero (%d) needs device 'cuda' (ZeRO-1 shards the cuda backend's "
                          "optimizer state)",
                          where(cfg, o, wbuf, sizeof(wbuf)), cfg->zero);
    }
    if ((cfg->device == TRAINCFG_DEVICE_CPU || cfg->dtype == TRAINCFG_DTYPE_FP32) &&
        cfg->attention != TRAINCFG_ATTENTION_AUTO) {
        o = later(origin_of(cfg, "train", "attention"), cfg->device == TRAINCFG_DEVICE_CPU
                                                            ? origin_of(cfg, "train", "device")
                                                            : origin_of(cfg, "train", "dtype"));
        return errmsg_set(err, -EINVAL,
                          "%s: attention '%s' needs device 'cuda' and dtype 'bf16' (the choice is "
                          "between bf16 attentions)",
                          where(cfg, o, wbuf, sizeof(wbuf)), attention_names[cfg->attention]);
    }
    if (!cfg->train)
        return errmsg_set(err, -EINVAL, "%s: [data] train is not set",
                          cfg->path ? cfg->path : "command line");
    return 0;
}

int traincfg_read(struct traincfg *cfg, const char *path, const char *const *overrides, size_t n,
                  struct errmsg *err)
{
    int ret = traincfg_init(cfg);

    if (ret < 0)
        return errmsg_set(err, ret, "out of memory");
    if (path) {
        ret = traincfg_load(cfg, path, err);
        if (ret < 0)
            goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ret = traincfg_override(cfg, overrides[i], err);
        if (ret < 0)
            goto out;
    }
    ret = traincfg_check(cfg, err);
    if (ret == 0 && cfg->device == TRAINCFG_DEVICE_CPU)
        cfg->dtype = TRAINCFG_DTYPE_FP32;
out:
    if (ret < 0)
        traincfg_release(cfg);
    return ret;
}

/* --- JSON ------------------------------------------------------------------------------------- */

static json_t *key_json(const struct traincfg *cfg, const struct traincfg_key *k)
{
    const void *f = field(cfg, k);

    switch (k->type) {
    case TRAINCFG_INT:
    case TRAINCFG_TIME:
        return json_integer(*(const int *)f);
    case TRAINCFG_FLOAT:
        return json_real(*(const double *)f);
    case TRAINCFG_BOOL:
        return json_boolean(*(const bool *)f);
    case TRAINCFG_AUTOBOOL:
        if (*(const int *)f == TRAINCFG_AUTO)
            return json_string("auto");
        return json_boolean(*(const int *)f);
    case TRAINCFG_ENUM:
        return json_string(k->choices[*(const int *)f]);
    case TRAINCFG_STRING:
    case TRAINCFG_PATH:
    case TRAINCFG_PATHLIST: {
        const char *s = *(char *const *)f;
        json_t *j;
        if (!s)
            return json_null();
        /* JSON holds only UTF-8: a path that is not is named so rather than dropped. */
        j = json_string(s);
        return j ? j : json_string("(not UTF-8)");
    }
    }
    return NULL;
}

json_t *traincfg_to_json(const struct traincfg *cfg)
{
    json_t *root = json_object();

    if (!root)
        return NULL;
    for (size_t s = 0; s < NSECTIONS; s++) {
        json_t *sec = json_object();
        if (!sec || json_object_set_new(root, sections[s], sec) < 0)
            goto fail;
        for (size_t i = 0; i < NKEYS; i++) {
            if (strcmp(keys[i].section, sections[s]))
                continue;
            if (json_object_set_new(sec, keys[i].name, key_json(cfg, &keys[i])) < 0)
                goto fail;
        }
    }
    if (cfg->path && json_object_set_new(root, "file", json_string(cfg->path)) < 0)
        goto fail;
    return root;
fail:
    json_decref(root);
    return NULL;
}
