/* The Python of a SCRIPT.py run: which interpreter the ranks run the script with (--python's,
 * else the active virtual environment's, else python3 on each node's PATH), and the line
 * gpurun adds when a rank failed because that Python lacks a module. */
#ifndef GPURUN_CLIENT_PYTHON_H
#define GPURUN_CLIENT_PYTHON_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

/* The interpreter of a SCRIPT.py when neither --python nor a venv names one. */
#define PYTHON_DEFAULT "python3"

/* Where the interpreter came from, for the messages that name it. */
enum python_source {
    PYTHON_GIVEN, /* --python */
    PYTHON_VENV,  /* $VIRTUAL_ENV/bin/python */
    PYTHON_PATH,  /* PYTHON_DEFAULT, found on each node's PATH */
};

struct python_choice {
    char path[PATH_MAX]; /* what the ranks exec: a path, or a name looked up on PATH */
    enum python_source source;
};

/* Chooses the interpreter into c: given (--python's value, borrowed; NULL: none), made
 * absolute against the working directory when it holds a '/' (a bare name is looked up on
 * each node's PATH, as any command); else venv (VIRTUAL_ENV's value, borrowed; NULL or "":
 * none) followed by "/bin/python", the name an activated venv puts first on PATH; else
 * PYTHON_DEFAULT. Links are not resolved: a venv's python is a link to the base interpreter,
 * and only run through the link does it find the venv's packages. Returns 0, or
 * -ENAMETOOLONG, or getcwd's negative errno. */
int python_choose(struct python_choice *c, const char *given, const char *venv);

/* The module a failed job's first failure could not import, from summary (summary.json,
 * borrowed): ModuleNotFoundError in the rank's error record (torch's @record), else the last
 * "ModuleNotFoundError: No module named 'X'" line in the tail of its log. Writes X to module
 * (n bytes) and the rank to *rank. Returns false when the failure is another. */
bool python_missing_module(const json_t *summary, char *module, size_t n, int *rank);

/* Whether the first failure of summary (borrowed) is a rank's that ended looking for
 * torch.distributed.launch's --local_rank (or --local-rank) in its arguments: the last
 * lines of its log name it (an argparse error, a traceback's assert on args.local_rank).
 * Writes the rank to *rank. */
bool python_wants_local_rank(const json_t *summary, int *rank);

/* Writes the line that says which Python rank ran without module, and how to choose another
 * ("gpurun: rank 0 has no module 'torch' in Python '...' (...): ..."), to out. found is the
 * path PYTHON_DEFAULT resolves to here, for PYTHON_PATH (NULL: not known). */
void python_print_missing(FILE *out, const struct python_choice *c, const char *found,
                          const char *module, int rank);

#endif
