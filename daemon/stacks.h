/* Finding what to ask for a rank's stack before a hang's teardown (docs/design.md, section 4).
 * A Python rank is sent SIGABRT: with PYTHONFAULTHANDLER set (the agent sets it unless the
 * user did, and knows which from the environment it gave the rank), faulthandler writes every
 * thread's traceback to stderr, that is to the rank's log, before the process dies. Any other rank
 * gets a native backtrace from eu-stack, else from gdb, where one is installed. The agent runs the
 * tool and collects its output; this module only finds the process and the tool. */
#ifndef GPURUN_STACKS_H
#define GPURUN_STACKS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "jobmark.h"

struct stack_target {
    pid_t pid;   /* the process whose stack stands for the rank */
    bool python; /* it runs a Python interpreter */
};

/* Finds the target among the descendants of root (the rank's shim), breadth first: the
 * first Python process, else root's first child (the rank's command itself). Reads /proc.
 * Returns 0, or -ESRCH when root has no child. */
int stacks_find_target(pid_t root, struct stack_target *t);

/* Finds a Python process whose environment carries a mark of want's rank (jobmark.h): a
 * rank in a container, whose processes are no descendants of its shim (podman's conmon
 * starts them). Reads /proc. Returns 0, or -ESRCH when there is none. */
int stacks_find_marked(const struct jobmark *want, struct stack_target *t);

/* The command line that prints every thread's backtrace of pid: eu-stack if it is on PATH,
 * else gdb in batch mode. argv (at least 12 slots) points into buf (cap bytes); *tool is
 * the tool's name. Returns 0, or -ENOENT when neither is installed. */
int stacks_tool_argv(pid_t pid, char *buf, size_t cap, char **argv, const char **tool);

#endif
