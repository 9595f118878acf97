/* gpurun logs for a job dir: the rank logs the daemons wrote under logs/. */
#ifndef GPURUN_CLIENT_LOGS_H
#define GPURUN_CLIENT_LOGS_H

#include <stdio.h>

/* One line: "no log of rank 7 in '/x/logs'". */
struct logs_error {
    char text[1024];
};

/* Prints the rank logs of job_dir (borrowed) to out. With rank >= 0, logs/rank-R.log as it
 * is; with rank < 0, every logs/rank-N.log in rank order, each line prefixed "[N] " as in the
 * merged stream of a running job. Returns 0, or a negative errno with err filled: -ENOENT
 * when there is no such log (or no logs/ at all). */
int logs_print(FILE *out, const char *job_dir, int rank, struct logs_error *err);

#endif
