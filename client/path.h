/* Paths as gpurun's commands handle them: made absolute, since a job's paths travel to other
 * nodes and to daemons that run elsewhere; joined without being cut. */
#ifndef GPURUN_CLIENT_PATH_H
#define GPURUN_CLIENT_PATH_H

#include <stdbool.h>
#include <stddef.h>

/* Writes path (borrowed) made absolute against the working directory to buf (n bytes); an
 * absolute path is copied as it is. Returns 0, -ENAMETOOLONG when it does not fit, or
 * getcwd's negative errno. */
int path_absolute(const char *path, char *buf, size_t n);

/* Writes "a/b" (both borrowed) to buf (n bytes). Returns false when it does not fit. */
bool path_join(char *buf, size_t n, const char *a, const char *b);

/* Whether path (borrowed) is a directory, or a link to one. */
bool path_is_dir(const char *path);

#endif
