/* A list of ranks as a user writes it on a command line: "0", "0,2-3", "4-7,12" (torchrun's
 * --local-ranks-filter, Slurm's ranges). The text itself is what is kept (in job.json) and
 * read: no other form of it exists. Pure functions. */
#ifndef GPURUN_RANKLIST_H
#define GPURUN_RANKLIST_H

#include <stdbool.h>

#include "errmsg.h"

/* Checks that s is a list of items separated by commas, each a rank N or a range N-M with
 * N <= M, every rank 0..max. Returns 0, or -EINVAL with err filled ("'2-1' is not a range: 2
 * is past 1"), the item named. */
int ranklist_check(const char *s, int max, struct errmsg *err);

/* Whether rank is in s, a list ranklist_check() accepts (anything else holds no rank). */
bool ranklist_has(const char *s, int rank);

#endif
