/* The command line as tables: one row per subcommand, one row per option with its kind, the
 * field it fills, its range and the subcommands that take it, and one row per torchrun
 * spelling (an alias of an option, or a refusal). Help is generated from the same rows, so
 * an option cannot exist without its help line. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "args.h"
#include "slurmopt.h"
#include "horovod.h"
#include "traincfg.h"
#include "banned.h"

struct cmd_row {
    const char *name;
    const char *hint; /* where a refused command line should look */
    const char *usage;
    const char *summary;
    const char *brief; /* one line for gpurun's list of subcommands (NULL: not listed) */
};

static const struct cmd_row cmds[CMD_COUNT] = {
    [CMD_RUN] = {"gpurun", "gpurun --help",
                 "gpurun [options] (train.cfg [section.key=value...] | SCRIPT.py [ARGS...] | "
                 "-- CMD [ARGS...])",
                 "Runs CMD (or gpurun-train with the train.cfg, or \"PYTHON SCRIPT.py ARGS\")\n"
                 "as every rank of a distributed job, with RANK, WORLD_SIZE, MASTER_ADDR and\n"
                 "the rest of torch's env:// variables set. Each node finds CMD on its PATH.\n"
                 "PYTHON is --python's, else $VIRTUAL_ENV/bin/python in a venv, else python3\n"
                 "on each node's PATH; a first word after '--' ending in .py is a SCRIPT.py\n"
                 "too. As with torchrun, every word after SCRIPT.py is the script's, even\n"
                 "one that starts with '-'. Submits the job to Slurm through libslurm and\n"
                 "prints \"Submitted job ID\"; --wait stays until it ends. With --local the\n"
                 "job runs on this machine (one rendezvousd per node, all on loopback) and\n"
                 "gpurun says \"gpurun: job ID, job dir DIR\" on stderr as it starts. A\n"
                 "train.cfg's [job] keys (nodes, gpus_per_node, time, partition, account,\n"
                 "job_name, output, max_restarts) apply where no option is given. The job's\n"
                 "name is -J's, else the train.cfg's job_name or its file name without .cfg,\n"
                 "else the file name of the first word ending in .py, else the command's."},
    [CMD_STATUS] = {"status", "gpurun status --help",
                    "gpurun status [JOBID | --job-dir DIR] [--json] [--watch]",
                    "Slurm's view of the job (state, reason while pending, nodes, elapsed, time\n"
                    "limit) and, while it runs, its leader's live view: every rank's phase,\n"
                    "step, loss and tokens/s, and a progress bar. After the job has ended,\n"
                    "its summary: outcome, first failure, phase timings. Without a JOBID:\n"
                    "your 20 most recent gpurun jobs, one per line (--all: every one). The\n"
                    "--json layout is documented in README.md (\"gpurun status --json\") and\n"
                    "only grows.",
                    "a job's state, live per-rank view or summary; or the list of jobs"},
    [CMD_LOGS] = {"logs", "gpurun logs --help",
                  "gpurun logs [JOBID | --job-dir DIR] [--rank R] [-f]",
                  "Prints the job's rank logs: every rank's lines prefixed \"[R] \", in the\n"
                  "order they were written on any node, or one rank's log as it was written.\n"
                  "-f keeps printing until the job ends. Without a JOBID, the newest job's.",
                  "a job's rank logs, merged in time order or one rank's"},
    [CMD_CANCEL] = {"cancel", "gpurun cancel --help", "gpurun cancel JOBID",
                    "Cancels a job: a Slurm job through slurm_kill_job (every node's\n"
                    "rendezvousd tears its ranks down: SIGTERM, then SIGKILL), a local one by\n"
                    "SIGTERM to its leader. Returns once the job's processes are gone, and\n"
                    "says \"gpurun: job ID cancelled\".",
                    "ends a job and waits until its processes are gone"},
    [CMD_CLEAN] = {"clean", "gpurun clean --help", "gpurun clean [--older-than DAYS] [--dry-run]",
                   "Removes the job dirs of ended jobs from the jobs root ($GPURUN_JOBS, else\n"
                   "~/.gpurun/jobs), with their batch output (ID.out): a job that is pending\n"
                   "or running, or whose state cannot be known, is kept. A --job-dir outside\n"
                   "the root is never removed; its link in the root goes once it is gone.\n"
                   "Prints each dir and the space freed.",
                   "removes the job dirs of ended jobs"},
    [CMD_HELP] = {"help", "gpurun help --help", "gpurun help [SUBCOMMAND]",
                  "Prints gpurun's help, or with SUBCOMMAND that subcommand's (the same as\n"
                  "'gpurun SUBCOMMAND --help').",
                  "gpurun's help, or a subcommand's"},
    [CMD_RERUN] = {"rerun", "gpurun rerun --help", "gpurun rerun (JOBID | --job-dir DIR) [--wait]",
                   "Submits an ended Slurm job again: the batch script it ran, which its job\n"
                   "dir keeps as job.sbatch, with the same #SBATCH directives, through\n"
                   "libslurm (the environment is this shell's, as with sbatch). The new job\n"
                   "has an id and a job dir of its own; --wait follows it. A job that is\n"
                   "pending or running is refused (cancel it first). A local job, which has\n"
                   "no batch script, runs again here, in its working directory, with the\n"
                   "options its job.json keeps; gpurun says the command line.",
                   "submits an ended Slurm job again from its job.sbatch; a local one runs again"},
    [CMD_PREFLIGHT] = {"preflight", "gpurun preflight --help", "gpurun preflight [options]",
                       "Runs the pre-flight checks alone, on the nodes a job with the same\n"
                       "options would get (spares included), and starts no rank: each node's\n"
                       "GPUs, its job dir, and its link to the leader's node (timed; nodes on\n"
                       "the leader's host are not). Prints a line per node and exits 0 when\n"
                       "every node passed, 125 when one failed. Takes the options of a run;\n"
                       "on Slurm it waits for the job (--wait).",
                       "runs the pre-flight checks on the nodes, no rank"},
};

enum arg_kind {
    ARG_FLAG,       /* bool, no value */
    ARG_INT,        /* int in [min, max] */
    ARG_SECONDS,    /* seconds with up to 3 decimals, stored as int milliseconds in [min, max] */
    ARG_TIME,       /* Slurm time limit, stored as long seconds */
    ARG_STRING,     /* non-empty const char *, borrowed from argv */
    ARG_EXPORT,     /* NAME=VALUE appended to spec.env */
    ARG_LOGLEVEL,   /* error|warn|info|debug */
    ARG_CHOICE,     /* one word of the row's choices, stored as its int value */
    ARG_SIGNAL,     /* --signal=[{R|B}:]SIG[@TIME] into struct slurmopt_signal, and the spec */
    ARG_MEM,        /* sbatch's memory size into mem_mb, and the row's min into mem_per */
    ARG_OPT_CHOICE, /* as ARG_CHOICE, but the value is optional (--opt=WORD only); bare, the
                     * first choice */
    ARG_DEPENDENCY, /* --dependency, its syntax checked (slurmopt_check_dependency) */
    ARG_GRES,       /* --gres, checked (slurmopt_check_gres) */
    ARG_MAIL_TYPE,  /* --mail-type's words into SLURMOPT_MAIL_* bits; the text too */
    ARG_REFUSED,    /* an sbatch option gpurun's model has no room for: refused, with why */
    ARG_CHOICES,    /* comma-separated words of the row's choices, as bits 1 << value */
    ARG_GPUS,       /* sbatch's GPU count "[type:]N": as ARG_INT, a type refused */
};

/* Rows' flags. */
#define OPT_SLURM 1u /* only Slurm acts on it: --local ignores it, and says so */

/* A word an ARG_CHOICE option takes, and the value it stands for. Unlisted words are other
 * spellings of a listed one: taken, not named in help and messages. */
struct choice {
    const char *word;
    int value;
    bool listed;
};

/* srun's --gpu-bind values that mean something for one rank per GPU; "single:1" is srun's
 * single with one task per GPU, which is what single means here. */
static const struct choice gpu_bind_choices[] = {
    {"none", GPU_BIND_NONE, true},
    {"single", GPU_BIND_SINGLE, true},
    {"single:1", GPU_BIND_SINGLE, false},
    {NULL, 0, false},
};

/* --restart-on's words: the failure classes (jobspec.h). */
static const struct choice restart_choices[] = {
    {"user-error", FAILURE_USER_ERROR, true},
    {"node", FAILURE_NODE, true},
    {"hang", FAILURE_HANG, true},
    {"oom", FAILURE_OOM, true},
    {"signal", FAILURE_SIGNAL, true},
    {"all", -1, true},
    {"none", -2, true},
    {NULL, 0, false},
};

/* What --hang-timeout watches. */
static const struct choice hang_watch_choices[] = {
    {"report", HANG_WATCH_REPORT, true},
    {"output", HANG_WATCH_OUTPUT, true},
    {NULL, 0, false},
};

/* --preflight's words. */
static const struct choice preflight_choices[] = {
    {"on", 1, true},
    {"off", 0, true},
    {NULL, 0, false},
};

/* --straggler-action's words. */
static const struct choice straggler_choices[] = {
    {"report", STRAGGLER_REPORT, true},
    {"replace", STRAGGLER_REPLACE, true},
    {NULL, 0, false},
};

/* --horovod[=on|off|auto]; bare, the first (horovod.h). */
static const struct choice horovod_choices[] = {
    {"on", HOROVOD_ON, true},
    {"off", HOROVOD_OFF, true},
    {"auto", HOROVOD_AUTO, true},
    {NULL, 0, false},
};

/* sbatch's --exclusive[=user|mcs]; bare, the first. */
/* --local-rank-arg's spellings: Apex-era scripts' argparse declares --local_rank, torch 2's
 * torch.distributed.launch passes --local-rank. */
static const struct choice local_rank_choices[] = {
    {"local_rank", LOCAL_RANK_ARG_UNDERSCORE, true},
    {"local-rank", LOCAL_RANK_ARG_DASH, true},
    {NULL, 0, false},
};

static const struct choice exclusive_choices[] = {
    {"exclusive", SLURMOPT_EXCLUSIVE, true},
    {"user", SLURMOPT_EXCLUSIVE_USER, true},
    {"mcs", SLURMOPT_EXCLUSIVE_MCS, true},
    {NULL, 0, false},
};

#define ON_RUN    ((1u << CMD_RUN) | (1u << CMD_PREFLIGHT))
#define ON_STATUS (1u << CMD_STATUS)
#define ON_LOGS   (1u << CMD_LOGS)
#define ON_CANCEL (1u << CMD_CANCEL)
#define ON_CLEAN  (1u << CMD_CLEAN)
#define ON_HELP   (1u << CMD_HELP)
#define ON_RERUN  (1u << CMD_RERUN)
#define ON_ALL    (ON_RUN | ON_STATUS | ON_LOGS | ON_CANCEL | ON_CLEAN | ON_RERUN)
#define ON_JOB    (ON_RUN | ON_STATUS | ON_LOGS | ON_CANCEL | ON_RERUN)

/* The most ranks a job can have: jobspec's 65536 nodes times 1024 ranks per node. */
#define RANK_MAX (65536 * 1024 - 1)

#define FIELD(f) offsetof(struct gpurun_args, f)

struct opt_row {
    char short_name; /* 0: long name only */
    const char *long_name;
    enum arg_kind kind;
    size_t offset; /* the field of struct gpurun_args it fills */
    int min, max;  /* ARG_INT: the range; ARG_SECONDS: the range in milliseconds; ARG_MEM:
                    * min is the enum slurmopt_mem_per it sets */
    unsigned cmds; /* ON_* of the subcommands that take it */
    const char *metavar;
    const char *help;             /* a '\n' continues it on the next line, under the first */
    const struct choice *choices; /* ARG_CHOICE, ARG_OPT_CHOICE: NULL-terminated */
    unsigned flags;               /* OPT_* */
};

static const struct opt_row opts[] = {
    {'N', "nodes", ARG_INT, FIELD(spec.nnodes), 1, 65536, ON_RUN, "N",
     "nodes to run on: one rendezvousd each"},
    {0, "gpus-per-node", ARG_INT, FIELD(spec.nprocs), 1, 1024, ON_RUN, "N",
     "ranks per node, one GPU each"},
    /* sbatch's counts, each read in gpurun's model of one rank per GPU: see counts[]. */
    {'n', "ntasks", ARG_INT, FIELD(ntasks), 1, RANK_MAX, ON_RUN, "N",
     "sbatch's: N ranks in all, as many on each node: N / -N per node\n"
     "(or N / --gpus-per-node nodes; with --local alone, one node)"},
    {0, "ntasks-per-node", ARG_INT, FIELD(ntasks_per_node), 1, 1024, ON_RUN, "N",
     "sbatch's: ranks per node, so the same as --gpus-per-node"},
    {'G', "gpus", ARG_GPUS, FIELD(gpus), 1, RANK_MAX, ON_RUN, "N",
     "sbatch's: N GPUs in all, one rank each, so the same as -n N"},
    {0, "gpus-per-task", ARG_GPUS, FIELD(gpus_per_task), 1, 1024, ON_RUN, "1",
     "sbatch's: 1 only, gpurun's model (one GPU per rank)"},
    {0, "cpus-per-gpu", ARG_INT, FIELD(cpus_per_gpu), 1, 1024, ON_RUN, "N",
     "CPUs Slurm gives each rank (default: the partition's nodes' CPUs\n"
     "per GPU, the least; with --no-gpus their CPUs per rank; 1 when\n"
     "Slurm cannot say)"},
    {0, "no-gpus", ARG_FLAG, FIELD(no_gpus), 0, 0, ON_RUN, NULL,
     "ask Slurm for no GPUs: the ranks run on CPUs"},
    {'t', "time", ARG_TIME, FIELD(time_limit_s), 0, 0, ON_RUN, "TIME",
     "time limit as for sbatch (90, 1:30:00, 2-0...); exit 124 past it;\n"
     "0 or UNLIMITED: none (default: the partition's, which status shows;\n"
     "none with --local)"},
    {'p', "partition", ARG_STRING, FIELD(partition), 0, 0, ON_RUN, "NAME", "Slurm partition", NULL,
     OPT_SLURM},
    {'A', "account", ARG_STRING, FIELD(account), 0, 0, ON_RUN, "NAME", "Slurm account", NULL,
     OPT_SLURM},
    {'J', "job-name", ARG_STRING, FIELD(job_name), 0, 0, ON_RUN, "NAME",
     "job name, for Slurm and gpurun status (default: see above)"},
    {'o', "output", ARG_STRING, FIELD(output), 0, 0, ON_RUN, "FILE",
     "the merged \"[R] line\" stream to FILE (%j: job id)"},
    {'q', "qos", ARG_STRING, FIELD(qos), 0, 0, ON_RUN, "QOS", "Slurm quality of service", NULL,
     OPT_SLURM},
    {0, "mem", ARG_MEM, FIELD(mem_mb), SLURMOPT_MEM_NODE, 0, ON_RUN, "SIZE",
     "memory per node, sbatch's SIZE[K|M|G|T] (M by default; 0: all)", NULL, OPT_SLURM},
    {0, "mem-per-gpu", ARG_MEM, FIELD(mem_mb), SLURMOPT_MEM_GPU, 0, ON_RUN, "SIZE",
     "memory per GPU (--mem, --mem-per-gpu and --mem-per-cpu\nexclude each other)", NULL,
     OPT_SLURM},
    {0, "mem-per-cpu", ARG_MEM, FIELD(mem_mb), SLURMOPT_MEM_CPU, 0, ON_RUN, "SIZE",
     "memory per CPU", NULL, OPT_SLURM},
    {0, "exclusive", ARG_OPT_CHOICE, FIELD(exclusive), 0, 0, ON_RUN, "[=user|mcs]",
     "the nodes to this job alone (user: to the user's jobs)", exclusive_choices, OPT_SLURM},
    {'C', "constraint", ARG_STRING, FIELD(constraint), 0, 0, ON_RUN, "LIST",
     "node features the job needs (sbatch's expression: a&b, a|b...)", NULL, OPT_SLURM},
    {'w', "nodelist", ARG_STRING, FIELD(nodelist), 0, 0, ON_RUN, "NODES",
     "nodes the job must have (node[1-2],gpu7)", NULL, OPT_SLURM},
    {'x', "exclude", ARG_STRING, FIELD(exclude), 0, 0, ON_RUN, "NODES",
     "nodes the job must not have", NULL, OPT_SLURM},
    {0, "reservation", ARG_STRING, FIELD(reservation), 0, 0, ON_RUN, "NAME",
     "run in this Slurm reservation", NULL, OPT_SLURM},
    {0, "gres", ARG_GRES, FIELD(gres), 0, 0, ON_RUN, "LIST",
     "generic resources per node (name[:type]:N,...); gpu:[TYPE:]N is\n"
     "--gpus-per-node N, with --local too",
     NULL, OPT_SLURM},
    {'d', "dependency", ARG_DEPENDENCY, FIELD(dependency), 0, 0, ON_RUN, "LIST",
     "start after other jobs: TYPE:ID[:ID][,TYPE:ID...] (TYPE afterok,\n"
     "afterany, afternotok, after...; or singleton)",
     NULL, OPT_SLURM},
    {0, "begin", ARG_STRING, FIELD(begin), 0, 0, ON_RUN, "TIME",
     "start no earlier than TIME (16:00, now+1hour, 2030-01-31T08:00)", NULL, OPT_SLURM},
    {'H', "hold", ARG_FLAG, FIELD(hold), 0, 0, ON_RUN, NULL,
     "submit the job held: 'scontrol release ID' lets it start", NULL, OPT_SLURM},
    {'D', "chdir", ARG_STRING, FIELD(chdir), 0, 0, ON_RUN, "DIR",
     "the job's and the ranks' working directory (default: this one)"},
    {0, "comment", ARG_STRING, FIELD(comment), 0, 0, ON_RUN, "TEXT",
     "Slurm's comment of the job, after gpurun's mark: \"gpurun: TEXT\"", NULL, OPT_SLURM},
    {0, "mail-type", ARG_MAIL_TYPE, FIELD(mail_type), 0, 0, ON_RUN, "TYPES",
     "mail on BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT[_90|_80|_50],\n"
     "INVALID_DEPEND, STAGE_OUT or NONE (a list: END,FAIL)",
     NULL, OPT_SLURM},
    {0, "mail-user", ARG_STRING, FIELD(mail_user), 0, 0, ON_RUN, "USER",
     "whom the mail goes to (default: the submitting user)", NULL, OPT_SLURM},
    {'a', "array", ARG_REFUSED, 0, 0, 0, ON_RUN, "INDEXES",
     "refused: a gpurun job is one rendezvous, not an array of jobs"},
    {0, "max-restarts", ARG_INT, FIELD(spec.max_restarts), 0, 1000, ON_RUN, "N",
     "restart the ranks up to N times after a failure of a class --restart-on names"},
    {0, "spare-nodes", ARG_INT, FIELD(spec.spare_nodes), 0, 65536, ON_RUN, "K",
     "K more nodes that join as hot spares: one takes the place of a node\n"
     "that fails (lost, or a GPU or NCCL error), at a restart (--max-restarts;\n"
     "without it, up to K restarts of node and hang failures)"},
    {0, "restart-on", ARG_CHOICES, FIELD(spec.restart_on), 0, 0, ON_RUN, "CLASSES",
     "the failures --max-restarts restarts, comma-separated: user-error,\n"
     "node, hang, oom, signal, all or none (default all but user-error)",
     restart_choices},
    {0, "requeue", ARG_FLAG, FIELD(requeue), 0, 0, ON_RUN, NULL,
     "Slurm may requeue the job when it is preempted (default: not);\n"
     "the job keeps its id and job dir, its ranks resume from a checkpoint",
     NULL, OPT_SLURM},
    {0, "no-requeue", ARG_FLAG, FIELD(no_requeue), 0, 0, ON_RUN, NULL,
     "Slurm never requeues the job (the default)", NULL, OPT_SLURM},
    {0, "max-requeues", ARG_INT, FIELD(max_requeues), 0, 1000, ON_RUN, "N",
     "requeue a job whose ranks checkpointed on the pre-timeout signal,\n"
     "up to N requeues in all (default 0; N > 0 implies --requeue)",
     NULL, OPT_SLURM},
    {0, "wait", ARG_FLAG, FIELD(wait), 0, 0, ON_RUN | ON_RERUN, NULL,
     "stay until the job ends, print its output, exit with its status"},
    {0, "emit-sbatch", ARG_FLAG, FIELD(emit_sbatch), 0, 0, ON_RUN, NULL,
     "print the batch script instead of submitting it"},
    {0, "local", ARG_FLAG, FIELD(local), 0, 0, ON_RUN, NULL, "run on this machine, without Slurm"},
    {0, "output-ranks", ARG_STRING, FIELD(output_ranks), 0, 0, ON_RUN, "LIST",
     "show only these ranks' output live (0,2-3; torchrun's\n"
     "--local-ranks-filter); every rank's log is still kept whole"},
    {0, "container-image", ARG_STRING, FIELD(container_image), 0, 0, ON_RUN, "IMAGE",
     "run every rank inside IMAGE (podman's, docker's, an Apptainer .sif,\n"
     "an enroot .sqsh or pyxis's name); rendezvousd stays on the host"},
    {0, "container-mounts", ARG_STRING, FIELD(container_mounts), 0, 0, ON_RUN, "SRC:DST[:ro],...",
     "host paths mounted in the container (the job dir is)"},
    {0, "container-workdir", ARG_STRING, FIELD(container_workdir), 0, 0, ON_RUN, "DIR",
     "the ranks' working directory inside (default: the image's)"},
    {0, "container-env", ARG_STRING, FIELD(container_env), 0, 0, ON_RUN, "NAME,...",
     "variables of the host's layout passed in all the same (PATH, HOME,\n"
     "LD_LIBRARY_PATH...: kept out by default; every other one passes)"},
    {0, "container-runtime", ARG_STRING, FIELD(container_runtime), 0, 0, ON_RUN, "NAME",
     "podman, docker, apptainer, enroot or pyxis (default: pyxis in\n"
     "a Slurm job that has it, else the first of them installed)"},
    {0, "python", ARG_STRING, FIELD(python), 0, 0, ON_RUN, "PATH",
     "the Python that runs SCRIPT.py (default: $VIRTUAL_ENV/bin/python in\n"
     "a venv, else python3 on each node's PATH)"},
    {0, "local-rank-arg", ARG_OPT_CHOICE, FIELD(spec.local_rank_arg), 0, 0, ON_RUN,
     "[=local_rank|local-rank]",
     "pass each rank '--local_rank=N' after its script, as\n"
     "torch.distributed.launch does (torch 2's spelling: =local-rank)",
     local_rank_choices},
    {0, "require-rendezvous", ARG_FLAG, FIELD(require_rendezvous), 0, 0, ON_RUN, NULL,
     "fail a job of several ranks that never met (none connected to\n"
     "MASTER_ADDR:MASTER_PORT nor used the store): they trained alone"},
    {0, "mpi-env", ARG_FLAG, FIELD(mpi_env), 0, 0, ON_RUN, NULL,
     "give ranks MPICH's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID and\n"
     "MPI_LOCALNRANKS too (Open MPI's OMPI_COMM_WORLD_* they always have)"},
    {0, "use-env", ARG_FLAG, FIELD(use_env), 0, 0, ON_RUN, NULL,
     "torch.distributed.launch's: taken, and changes nothing (every rank\n"
     "has LOCAL_RANK in its environment)"},
    {0, "horovod", ARG_OPT_CHOICE, FIELD(horovod), 0, 0, ON_RUN, "[=on|off|auto]",
     "serve horovod's rendezvous to the job's hosts (on), or not (off); by\n"
     "default (auto) when the command or its script mentions horovod",
     horovod_choices},
    {0, "job-dir", ARG_STRING, FIELD(job_dir), 0, 0, ON_JOB, "DIR",
     "the job directory (default $GPURUN_JOBS/<id>/, ~/.gpurun/jobs)"},
    {0, "metrics-dir", ARG_STRING, FIELD(metrics_dir), 0, 0, ON_RUN, "DIR",
     "every node's daemon keeps gpurun_<id>_node<k>.prom in DIR for\n"
     "node_exporter's textfile collector, rewritten every 5 s, removed at the end"},
    {0, "hang-timeout", ARG_SECONDS, FIELD(spec.hang_timeout_ms), 0, 86400000, ON_RUN, "SEC",
     "fail the job when no rank reports progress for SEC (0: never)"},
    {0, "hang-watch", ARG_CHOICE, FIELD(spec.hang_watch), 0, 0, ON_RUN, "WHAT",
     "what --hang-timeout watches: report (gpurun.report, gr_report; the\n"
     "default) or output (a rank that prints nothing for SEC: any script)",
     hang_watch_choices},
    {0, "preflight", ARG_CHOICE, FIELD(spec.preflight), 0, 0, ON_RUN, "on|off",
     "pre-flight checks on every node before any rank starts: its GPUs\n"
     "(Slurm) with --min-gpu-free % of their memory free, the job dir\n"
     "writable with --min-free MiB free; a node that fails is replaced by\n"
     "a spare, or the job ends (default on)",
     preflight_choices},
    {0, "min-free", ARG_INT, FIELD(spec.min_free_mb), 0, 1 << 30, ON_RUN, "MB",
     "the free MiB pre-flight wants in the job dir's file system (default 64)"},
    {0, "mem-ckpt-max", ARG_INT, FIELD(spec.mem_ckpt_max_mb), 0, 1 << 30, ON_RUN, "MB",
     "the MiB of memory checkpoints (gpurun.memckpt, gr_mem_save) a node\n"
     "keeps for its ranks (default 0: a quarter of its memory)"},
    {0, "min-gpu-free", ARG_INT, FIELD(spec.min_gpu_free_pct), 0, 100, ON_RUN, "PCT",
     "the percent of each GPU's memory pre-flight wants free, read through\n"
     "NVML: a GPU a leftover process holds fails (default 90, 0: off)"},
    {0, "straggler-threshold", ARG_INT, FIELD(spec.straggler_pct), 0, 10000, ON_RUN, "PCT",
     "name a rank PCT% slower per step than the job's median a straggler\n"
     "(status, log, metrics; default 20, 0: off)"},
    {0, "straggler-action", ARG_CHOICE, FIELD(spec.straggler_action), 0, 0, ON_RUN, "WHAT",
     "report (the default) or replace: with a spare, a straggler's node\n"
     "gives its place at the next restart",
     straggler_choices},
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
    {0, "gpu-bind", ARG_CHOICE, FIELD(spec.gpu_bind), 0, 0, ON_RUN, "MODE",
     "none: every rank sees all its node's GPUs, as with torchrun;\n"
     "single (or single:1): local rank n sees the n-th GPU only",
     gpu_bind_choices},
    {0, "signal", ARG_SIGNAL, FIELD(signal), 0, 0, ON_RUN, "[B:]SIG[@TIME]",
     "sbatch's --signal=[{R|B}:]SIG[@TIME]: SIG (USR1, 10...) to every\n"
     "rank TIME s (default 60) before the time limit; without it, SIGUSR1\n"
     "to the ranks that ask for it only (gpurun-train, gpurun.on_preempt)"},
    {0, "json", ARG_FLAG, FIELD(json), 0, 0, ON_STATUS, NULL, "print the status as JSON"},
    {0, "all", ARG_FLAG, FIELD(all), 0, 0, ON_STATUS, NULL,
     "without JOBID: every job, not the 20 most recent"},
    {0, "older-than", ARG_INT, FIELD(older_than_days), 1, 36500, ON_CLEAN, "DAYS",
     "only jobs that ended more than DAYS days ago"},
    {0, "dry-run", ARG_FLAG, FIELD(dry_run), 0, 0, ON_CLEAN, NULL,
     "say what would be removed; remove nothing"},
    {'w', "watch", ARG_FLAG, FIELD(watch), 0, 0, ON_STATUS, NULL,
     "refresh the status every 2 s until the job ends"},
    {0, "rank", ARG_INT, FIELD(rank), 0, RANK_MAX, ON_LOGS, "R", "print only rank R's log"},
    {'f', "follow", ARG_FLAG, FIELD(follow), 0, 0, ON_LOGS, NULL,
     "keep printing as the logs grow, until the job ends"},
    {0, "log-level", ARG_LOGLEVEL, FIELD(log_level), 0, 0, ON_ALL, "LEVEL",
     "error, warn, info or debug (for gpurun and its daemons)"},
    {'h', "help", ARG_FLAG, FIELD(help), 0, 0, ON_ALL | ON_HELP, NULL, "print this help"},
    {0, "version", ARG_FLAG, FIELD(version), 0, 0, ON_RUN, NULL, "print gpurun's version"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* args.given has one bit per row. */
_Static_assert(N_OPTS <= 64 * ARGS_GIVEN_WORDS, "more option rows than bits in gpurun_args.given");

static void given_set(struct gpurun_args *args, size_t row)
{
    args->given[row / 64] |= 1ull << (row % 64);
}

static bool given_has(const struct gpurun_args *args, size_t row)
{
    return (args->given[row / 64] >> (row % 64)) & 1;
}

/* Names the daemon sets for each rank: an --export of one of them would lie to the rank. */
static const char *const reserved_env[] = {
    "RANK",        "LOCAL_RANK",  "WORLD_SIZE",  "LOCAL_WORLD_SIZE", "NODE_RANK",     "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "GPURUN_SOCK", "GPURUN_TOKEN",     "GPURUN_JOB_DIR"};

/* A torchrun value that gpurun reads its own way: may point *val at a rewritten value in buf
 * (n bytes), or refuse it with err. spelling: the option's name as given, for messages. */
typedef int (*alias_check)(const char *spelling, const char **val, char *buf, size_t n,
                           struct errmsg *err);

/* torchrun's "auto", "cpu" and "gpu" count the node's devices, which gpurun does not do. */
static int check_nproc(const char *spelling, const char **val, char *buf, size_t n,
                       struct errmsg *err)
{
    static const char *const counted[] = {"auto", "cpu", "gpu"};

    (void)buf;
    (void)n;
    for (size_t i = 0; i < sizeof(counted) / sizeof(counted[0]); i++)
        if (!strcmp(*val, counted[i]))
            return errmsg_set(
                err, -EINVAL,
                "--%s: '%s' is not supported (gpurun does not count the node's devices): "
                "give the number of ranks per node, e.g. --%s 8",
                spelling, *val, spelling);
    return 0;
}

/* torchrun's "MIN:MAX" asks for an elastic job; "N:N" is N nodes, which gpurun does. */
static int check_nnodes(const char *spelling, const char **val, char *buf, size_t n,
                        struct errmsg *err)
{
    const char *colon = strchr(*val, ':');
    size_t len;

    if (!colon)
        return 0;
    len = (size_t)(colon - *val);
    if (len > 0 && len < n && strlen(colon + 1) == len && !strncmp(*val, colon + 1, len)) {
        snprintf(buf, n, "%.*s", (int)len, *val);
        *val = buf;
        return 0;
    }
    return errmsg_set(
        err, -EINVAL,
        "--%s: '%s' is an elastic range, which gpurun does not run: give one number of "
        "nodes (--%s N), and --max-restarts N to survive failures",
        spelling, *val, spelling);
}

/* torchrun's spellings. With a canonical name, an alias of that option row: the same field,
 * value checks and given bit, after check. Without, a torchrun option gpurun has no use for,
 * refused with the reason. Matched with '_' and '-' alike, as torchrun does. */
struct alias_row {
    const char *name;
    const char *canonical; /* long name of the option row; NULL: refused */
    alias_check check;     /* NULL: none */
    const char *note;      /* help (alias) or the reason of the refusal */
};

/* Where an alias's text starts when its name fills the column: the column's end. */
#define ALIAS_INDENT "                              "

static const struct alias_row aliases[] = {
    {"nproc-per-node", "gpus-per-node", check_nproc, "a number: not gpu, cpu or auto"},
    {"nnodes", "nodes", check_nnodes, "a number, or N:N: no elastic MIN:MAX range"},
    {"local-ranks-filter", "output-ranks", NULL, "the ranks of the whole job: 0,2-3"},
    {"standalone", NULL, NULL,
     "gpurun sets up the rendezvous itself; drop it (--local runs the job on this machine)"},
    {"node-rank", NULL, NULL, "gpurun numbers the nodes itself; drop it"},
    {"master-addr", NULL, NULL, "gpurun sets MASTER_ADDR and MASTER_PORT itself; drop it"},
    {"master-port", NULL, NULL, "gpurun sets MASTER_ADDR and MASTER_PORT itself; drop it"},
    {"rdzv-backend", NULL, NULL, "gpurun runs the rendezvous itself; drop it"},
    {"rdzv-endpoint", NULL, NULL, "gpurun runs the rendezvous itself; drop it"},
    {"rdzv-id", NULL, NULL, "gpurun runs the rendezvous itself; drop it"},
    /* torch.distributed.launch's spelling (--use_env) of a row of gpurun's own. */
    {"use-env", "use-env", NULL, NULL},
};
#define N_ALIASES (sizeof(aliases) / sizeof(aliases[0]))

/* What an option that counts ranks counts. */
enum count_unit {
    COUNT_PER_NODE, /* ranks on each node */
    COUNT_IN_ALL,   /* ranks of the whole job */
    COUNT_PER_RANK, /* GPUs of each rank, which gpurun's model fixes at one */
};

/* The options that say how big a job is, besides -N. gpurun's model is -N nodes times
 * --gpus-per-node G ranks, one rank per GPU, the same G on every node. sbatch's habits mean
 * the same things under other names, so each is read into that model, and what the model
 * cannot hold is refused with what to write instead:
 * - --ntasks-per-node K: sbatch's tasks per node; a gpurun rank is a task with one GPU, so K
 *   is --gpus-per-node. sbatch takes it as a mere maximum beside -n; gpurun runs the same
 *   number on every node, so two counts per node must agree.
 * - -n/--ntasks T: tasks in all, so ranks in all: T / N per node when -N is given, else
 *   T / G nodes when --gpus-per-node is; T must split evenly. With neither it is refused,
 *   not guessed: Slurm would spread T tasks over whatever nodes it likes, which a launcher
 *   with the same ranks on every node cannot follow.
 * - -G/--gpus T: GPUs in all; one rank per GPU makes them ranks in all, as -n T.
 * - --gpus-per-task: 1 is gpurun's model, so taken; any other number would give a rank
 *   several GPUs, which one rank per GPU cannot.
 * - --gres gpu:N (gpu:TYPE:N): N GPUs per node, so --gpus-per-node N (the TYPE goes to Slurm).
 * With --local there is one node unless -N or a count per node says otherwise: -n and -G
 * count its ranks.
 * torchrun's --nproc-per-node and --nnodes are aliases of --gpus-per-node and --nodes (the
 * table above): torchrun means the same by them. */
static const struct count_row {
    const char *option; /* its row's long name */
    enum count_unit unit;
    bool asks_gpus; /* counts GPUs as sbatch asks for them, so meaningless with --no-gpus
                     * (--gpus-per-node still counts a CPU job's ranks per node) */
    size_t value;   /* where in struct gpurun_args its int is; 0 there: nothing counted
                     * (a --gres without GPUs) */
} counts[] = {
    {"gpus-per-node", COUNT_PER_NODE, false, FIELD(spec.nprocs)},
    {"ntasks-per-node", COUNT_PER_NODE, false, FIELD(ntasks_per_node)},
    {"gres", COUNT_PER_NODE, true, FIELD(gres_gpus)},
    {"ntasks", COUNT_IN_ALL, false, FIELD(ntasks)},
    {"gpus", COUNT_IN_ALL, true, FIELD(gpus)},
    {"gpus-per-task", COUNT_PER_RANK, true, FIELD(gpus_per_task)},
};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))

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
    free(args->ran_dir);
    args_init(args);
}

const char *args_cmd_name(enum gpurun_cmd cmd)
{
    return (unsigned)cmd < CMD_COUNT ? cmds[cmd].name : "?";
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
                      struct errmsg *err)
{
    const char *eq = strchr(kv, '=');

    if (!eq || !env_name_ok(kv, (size_t)(eq - kv)))
        return errmsg_set(err, -EINVAL, "--%s: '%s' is not NAME=VALUE", name, kv);
    for (size_t i = 0; i < sizeof(reserved_env) / sizeof(reserved_env[0]); i++)
        if (strlen(reserved_env[i]) == (size_t)(eq - kv) &&
            !strncmp(kv, reserved_env[i], (size_t)(eq - kv)))
            return errmsg_set(err, -EINVAL, "--%s: '%s' is set by gpurun for every rank", name,
                              reserved_env[i]);
    if (jobspec_add_env(&args->spec, kv) < 0)
        return errmsg_set(err, -EINVAL, "--%s: out of memory", name);
    return 0;
}

/* "a", "a or b", "a, b or c": the listed words of choices, into buf (n bytes). */
static void choice_words(char *buf, size_t n, const struct choice *choices)
{
    size_t listed = 0, k = 0, len = 0;

    buf[0] = '\0';
    for (const struct choice *c = choices; c->word; c++)
        listed += c->listed;
    for (const struct choice *c = choices; c->word; c++) {
        int r;
        if (!c->listed)
            continue;
        k++;
        r = snprintf(buf + len, n - len, "%s%s",
                     k == 1        ? ""
                     : k == listed ? " or "
                                   : ", ",
                     c->word);
        if (r < 0 || (size_t)r >= n - len)
            return;
        len += (size_t)r;
    }
}

/* Stores the value of the word val of row o's choices into field (an int). */
static int set_choice(const struct opt_row *o, const char *name, const char *val, void *field,
                      struct errmsg *err)
{
    char words[128];

    for (const struct choice *c = o->choices; c->word; c++) {
        if (!strcmp(val, c->word)) {
            *(int *)field = c->value;
            return 0;
        }
    }
    choice_words(words, sizeof(words), o->choices);
    return errmsg_set(err, -EINVAL, "--%s: '%s' is not %s", name, val, words);
}

/* Comma-separated words of o's choices into a bit mask: 1 << value for each, "all" (-1) for
 * every class, "none" (-2) for none. */
static int set_choices(const struct opt_row *o, const char *name, const char *val, void *field,
                       struct errmsg *err)
{
    int mask = 0;

    for (const char *p = val;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const struct choice *c;
        char words[160];

        for (c = o->choices; c->word; c++)
            if (strlen(c->word) == len && !strncmp(p, c->word, len))
                break;
        if (!c->word) {
            choice_words(words, sizeof(words), o->choices);
            return errmsg_set(err, -EINVAL, "--%s: '%.*s' is not %s", name, (int)len, p, words);
        }
        mask |= c->value == -1 ? RESTART_ON_ALL : c->value == -2 ? 0 : 1 << c->value;
        if (!comma)
            break;
        p = comma + 1;
    }
    *(int *)field = mask;
    return 0;
}

/* Stores val (NULL for a flag) into the field of row o; name is the option as spelt on the
 * command line (an alias's own name), for messages. */
static int set_value(struct gpurun_args *args, const struct opt_row *o, const char *name,
                     const char *val, struct errmsg *err)
{
    void *field = (char *)args + o->offset;
    long v;
    int r;

    switch (o->kind) {
    case ARG_FLAG:
        *(bool *)field = true;
        return 0;
    case ARG_GPUS:
        /* sbatch's "[type:]N": gpurun asks Slurm for GPUs by count (gres:gpu:N per node). */
        if (strchr(val, ':'))
            return errmsg_set(err, -EINVAL,
                              "--%s: '%s': gpurun asks for GPUs by count, not by type: give "
                              "--%s %s (and -C/--constraint for nodes with that GPU, where the "
                              "cluster names it as a feature)",
                              name, val, name, strrchr(val, ':') + 1);
        /* fallthrough */
    case ARG_INT:
        r = parse_long(val, &v);
        if (r == -EINVAL)
            return errmsg_set(err, -EINVAL, "--%s: '%s' is not a number", name, val);
        if (r < 0 || v < o->min || v > o->max)
            return errmsg_set(err, -EINVAL, "--%s: must be %d..%d", name, o->min, o->max);
        *(int *)field = (int)v;
        return 0;
    case ARG_SECONDS:
        r = parse_ms(val, &v);
        if (r == -EINVAL)
            return errmsg_set(err, -EINVAL, "--%s: '%s' is not a number of seconds", name, val);
        if (r < 0 || v < o->min || v > o->max) {
            char lo[32], hi[32];
            format_ms(lo, sizeof(lo), o->min);
            format_ms(hi, sizeof(hi), o->max);
            return errmsg_set(err, -EINVAL, "--%s: must be %s..%s seconds", name, lo, hi);
        }
        *(int *)field = (int)v;
        return 0;
    case ARG_TIME:
        r = slurmopt_parse_time(val, &v);
        if (r == -EINVAL)
            return errmsg_set(
                err, -EINVAL,
                "--%s: '%s' is not a time (minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]])", name, val);
        if (r < 0)
            return errmsg_set(err, -EINVAL, "--%s: must be at most 365 days (0: no limit)", name);
        *(long *)field = v;
        return 0;
    case ARG_STRING:
        if (!*val)
            return errmsg_set(err, -EINVAL, "--%s: empty value", name);
        *(const char **)field = val;
        return 0;
    case ARG_EXPORT:
        return set_export(args, name, val, err);
    case ARG_LOGLEVEL:
        if (log_level_parse(val, (enum log_level *)field) < 0)
            return errmsg_set(err, -EINVAL, "--%s: '%s' is not error, warn, info or debug", name,
                              val);
        args->log_level_name = val;
        return 0;
    case ARG_CHOICE:
        return set_choice(o, name, val, field, err);
    case ARG_CHOICES:
        return set_choices(o, name, val, field, err);
    case ARG_MEM: {
        unsigned long long mb;
        r = slurmopt_parse_mem(val, &mb);
        if (r == -ERANGE)
            return errmsg_set(err, -EINVAL, "--%s: '%s' is more memory than Slurm counts", name,
                              val);
        if (r < 0)
            return errmsg_set(err, -EINVAL,
                              "--%s: '%s' is not a size (a whole number and K, M, G or T; M by "
                              "default)",
                              name, val);
        *(unsigned long long *)field = mb;
        args->mem_per = (enum slurmopt_mem_per)o->min;
        return 0;
    }
    case ARG_OPT_CHOICE:
        if (!val) {
            *(int *)field = o->choices[0].value;
            return 0;
        }
        return set_choice(o, name, val, field, err);
    case ARG_DEPENDENCY: {
        struct errmsg why;
        r = slurmopt_check_dependency(val, &why);
        if (r < 0)
            return errmsg_set(err, -EINVAL, "--%s: '%s': %s", name, val, why.text);
        *(const char **)field = val;
        return 0;
    }
    case ARG_GRES: {
        /* sbatch's most common habit, --gres gpu:N (or gpu:TYPE:N): N is a count per node,
         * read with the others (counts[]); the rest is asked of Slurm as it is. */
        struct errmsg why;
        r = slurmopt_split_gres(val, &args->gres_gpus, args->gpu_type, sizeof(args->gpu_type),
                                args->gres_rest, sizeof(args->gres_rest), &why);
        if (r == 0 && args->gres_rest[0])
            r = slurmopt_check_gres(args->gres_rest, &why);
        if (r < 0)
            return errmsg_set(err, -EINVAL, "--%s: '%s': %s", name, val, why.text);
        *(const char **)field = args->gres_rest[0] ? args->gres_rest : NULL;
        return 0;
    }
    case ARG_MAIL_TYPE: {
        char bad[64];
        r = slurmopt_parse_mail_type(val, bad, sizeof(bad));
        if (r < 0)
            return errmsg_set(
                err, -EINVAL,
                "--%s: '%s' is not a mail type (BEGIN, END, FAIL, REQUEUE, ALL, "
                "TIME_LIMIT[_90|_80|_50], INVALID_DEPEND, STAGE_OUT, ARRAY_TASKS or NONE)",
                name, bad);
        *(unsigned *)field = (unsigned)r;
        args->mail_type_text = val;
        return 0;
    }
    case ARG_REFUSED:
        return errmsg_set(
            err, -EINVAL,
            "--%s: '%s' is refused: a gpurun job is one rendezvous of all its ranks, not "
            "an array of jobs; submit one gpurun per task instead (a shell loop, each "
            "with --export TASK=N)",
            name, val);
    case ARG_SIGNAL:
        r = slurmopt_parse_signal(val, (struct slurmopt_signal *)field, err);
        if (r < 0)
            return r;
        /* Asked for by name, so every rank gets it, not only those that registered. */
        args->spec.preempt_signal = args->signal.sig;
        args->spec.preempt_all = 1;
        return 0;
    }
    return errmsg_set(err, -EINVAL, "--%s: bad option row", name);
}

static const struct opt_row *find_long(const char *name, size_t n)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].long_name) == n && !strncmp(opts[i].long_name, name, n))
            return &opts[i];
    return NULL;
}

/* The alias row spelt name (n bytes; '_' is taken for '-'), or NULL. */
static const struct alias_row *find_alias(const char *name, size_t n)
{
    for (size_t i = 0; i < N_ALIASES; i++) {
        const char *a = aliases[i].name;
        size_t k = 0;
        if (strlen(a) != n)
            continue;
        while (k < n && (name[k] == '_' ? '-' : name[k]) == a[k])
            k++;
        if (k == n)
            return &aliases[i];
    }
    return NULL;
}

/* The row of short option c; of two (-w: run's --nodelist, status's --watch), the one cmd
 * takes. */
static const struct opt_row *find_short(char c, enum gpurun_cmd cmd)
{
    const struct opt_row *found = NULL;

    for (size_t i = 0; i < N_OPTS; i++) {
        if (!opts[i].short_name || opts[i].short_name != c)
            continue;
        if (opts[i].cmds & (1u << cmd))
            return &opts[i];
        if (!found)
            found = &opts[i];
    }
    return found;
}

/* Whether the row takes a value in the next word (an optional one comes only after '='). */
static bool takes_value(const struct opt_row *o)
{
    return o->kind != ARG_FLAG && o->kind != ARG_OPT_CHOICE;
}

/* Whether the row's value is free text, where a word that starts with '-' is more likely a
 * forgotten value than a value. */
static bool takes_text(const struct opt_row *o)
{
    return o->kind == ARG_STRING || o->kind == ARG_DEPENDENCY || o->kind == ARG_GRES ||
           o->kind == ARG_MAIL_TYPE || o->kind == ARG_MEM;
}

/* --- "did you mean" -------------------------------------------------------------------------- */

/* The longest word a suggestion is looked for: no name of ours is longer. */
#define SUGGEST_LEN_MAX 48

/* Optimal string alignment distance between a (na bytes) and b: an insertion, a deletion, a
 * substitution or a swap of two neighbours ("stauts" for "status") costs 1 each. SIZE_MAX
 * for words longer than SUGGEST_LEN_MAX. */
static size_t edit_distance(const char *a, size_t na, const char *b)
{
    size_t nb = strlen(b), d[SUGGEST_LEN_MAX + 1][SUGGEST_LEN_MAX + 1];

    if (na > SUGGEST_LEN_MAX || nb > SUGGEST_LEN_MAX)
        return SIZE_MAX;
    for (size_t i = 0; i <= na; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= nb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= na; i++) {
        for (size_t j = 1; j <= nb; j++) {
            size_t v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[na][nb];
}

/* The nearest name seen so far, and how near. */
struct suggestion {
    const char *name;
    size_t distance;
};

/* Keeps name in s when word (n bytes) is nearer to it than to any name before and near
 * enough to be a slip: at most a third of name's length in edits, and at least one. */
static void suggest_consider(struct suggestion *s, const char *word, size_t n, const char *name)
{
    size_t d = edit_distance(word, n, name), limit = strlen(name) / 3;

    if (limit < 1)
        limit = 1;
    if (d <= limit && (!s->name || d < s->distance)) {
        s->name = name;
        s->distance = d;
    }
}

/* An unknown long option (word, its name n bytes after the "--"): the nearest option or
 * torchrun spelling the subcommand takes, if one is near, else where to look. */
static int unknown_long(const struct gpurun_args *args, const char *word, size_t n,
                        struct errmsg *err)
{
    struct suggestion s = {NULL, 0};
    unsigned on = 1u << args->cmd;
    char norm[SUGGEST_LEN_MAX + 1];

    if (n <= SUGGEST_LEN_MAX) {
        for (size_t k = 0; k < n; k++)
            norm[k] = word[2 + k] == '_' ? '-' : word[2 + k];
        for (size_t i = 0; i < N_OPTS; i++)
            if (opts[i].cmds & on)
                suggest_consider(&s, norm, n, opts[i].long_name);
        for (size_t i = 0; i < N_ALIASES; i++) {
            const char *c = aliases[i].canonical;
            const struct opt_row *o = c ? find_long(c, strlen(c)) : NULL;
            if (o && (o->cmds & on))
                suggest_consider(&s, norm, n, aliases[i].name);
        }
    }
    if (s.name)
        return errmsg_set(err, -EINVAL, "unknown option '%.*s'; did you mean '--%s'?", (int)(n + 2),
                          word, s.name);
    return errmsg_set(err, -EINVAL, "unknown option '%.*s' (see '%s')", (int)(n + 2), word,
                      cmds[args->cmd].hint);
}

/* torchrun's "train.py": a word ending in ".py" that is not an override. */
static bool is_script(const char *word)
{
    size_t n = strlen(word);

    return n > 3 && !strcmp(word + n - 3, ".py") && !traincfg_is_override(word);
}

/* A positional word of run that names a command rather than a train.cfg: no file of that
 * name here, or an executable one not named *.cfg ("fairseq-hydra-train", "python3"), so
 * that the options after it are the command's own. */
static bool looks_like_command(const char *word)
{
    size_t n = word ? strlen(word) : 0;

    if (!word || (n > 4 && !strcmp(word + n - 4, ".cfg")))
        return false;
    return access(word, F_OK) != 0 || access(word, X_OK) == 0;
}

/* A first word that is neither a subcommand nor a file but is near a subcommand's name is a
 * slip ("stauts"), refused here rather than taken for a train.cfg that does not exist. */
static int check_misspelt(const char *word, struct errmsg *err)
{
    struct suggestion s = {NULL, 0};

    if (word[0] == '-' || is_script(word) || traincfg_is_override(word) || access(word, F_OK) == 0)
        return 0;
    for (int c = CMD_STATUS; c < CMD_COUNT; c++)
        suggest_consider(&s, word, strlen(word), cmds[c].name);
    if (!s.name)
        return 0;
    return errmsg_set(err, -EINVAL, "'%s' is not a gpurun command or a file; did you mean '%s'?",
                      word, s.name);
}

/* --- parsing --------------------------------------------------------------------------------- */

/* Handles the option at argv[*i] (which starts with '-' and is not "--" or "-"), taking its
 * value from the same word or the next one. */
static int parse_option(struct gpurun_args *args, int argc, char **argv, int *i, bool *hb_seen,
                        struct errmsg *err)
{
    const char *word = argv[*i], *val = NULL;
    const struct opt_row *o;
    const struct alias_row *al = NULL;
    /* The name as given, for messages; a torchrun value rewritten ("2:2" is 2). */
    char spelling[SUGGEST_LEN_MAX + 1], rewritten[32];
    int r;

    if (word[1] == '-') {
        const char *name = word + 2, *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        o = find_long(name, n);
        if (!o) {
            al = find_alias(name, n);
            if (al && al->canonical)
                o = find_long(al->canonical, strlen(al->canonical));
        }
        if (!o && al && args->cmd == CMD_RUN)
            return errmsg_set(err, -EINVAL, "'%.*s' is torchrun's: %s", (int)(n + 2), word,
                              al->note);
        if (!o)
            return unknown_long(args, word, n, err);
        snprintf(spelling, sizeof(spelling), "%.*s", (int)n, name);
        if (eq)
            val = eq + 1;
    } else {
        o = find_short(word[1], args->cmd);
        if (!o)
            return errmsg_set(err, -EINVAL, "unknown option '-%c' (see '%s')", word[1],
                              cmds[args->cmd].hint);
        snprintf(spelling, sizeof(spelling), "%s", o->long_name);
        if (word[2])
            val = word + 2;
    }
    if (!(o->cmds & (1u << args->cmd)))
        return errmsg_set(err, -EINVAL, "option '--%s' does not apply to '%s' (see '%s')", spelling,
                          args->cmd == CMD_RUN ? "gpurun" : args_cmd_name(args->cmd),
                          cmds[args->cmd].hint);
    if (!takes_value(o) && val && o->kind != ARG_OPT_CHOICE)
        return errmsg_set(err, -EINVAL, "option '--%s' takes no value", spelling);
    if (takes_value(o) && !val) {
        if (*i + 1 >= argc || !strcmp(argv[*i + 1], "--"))
            return errmsg_set(err, -EINVAL, "option '--%s' needs a value", spelling);
        /* "-J --wait" is a forgotten value far more often than a name: a value that looks
         * like an option is taken only in the "--opt=VALUE" form. (Numbers may be negative:
         * their own checks refuse them.) */
        if (takes_text(o) && argv[*i + 1][0] == '-' && argv[*i + 1][1])
            return errmsg_set(err, -EINVAL,
                              "option '--%s' needs a value, and '%s' looks like an option (for a "
                              "value that starts with '-', write --%s=%s)",
                              spelling, argv[*i + 1], o->long_name, argv[*i + 1]);
        val = argv[++*i];
    }
    if (al && al->check) {
        r = al->check(spelling, &val, rewritten, sizeof(rewritten), err);
        if (r < 0)
            return r;
    }
    if (o->offset == FIELD(spec.hb_timeout_ms) && o->kind == ARG_SECONDS)
        *hb_seen = true;
    given_set(args, (size_t)(o - opts));
    return set_value(args, o, spelling, val, err);
}

/* help's one word: a subcommand's name, or "gpurun" for gpurun's own help. */
static int parse_help_topic(struct gpurun_args *args, const char *word, struct errmsg *err)
{
    char names[128] = "";
    size_t len = 0;

    if (args->target)
        return errmsg_set(err, -EINVAL,
                          "gpurun help takes one subcommand: unexpected argument '%s'", word);
    for (int c = 0; c < CMD_COUNT; c++) {
        if (!strcmp(word, cmds[c].name)) {
            args->target = word;
            args->help_cmd = (enum gpurun_cmd)c;
            return 0;
        }
        if (c > CMD_RUN && len < sizeof(names))
            len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s",
                                    c > CMD_STATUS ? ", " : "", cmds[c].name);
    }
    return errmsg_set(err, -EINVAL, "'%s': no such subcommand (gpurun's are %s)", word, names);
}

/* The positional arguments: run takes one train.cfg and its "section.key=value" overrides,
 * help one SUBCOMMAND, the others one JOBID. */
static int parse_positional(struct gpurun_args *args, const char *word, struct errmsg *err)
{
    if (args->cmd == CMD_RUN && traincfg_is_override(word)) {
        if (args->n_overrides == ARGS_MAX_OVERRIDES)
            return errmsg_set(err, -EINVAL, "more than %d overrides", ARGS_MAX_OVERRIDES);
        args->overrides[args->n_overrides++] = word;
        return 0;
    }
    if (args->cmd == CMD_CLEAN)
        return errmsg_set(err, -EINVAL, "gpurun clean takes no job: unexpected argument '%s'",
                          word);
    if (args->cmd == CMD_PREFLIGHT)
        return errmsg_set(err, -EINVAL,
                          "gpurun preflight runs no command: unexpected argument '%s'", word);
    if (args->cmd == CMD_HELP)
        return parse_help_topic(args, word, err);
    if (args->target)
        return errmsg_set(err, -EINVAL,
                          args->cmd == CMD_RUN
                              ? "unexpected argument '%s' (to run a command, put it "
                                "after '--': gpurun [options] -- CMD ARGS...)"
                              : "unexpected argument '%s'",
                          word);
    args->target = word;
    return 0;
}

/* How many of the memory options (--mem, --mem-per-cpu, --mem-per-gpu) were given. */
static int mem_given(const struct gpurun_args *args)
{
    int n = 0;

    for (size_t i = 0; i < N_OPTS; i++)
        n += opts[i].kind == ARG_MEM && given_has(args, i);
    return n;
}

/* The int a count row's option holds (spec.nprocs for --gpus-per-node). */
static int count_value(const struct gpurun_args *args, const struct count_row *c)
{
    return *(const int *)((const char *)args + c->value);
}

/* A count as the command line gave it, for messages: "--gres gpu:a100:2", "--ntasks 8". */
static const char *count_spelling(const struct gpurun_args *args, const struct count_row *c, int v,
                                  char *buf, size_t n)
{
    if (c->value == FIELD(gres_gpus))
        snprintf(buf, n, "--gres gpu:%s%s%d", args->gpu_type, args->gpu_type[0] ? ":" : "", v);
    else
        snprintf(buf, n, "--%s %d", c->option, v);
    return buf;
}

/* Sets row name's given bit: a size that came from sbatch's counts beats a train.cfg's and
 * an sbatch variable's as -N or --gpus-per-node would. */
static void set_given(struct gpurun_args *args, const char *name)
{
    given_set(args, (size_t)(find_long(name, strlen(name)) - opts));
}

/* Ranks in all (in_all, total) into nodes and ranks per node: over -N when given, else over
 * the count per node (per_node, g; NULL when none was given), else with --local over its one
 * node. */
static int split_total(struct gpurun_args *args, const struct count_row *in_all, int total,
                       const struct count_row *per_node, int g, struct errmsg *err)
{
    struct jobspec *s = &args->spec;
    const char *t = in_all->option;
    char g_text[128];
    int n = s->nnodes;

    if (!args_given(args, "nodes") && !per_node && args->local)
        n = s->nnodes = 1;
    if (args_given(args, "nodes") || (!per_node && args->local)) {
        if (total % n) {
            int below = total / n * n;
            if (below > 0)
                return errmsg_set(err, -EINVAL,
                                  "--%s %d cannot be split evenly over --nodes %d: gpurun runs "
                                  "as many ranks on every node; give a multiple of %d (%d or %d)",
                                  t, total, n, n, below, below + n);
            return errmsg_set(err, -EINVAL,
                              "--%s %d is fewer than --nodes %d: gpurun runs at least one rank "
                              "on every node; give --nodes %d or fewer",
                              t, total, n, total);
        }
        if (per_node && g != total / n)
            return errmsg_set(err, -EINVAL,
                              "--%s %d over --nodes %d is %d ranks per node, but --%s says %d: "
                              "give two of the three (ranks in all = nodes x ranks per node)",
                              t, total, n, total / n, per_node->option, g);
        if (total / n > 1024)
            return errmsg_set(err, -EINVAL,
                              "--%s %d over --nodes %d is %d ranks per node, more than 1024", t,
                              total, n, total / n);
        s->nprocs = total / n;
        return 0;
    }
    if (!per_node)
        return errmsg_set(err, -EINVAL,
                          "--%s %d needs -N (%d / N ranks on each node) or --gpus-per-node G "
                          "(%d / G nodes): gpurun runs as many ranks on every node",
                          t, total, total, total);
    count_spelling(args, per_node, g, g_text, sizeof(g_text));
    if (total % g)
        return errmsg_set(err, -EINVAL,
                          "--%s %d is not a multiple of %s: gpurun runs as many ranks on "
                          "every node; give -N too, or a multiple of %d",
                          t, total, g_text, g);
    if (total / g > 65536)
        return errmsg_set(err, -EINVAL, "--%s %d over %s is %d nodes, more than 65536", t, total,
                          g_text, total / g);
    s->nnodes = total / g;
    s->nprocs = g;
    return 0;
}

/* sbatch's counts (counts[]) into spec.nnodes and spec.nprocs, once every option is read,
 * so that their order does not matter. */
static int finish_counts(struct gpurun_args *args, struct errmsg *err)
{
    /* By unit, the first of each (per node, in all) and its value; a count per rank is only
     * checked. */
    const struct count_row *seen[COUNT_PER_RANK] = {NULL, NULL};
    int value[COUNT_PER_RANK] = {0, 0}, r;

    for (size_t i = 0; i < N_COUNTS; i++) {
        const struct count_row *c = &counts[i];
        char a[128], b[128];
        int v;
        if (!args_given(args, c->option) || (v = count_value(args, c)) == 0)
            continue;
        if (c->asks_gpus && args->no_gpus)
            return errmsg_set(err, -EINVAL,
                              "%s: the job asks for no GPUs (--no-gpus): count its ranks "
                              "with -n or --gpus-per-node",
                              count_spelling(args, c, v, a, sizeof(a)));
        if (c->unit == COUNT_PER_RANK) {
            if (v != 1)
                return errmsg_set(err, -EINVAL,
                                  "--%s %d: gpurun runs one rank per GPU, so every rank has "
                                  "one: drop it, and count the ranks with --gpus-per-node (or "
                                  "-n, -G)",
                                  c->option, v);
            continue;
        }
        if (seen[c->unit] && value[c->unit] != v)
            return errmsg_set(
                err, -EINVAL,
                "%s and %s differ: gpurun runs one rank per GPU, so both count the ranks %s; "
                "give one of them",
                count_spelling(args, seen[c->unit], value[c->unit], a, sizeof(a)),
                count_spelling(args, c, v, b, sizeof(b)),
                c->unit == COUNT_PER_NODE ? "per node (it starts a node's ranks itself)"
                                          : "in all");
        seen[c->unit] = c;
        value[c->unit] = v;
    }
    if (seen[COUNT_IN_ALL]) {
        r = split_total(args, seen[COUNT_IN_ALL], value[COUNT_IN_ALL], seen[COUNT_PER_NODE],
                        value[COUNT_PER_NODE], err);
        if (r < 0)
            return r;
        set_given(args, "nodes");
        set_given(args, "gpus-per-node");
    } else if (seen[COUNT_PER_NODE]) {
        args->spec.nprocs = value[COUNT_PER_NODE];
        set_given(args, "gpus-per-node");
    }
    return 0;
}

/* The heartbeat timeout follows the interval unless it was given: ten beats of silence. */
static int finish_heartbeat(struct gpurun_args *args, bool hb_seen, struct errmsg *err)
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
        return errmsg_set(err, -EINVAL,
                          "--heartbeat-timeout: %s seconds is not longer than the heartbeat (%s)",
                          t, iv);
    }
    return 0;
}

int args_parse(struct gpurun_args *args, int argc, char **argv, struct errmsg *err)
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
        if (args->cmd == CMD_RUN && (r = check_misspelt(argv[1], err)) < 0)
            return r;
    }
    for (; i < argc; i++) {
        const char *word = argv[i];
        if (!strcmp(word, "--")) {
            dashdash = true;
            i++;
            break;
        }
        /* torchrun's "SCRIPT.py ARGS...": the rest of the line is the script's. */
        if (args->cmd == CMD_RUN && word[0] != '-' && is_script(word)) {
            args->script = word;
            break;
        }
        if (word[0] == '-' && word[1]) {
            r = parse_option(args, argc, argv, &i, &hb_seen, err);
            if (r < 0 && args->cmd == CMD_RUN && looks_like_command(args->target))
                return errmsg_set(err, r,
                                  "'%s' after '%s' is not gpurun's option: to run a command with "
                                  "its own options, put it after '--' (gpurun [options] -- %s %s "
                                  "...)",
                                  word, args->target, args->target, word);
        } else {
            r = parse_positional(args, word, err);
        }
        if (r < 0)
            return r;
    }
    if (args->script) {
        if (args->target && looks_like_command(args->target))
            return errmsg_set(err, -EINVAL,
                              "'%s' is not a train.cfg: to run a command, put it after '--' "
                              "(gpurun [options] -- %s %s ...)",
                              args->target, args->target, args->script);
        if (args->target)
            return errmsg_set(err, -EINVAL, "give a train.cfg or a script, not both ('%s', '%s')",
                              args->target, args->script);
        if (args->n_overrides > 0)
            return errmsg_set(err, -EINVAL, "'%s': overrides are for a train.cfg, not for a script",
                              args->overrides[0]);
        args->cmd_argv = argv + i;
        args->cmd_argc = argc - i;
    } else if (i < argc) {
        if (args->cmd != CMD_RUN) {
            for (; i < argc; i++)
                if ((r = parse_positional(args, argv[i], err)) < 0)
                    return r;
        } else if (args->target) {
            return errmsg_set(err, -EINVAL, "give a train.cfg or '-- CMD', not both");
        } else if (args->n_overrides > 0) {
            return errmsg_set(err, -EINVAL, "'%s': overrides are for a train.cfg, not for '-- CMD'",
                              args->overrides[0]);
        } else {
            args->cmd_argv = argv + i;
            args->cmd_argc = argc - i;
            /* "-- train.py ARGS" is the script too: torchrun runs its training script with
             * Python whatever the file's mode, and "train.py" is rarely a command on PATH. */
            if (is_script(argv[i]))
                args->script = argv[i];
        }
    } else if (args->cmd == CMD_RUN && dashdash && !args->target) {
        return errmsg_set(err, -EINVAL, "nothing after '--': name the command to run");
    }
    if (mem_given(args) > 1)
        return errmsg_set(err, -EINVAL,
                          "--mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive");
    if ((r = finish_counts(args, err)) < 0)
        return r;
    return finish_heartbeat(args, hb_seen, err);
}

/* --- sbatch's input environment variables ------------------------------------------------ */

/* The variables sbatch documents (man sbatch, INPUT ENVIRONMENT VARIABLES) of the options
 * gpurun has, with sbatch's meaning. Left out: SBATCH_GPU_BIND and SBATCH_EXPORT, whose
 * values mean other things to srun and sbatch than to gpurun's --gpu-bind and --export, and
 * the variables of options gpurun does not have. */
static const struct env_row {
    const char *var;
    const char *option; /* the long name of its row */
} env_rows[] = {
    {"SBATCH_ACCOUNT", "account"},
    {"SBATCH_ARRAY_INX", "array"},
    {"SBATCH_CONSTRAINT", "constraint"},
    {"SBATCH_CPUS_PER_GPU", "cpus-per-gpu"},
    {"SBATCH_EXCLUSIVE", "exclusive"},
    {"SBATCH_GPUS_PER_NODE", "gpus-per-node"},
    {"SBATCH_GRES", "gres"},
    {"SBATCH_JOB_NAME", "job-name"},
    {"SBATCH_MEM_PER_CPU", "mem-per-cpu"},
    {"SBATCH_MEM_PER_GPU", "mem-per-gpu"},
    {"SBATCH_MEM_PER_NODE", "mem"},
    {"SBATCH_OUTPUT", "output"},
    {"SBATCH_PARTITION", "partition"},
    {"SBATCH_NO_REQUEUE", "no-requeue"},
    {"SBATCH_QOS", "qos"},
    {"SBATCH_REQUEUE", "requeue"},
    {"SBATCH_RESERVATION", "reservation"},
    {"SBATCH_SIGNAL", "signal"},
    {"SBATCH_TIMELIMIT", "time"},
    {"SBATCH_WAIT", "wait"},
};
#define N_ENV_ROWS (sizeof(env_rows) / sizeof(env_rows[0]))

/* The value of variable name in envp, or NULL. */
static const char *env_value(char *const *envp, const char *name)
{
    size_t n = strlen(name);

    for (char *const *e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

int args_apply_env(struct gpurun_args *args, char *const *envp, struct errmsg *err)
{
    bool mem_flag = mem_given(args) > 0, gres_flag = args_given(args, "gres");
    const char *mem_vars[3];
    int n_mem = 0;

    for (size_t i = 0; i < N_ENV_ROWS; i++) {
        const struct opt_row *o = find_long(env_rows[i].option, strlen(env_rows[i].option));
        const char *val = env_value(envp, env_rows[i].var);
        size_t row = (size_t)(o - opts);
        int r;

        if (!val || given_has(args, row) || (o->kind == ARG_MEM && mem_flag))
            continue;
        if (o->kind == ARG_MEM) {
            mem_vars[n_mem++] = env_rows[i].var;
            if (n_mem > 1)
                return errmsg_set(err, -EINVAL,
                                  "%s and %s are mutually exclusive (give one, or --mem, "
                                  "--mem-per-cpu or --mem-per-gpu)",
                                  mem_vars[0], mem_vars[1]);
        }
        /* A flag's variable sets it whatever its value, as sbatch's does. */
        r = set_value(args, o, o->long_name, o->kind == ARG_FLAG ? NULL : val, err);
        if (r < 0) {
            /* The flag's message, said of the variable: "--mem: ..." -> "SBATCH_MEM_PER_NODE: ...".
             */
            char text[sizeof(err->text)];
            size_t skip = 2 + strlen(o->long_name);
            snprintf(text, sizeof(text), "%s", err->text);
            if (!strncmp(text, "--", 2) && !strncmp(text + 2, o->long_name, skip - 2) &&
                text[skip] == ':')
                return errmsg_set(err, -EINVAL, "%s%s", env_rows[i].var, text + skip);
            return errmsg_set(err, -EINVAL, "%s: %s", env_rows[i].var, text);
        }
        given_set(args, row);
    }
    /* SBATCH_GRES's GPUs count the ranks per node as --gres's would, where no option or
     * SBATCH_GPUS_PER_NODE counted them. */
    if (!gres_flag && args->gres_gpus && !args_given(args, "gpus-per-node")) {
        args->spec.nprocs = args->gres_gpus;
        set_given(args, "gpus-per-node");
    }
    return 0;
}

void args_env_usage(FILE *out)
{
    for (size_t i = 0; i < N_ENV_ROWS; i++)
        fprintf(out, "  %-28s --%s\n", env_rows[i].var, env_rows[i].option);
}

const char *args_slurm_only_given(const struct gpurun_args *args)
{
    for (size_t i = 0; i < N_OPTS; i++)
        /* A --gres of GPUs alone is a count --local takes (counts[]). */
        if ((opts[i].flags & OPT_SLURM) && given_has(args, i) &&
            !(opts[i].kind == ARG_GRES && !args->gres))
            return opts[i].long_name;
    return NULL;
}

bool args_given(const struct gpurun_args *args, const char *long_name)
{
    const struct opt_row *o = find_long(long_name, strlen(long_name));

    return o && given_has(args, (size_t)(o - opts));
}

/* Column of the help texts: two blanks, the option in 28, one blank. */
#define HELP_INDENT 31

/* Help lines wrap before this column. */
#define HELP_WIDTH 92

/* Writes text, each line after the first indented to the help column. */
static void put_help(FILE *out, const char *text)
{
    for (const char *p = text; *p; p++) {
        fputc(*p, out);
        if (*p == '\n')
            fprintf(out, "%*s", HELP_INDENT, "");
    }
}

/* gpurun's subcommands, a line each, from their rows. */
static void usage_subcommands(FILE *out)
{
    fprintf(out,
            "\nsubcommands ('gpurun help SUBCOMMAND' or 'gpurun SUBCOMMAND --help' for more):\n");
    for (int c = 0; c < CMD_COUNT; c++)
        if (cmds[c].brief)
            fprintf(out, "  %-28s %s\n", cmds[c].name, cmds[c].brief);
}

/* The torchrun spellings cmd takes: each alias on a line, then the refused ones. */
static void usage_aliases(FILE *out, enum gpurun_cmd cmd)
{
    int col = 0;

    if (cmd != CMD_RUN)
        return;
    fprintf(out, "\ntorchrun's spellings (with '_' or '-'):\n");
    for (size_t i = 0; i < N_ALIASES; i++) {
        const struct alias_row *a = &aliases[i];
        const struct opt_row *o =
            a->canonical ? find_long(a->canonical, strlen(a->canonical)) : NULL;
        char left[64];
        if (!o)
            continue;
        snprintf(left, sizeof(left), "    --%s%s%s", a->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        /* One too long for its column goes on a line of its own, as an option's does. */
        fprintf(out, "  %-28s%s same as --%s (%s)\n", left,
                strlen(left) < 28 ? "" : "\n" ALIAS_INDENT, o->long_name, a->note);
    }
    for (size_t i = 0; i < N_ALIASES; i++) {
        const char *name = aliases[i].name;
        if (aliases[i].canonical)
            continue;
        if (col == 0)
            col = fprintf(out, "  refused, as gpurun does it itself:");
        else if (col + (int)strlen(name) + 4 > HELP_WIDTH)
            col = fprintf(out, ",\n   ");
        else
            col += fprintf(out, ",");
        col += fprintf(out, " --%s", name);
    }
    if (col)
        fprintf(out, "\n");
}

/* " [DEFAULT]" of row o (def: the defaults) into buf (n bytes), or "". A default out of the
 * range (0: not given) is no value the option could take; a help that says its default in
 * words ("default 64", "the default") says it once. */
static void default_text(char *buf, size_t n, const struct opt_row *o,
                         const struct gpurun_args *def)
{
    const void *field = (const char *)def + o->offset;

    buf[0] = '\0';
    if (strstr(o->help, "default"))
        return;
    if ((o->kind == ARG_INT || o->kind == ARG_GPUS) && *(const int *)field >= o->min &&
        *(const int *)field <= o->max) {
        snprintf(buf, n, " [%d]", *(const int *)field);
    } else if (o->kind == ARG_SECONDS && o->offset != FIELD(spec.hb_timeout_ms)) {
        char s[32];
        format_ms(s, sizeof(s), *(const int *)field);
        snprintf(buf, n, " [%s]", s);
    } else if (o->kind == ARG_LOGLEVEL) {
        snprintf(buf, n, " [%s]", def->log_level_name);
    } else if (o->kind == ARG_CHOICE) {
        for (const struct choice *c = o->choices; c->word; c++) {
            if (c->listed && c->value == *(const int *)field) {
                snprintf(buf, n, " [%s]", c->word);
                break;
            }
        }
    }
}

void args_usage(FILE *out, enum gpurun_cmd cmd)
{
    struct gpurun_args def;

    args_init(&def);
    fprintf(out, "usage: %s\n\n%s\n", cmds[cmd].usage, cmds[cmd].summary);
    if (cmd == CMD_RUN)
        usage_subcommands(out);
    fprintf(out, "\noptions:\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt_row *o = &opts[i];
        char left[64], dflt[48];

        if (!(o->cmds & (1u << cmd)))
            continue;
        snprintf(left, sizeof(left), "%c%c%c --%s%s%s", o->short_name ? '-' : ' ',
                 o->short_name ? o->short_name : ' ', o->short_name ? ',' : ' ', o->long_name,
                 o->metavar && o->kind != ARG_OPT_CHOICE ? " " : "", o->metavar ? o->metavar : "");
        default_text(dflt, sizeof(dflt), o, &def);
        /* An option too long for its column gets a line of its own: the help stays in
         * the help column. */
        if (strlen(left) > HELP_INDENT - 3)
            fprintf(out, "  %s\n%*s", left, HELP_INDENT, "");
        else
            fprintf(out, "  %-*s ", HELP_INDENT - 3, left);
        put_help(out, o->help);
        fprintf(out, "%s\n", dflt);
    }
    usage_aliases(out, cmd);
    if (cmd == CMD_RUN) {
        fprintf(out, "\nsbatch's variables, each for its option where no flag gives it (flag >\n"
                     "variable > train.cfg [job] > default; not with --local):\n");
        args_env_usage(out);
    }
    if (cmd == CMD_RUN)
        fprintf(out, "\nexit status: the job's own; 124 time limit, 125 gpurun failed, 126 cannot\n"
                     "execute, 127 command not found, 128+N gpurun killed by signal N.\n");
    args_release(&def);
}
