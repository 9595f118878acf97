/* The rank shim: how the agent starts a rank.
 *   gpurun-shim --exec-rank AGENT_PID [--alive-fd FD --alive-ms MS] [--cgroup DIR]
 *               [--mark MARK] -- CMD...
 * (gpurun-shim: daemon/shim/main.c, beside rendezvousd or in PREFIX/libexec/gpurun; where
 * there is none, rendezvousd itself takes the same arguments)
 * runs in the rank's new session, asks the kernel for a signal when the agent dies, starts
 * CMD as its child (in the cgroup DIR, made if need be, when given; with GPURUN_JOB_MARK=MARK,
 * jobmark.h, in its environment when given) and passes CMD's exit status on as its own. The
 * rank ends as a whole (its cgroup, else its process group; and, when its agent is lost,
 * every process carrying MARK) when:
 * - it exits: what it started (setsid or not) ends with it;
 * - the agent dies outright (SIGKILL, OOM): the parent-death signal, or end of file on FD;
 * - the agent stops answering (SIGSTOP, a stalled loop): no byte on FD for MS milliseconds
 *   (the agent writes one per heartbeat). Then the shim says so on stderr (the rank's log).
 * After an agent's death the shim also removes the rank's cgroup, and the job's (DIR's
 * parent) when it was the last, and dies of SIGKILL with the rest of its group.
 *
 * A warm shim, started by the agent before its rank is known (while the node joins), ends its
 * arguments with "--spec-fd FD" in place of the rank's: it reads FD to its end, then goes on
 * as above with the arguments and the environment it read (the count of arguments, each, the
 * count of environment entries, each, all ended by a NUL: every word after --alive-ms MS).
 * FD ending empty means no rank came: the shim exits 0, having started nothing. */
#ifndef GPURUN_SHIM_H
#define GPURUN_SHIM_H

#define SHIM_FLAG "--exec-rank"

/* What begins a rank's line when gpurun could not fork its process (the agent's fork of the
 * shim, or the shim's of the rank): the node refused a process (its limit on processes, its
 * memory), so the leader classes the failure as the node's and says the fork failed. */
#define SPAWN_FORK_FAILED "gpurun: cannot fork"

/* The shim's main: argv[1] is SHIM_FLAG. Returns (or exits with) CMD's status: its exit
 * code, the same signal re-raised, 127 when CMD is not found, 126 when it cannot run, 125
 * on a usage error or a fork the node refused (SPAWN_FORK_FAILED). */
int shim_main(int argc, char **argv);

#endif
