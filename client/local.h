/* gpurun --local: runs a job on this machine by starting one rendezvousd per node on loopback
 * and supervising them until the job's outcome is known (docs/design.md, section 2). */
#ifndef GPURUN_CLIENT_LOCAL_H
#define GPURUN_CLIENT_LOCAL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* Finds the file execvp() would run for name: a name with a '/' is a path, any other is
 * looked up in path (a PATH value, borrowed; NULL or "" means the system default). Writes
 * what it found to out (n bytes). Returns 0; -ENOENT when nothing matches; -EACCES when a
 * match is not an executable regular file (execvp's 126 case); -ENAMETOOLONG. */
int local_resolve(const char *name, const char *path, char *out, size_t n);

/* The GPUs --gpu-bind=single hands out in order on each node: the entries of a
 * CUDA_VISIBLE_DEVICES value (list, borrowed) as the daemon reads them (daemon/rankenv.c,
 * set_gpus), or 0 for NULL or "" (then local rank n gets device n, which is not counted). */
int local_gpu_list_count(const char *list);

/* Finds a program gpurun ships (name, borrowed: "rendezvousd", "gpurun-train"): first beside
 * self (the running gpurun's path, borrowed, e.g. from /proc/self/exe; NULL skips this), then
 * on path as local_resolve() does. Writes its absolute path with every link resolved
 * (realpath) to out, at most n bytes with the NUL. Returns 0; -ENOENT when neither place has
 * it as an executable file; -ENAMETOOLONG when its path does not fit in n bytes; the errno of
 * realpath when it cannot be resolved. */
int local_find_program(const char *name, const char *self, const char *path, char *out, size_t n);

/* The nodes (1..n-1) whose daemons the leader's record (summary, a parsed summary.json,
 * borrowed) judged lost or fenced: their ends tell nothing more of the job, and one stopped or
 * frozen (SIGSTOP) would never end by itself, its ranks running on, so gpurun kills them as
 * soon as the leader has ended. Marks them in out (n nodes); returns how many. */
int local_judged_nodes(const json_t *summary, bool *out, int n);

/* A local job whose dir is ready (job.json and key written). All strings borrowed. */
struct local_job {
    const char *job_dir;
    const char *job_id;    /* for the record gpurun writes when the leader wrote none */
    int world_size;        /* the same */
    const char *daemon;    /* rendezvousd's path */
    const char *log_level; /* passed to every daemon as --log-level */
    int nnodes;            /* daemons to start, node ranks 0..nnodes-1 */
    int out_fd;            /* the daemons' stdout and stderr; -1: gpurun's own */
    long time_limit_s;     /* stop the job (exit 124) after this long; 0: never */
    int preempt_signal;    /* sent preempt_before_s before the limit, as Slurm sends its
                            * pre-timeout signal: through the job dir to the leader, which
                            * records it (as the batch script does); 0: none */
    long preempt_before_s;
    int kill_grace_ms; /* the job's kill_grace: how long a stopped daemon may take */
};

/* Starts the job's daemons at once, all in gpurun's process group with gpurun's stdin and
 * environment, and waits for every one of them. SIGINT, SIGTERM and SIGHUP are forwarded to
 * the daemons (SIGHUP as SIGTERM; a signal from the terminal already reached them and is not
 * sent twice), as are SIGUSR1 and SIGUSR2. Must be called with no other children running:
 * it reaps any child. The daemons get --launcher-pid, so that they end the job when gpurun is
 * killed. Returns gpurun's exit status (summary.json's when the leader wrote a failure there,
 * else local_combine() of the daemons', 124
 * when the time limit ended the job, 125 when a daemon could not be started) and sets
 * *fatal_signal to the first SIGINT/SIGTERM/SIGHUP received (0: none), which the caller
 * should die of once it has cleaned up. Thread context: the process's only thread; the
 * signals above are blocked while it runs, and those received are consumed. */
int local_run(const struct local_job *job, int *fatal_signal);
/* One record always: when gpurun itself ended the job (a daemon it could not start, a node
 * whose daemon failed to start, its time limit), summary.json's outcome, exit status and
 * first failure are gpurun's cause, the leader's own first failure (the SIGTERM gpurun sent)
 * kept beside it as "leader_first_failure"; when the leader wrote no summary.json at all (it
 * was killed), gpurun writes one with what it saw, "recorded_by": "gpurun". */

/* The exit status a daemon's wait status stands for: its code, or 125 when it was killed by
 * a signal (a daemon passes its ranks' deaths on as codes; its own death is a failure). */
int local_exit_status(int wstatus);

/* gpurun's exit status from the daemons' (status[k] of node k, n of them): node 0's, since
 * the leader knows the job's outcome; if node 0 exited 0 while another did not, that one's
 * (the first), so that no failure is hidden. stopped[k] marks a daemon gpurun itself had to
 * stop, whose status says nothing about the job: it is skipped, and if node 0 was stopped the
 * first failure of another node is the result (125 when there is none). */
int local_combine(const int *status, const bool *stopped, int n);

#endif
