/* Signal names for messages: "SIGKILL", or "signal 42" for one without a name. */
#ifndef GPURUN_SIGNAME_H
#define GPURUN_SIGNAME_H

#include <stddef.h>

#define SIGNAME_LEN 16

/* Writes the name of sig into out (at least SIGNAME_LEN bytes) and returns out. */
char *signame(int sig, char out[SIGNAME_LEN]);

#endif
