/* The script a command runs, read for the rules that judge a job by what its script uses:
 * whether it uses Horovod (client/horovod.h), how its ranks could have met
 * (daemon/together.h). */
#ifndef GPURUN_SCRIPTHEAD_H
#define GPURUN_SCRIPTHEAD_H

#include <stddef.h>

/* The most of a script script_head reads: an import sits near the top, and a script of more
 * is data, not a training script. */
#define SCRIPT_HEAD_MAX (256 * 1024)

/* The script the command argv (argc words, borrowed) runs, read into buf (cap bytes, at most
 * SCRIPT_HEAD_MAX of it): the first word ending in ".py" that names a regular file, else
 * argv[0] when it names a regular file that starts with "#!"; a relative path is taken from
 * dir (the ranks' working directory; NULL: this process's). Returns the bytes read, or 0 when
 * there is no such file or it cannot be read. */
size_t script_head(const char *dir, char *const *argv, int argc, char *buf, size_t cap);

#endif
