/* The values of Slurm's job options, read as sbatch reads them: the parsers and checks that
 * gpurun's command line (args.c) and a batch script read back (sbatch.c) share, and the types
 * they fill. Pure: no libslurm, no I/O. */
#ifndef GPURUN_CLIENT_SLURMOPT_H
#define GPURUN_CLIENT_SLURMOPT_H

#include <stdbool.h>
#include <stddef.h>

#include "errmsg.h"

/* Which memory option a job gives: sbatch's --mem, --mem-per-cpu and --mem-per-gpu exclude
 * each other. */
enum slurmopt_mem_per { SLURMOPT_MEM_NONE, SLURMOPT_MEM_NODE, SLURMOPT_MEM_CPU, SLURMOPT_MEM_GPU };

/* --exclusive[=user|mcs]: whom the job's nodes may be shared with. */
enum slurmopt_exclusive {
    SLURMOPT_SHARED_DEFAULT, /* the partition's OverSubscribe decides */
    SLURMOPT_EXCLUSIVE,      /* nobody */
    SLURMOPT_EXCLUSIVE_USER, /* the user's own jobs */
    SLURMOPT_EXCLUSIVE_MCS,  /* jobs of the same MCS label */
};

/* --mail-type's bits, Slurm's MAIL_* values (slurmlib.c checks them against slurm.h). */
#define SLURMOPT_MAIL_BEGIN          (1u << 0)
#define SLURMOPT_MAIL_END            (1u << 1)
#define SLURMOPT_MAIL_FAIL           (1u << 2)
#define SLURMOPT_MAIL_REQUEUE        (1u << 3)
#define SLURMOPT_MAIL_TIME100        (1u << 4)
#define SLURMOPT_MAIL_TIME90         (1u << 5)
#define SLURMOPT_MAIL_TIME80         (1u << 6)
#define SLURMOPT_MAIL_TIME50         (1u << 7)
#define SLURMOPT_MAIL_STAGE_OUT      (1u << 8)
#define SLURMOPT_MAIL_ARRAY_TASKS    (1u << 9)
#define SLURMOPT_MAIL_INVALID_DEPEND (1u << 10)

/* The most a --signal's number may be: SIGRTMAX on Linux, the top of jobspec's range. */
#define SLURMOPT_SIGNAL_MAX 64

/* The TIME of a --signal without "@TIME": sbatch's default, a minute before the limit. */
#define SLURMOPT_SIGNAL_TIME_DEFAULT 60

/* --signal=[{R|B}:]SIG[@TIME], sbatch's option with sbatch's meaning: SIG is sent TIME
 * seconds before the job's time limit. What Slurm is told comes from these fields. */
struct slurmopt_signal {
    const char *text; /* the value as given (borrowed); NULL: no --signal */
    int sig;          /* SIG as a number, 1..SLURMOPT_SIGNAL_MAX; 0 without --signal */
    int time_s;       /* TIME in seconds, 0..65535; SLURMOPT_SIGNAL_TIME_DEFAULT when not given */
    bool batch_only;  /* "B:": Slurm signals only the batch shell, none of the job steps (the
                       * shell is gpurun's batch script, which passes it on to the daemons) */
    bool reservation; /* "R:": the job may overlap a reservation with MaxStartDelay set */
};

/* A failure below that has a struct errmsg of the caller's fills it with one line of what is
 * wrong. */

/* Parses a Slurm time limit ("minutes", "minutes:seconds", "hours:minutes:seconds",
 * "days-hours", "days-hours:minutes", "days-hours:minutes:seconds", or "UNLIMITED") into
 * seconds: 0 for no limit (UNLIMITED, INFINITE, or a time of 0, as sbatch reads "0").
 * Returns 0, -EINVAL for what is not a time, or -ERANGE for one over 365 days. */
int slurmopt_parse_time(const char *s, long *seconds);

/* Parses a --signal value, "[{R|B}:]SIG[@TIME]" as sbatch takes it: flags R, B, RB or BR
 * (either case) before a ':', SIG a number 1..SLURMOPT_SIGNAL_MAX or a name with or without
 * "SIG" (either case: USR1, SIGUSR1, usr1), TIME 0..65535 seconds (default
 * SLURMOPT_SIGNAL_TIME_DEFAULT). Fills sig (text set to s, borrowed). Returns 0, or -EINVAL
 * with err filled ("--signal: ..."). */
int slurmopt_parse_signal(const char *s, struct slurmopt_signal *sig, struct errmsg *err);

/* Parses a memory size as sbatch does: a whole number with an optional unit K, M, G or T
 * (either case, a 'B' may follow), M by default; K rounds up to whole MiB. Returns 0 with
 * *mb, -EINVAL (not a size) or -ERANGE (too large). */
int slurmopt_parse_mem(const char *s, unsigned long long *mb);

/* Writes mb as the largest unit that holds it whole ("64G", "1536M") into buf (n bytes). */
void slurmopt_format_mem(char *buf, size_t n, unsigned long long mb);

/* Parses --mail-type: a comma-separated list of sbatch's words (NONE, BEGIN, END, FAIL,
 * REQUEUE, ALL, INVALID_DEPEND, STAGE_OUT, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80,
 * TIME_LIMIT_50, ARRAY_TASKS; either case). Returns the SLURMOPT_MAIL_* bits (0 for NONE), or
 * -EINVAL with *bad (n bytes) holding the first word that is none of them. */
int slurmopt_parse_mail_type(const char *s, char *bad, size_t n);

/* Checks a --dependency value's syntax as slurmctld reads it: "singleton", or
 * TYPE:ID[:ID...] with TYPE after, afterany, afterburstbuffer, aftercorr, afternotok or
 * afterok, ID a job id (with _TASK for an array task, and "+MINUTES" for after), the items
 * joined by ',' (all of them) or '?' (any of them), not both. Returns 0 or -EINVAL with why
 * (the caller's) saying what is wrong. */
int slurmopt_check_dependency(const char *s, struct errmsg *why);

/* The longest --gres taken: dozens of items; with "gres:" before each and the GPUs it fits
 * 4 * SLURMOPT_GRES_LEN_MAX bytes. */
#define SLURMOPT_GRES_LEN_MAX 256

/* Checks a --gres value: "name[:type][:count]" items joined by ',', none of them "gpu" (the
 * GPUs are --gpus-per-node's), SLURMOPT_GRES_LEN_MAX bytes at most. Returns 0 or -EINVAL with
 * why (the caller's) filled. */
int slurmopt_check_gres(const char *s, struct errmsg *why);

/* The longest GPU type taken from --gres gpu:TYPE:N ("a100", "h100_80gb"...). */
#define SLURMOPT_GPU_TYPE_MAX 63

/* sbatch's habit of asking for GPUs by --gres: s's "gpu[:TYPE][:N]" item ("gres:" or "gres/"
 * before it too; N 1 when left out) taken out of the list, its N into *gpus (0: s has no GPU
 * item) and its TYPE into type (tn bytes; "" for none), the other items into rest (rn bytes,
 * at least SLURMOPT_GRES_LEN_MAX + 1; "" for none), unchecked (slurmopt_check_gres). Returns 0 or
 * -EINVAL with why filled: two GPU items, an N that is not a whole number from 1 to 1024, a
 * TYPE longer than SLURMOPT_GPU_TYPE_MAX or with other than letters, digits, '_', '-', '.'. */
int slurmopt_split_gres(const char *s, int *gpus, char *type, size_t tn, char *rest, size_t rn,
                        struct errmsg *why);

#endif
