/* The agent's private directory for its rank socket (agent.sock) and the ranks' error files:
 * "<tmp>/gpurun-<pid>-XXXXXX", mode 0700. An agent killed by SIGKILL cannot remove its own,
 * so every agent first sweeps the directories of agents of this user that are gone. */
#ifndef GPURUN_SOCKDIR_H
#define GPURUN_SOCKDIR_H

#include <stddef.h>

/* Removes from tmp the directories named gpurun-<pid>-XXXXXX that belong to this user, are
 * real directories (not links), whose pid is not a live process and whose agent.sock, if
 * any, accepts no connection; with their files (never a subdirectory: such a directory is
 * not ours and stays). Returns how many it removed, or a negative errno when tmp cannot be
 * read. Thread context: the agent's loop thread; it blocks on the file system only. */
int sockdir_sweep(const char *tmp);

/* Creates a fresh 0700 directory "<tmp>/gpurun-<pid>-XXXXXX" for this process, and writes
 * its path to out (cap bytes). Returns 0, -ENAMETOOLONG, or mkdtemp's negative errno. */
int sockdir_create(const char *tmp, char *out, size_t cap);

#endif
