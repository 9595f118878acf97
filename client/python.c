/* The interpreter of a SCRIPT.py, and the hint for a rank that could not import a module:
 * "No module named 'torch'" from a job run with the wrong Python is a common first-day
 * failure, and the fix is to name the Python that has it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "path.h"
#include "python.h"
#include "banned.h"

int python_choose(struct python_choice *c, const char *given, const char *venv)
{
    if (given) {
        c->source = PYTHON_GIVEN;
        if (strchr(given, '/'))
            return path_absolute(given, c->path, sizeof(c->path));
        return snprintf(c->path, sizeof(c->path), "%s", given) < (int)sizeof(c->path)
                   ? 0
                   : -ENAMETOOLONG;
    }
    if (venv && *venv) {
        c->source = PYTHON_VENV;
        return snprintf(c->path, sizeof(c->path), "%s/bin/python", venv) < (int)sizeof(c->path)
                   ? 0
                   : -ENAMETOOLONG;
    }
    c->source = PYTHON_PATH;
    snprintf(c->path, sizeof(c->path), "%s", PYTHON_DEFAULT);
    return 0;
}

/* Python's words for a module that cannot be found (ModuleNotFoundError's message). */
#define NO_MODULE "No module named '"

/* The module named in text after NO_MODULE at p, into module (n bytes). */
static bool module_name(const char *p, char *module, size_t n)
{
    size_t len;

    p += strlen(NO_MODULE);
    len = strcspn(p, "'\n");
    if (len == 0 || p[len] != '\'')
        return false;
    snprintf(module, n, "%.*s", (int)len, p);
    return true;
}

bool python_missing_module(const json_t *summary, char *module, size_t n, int *rank)
{
    static const char line[] = "ModuleNotFoundError: " NO_MODULE;
    const json_t *ff = json_object_get(summary, "first_failure");
    const json_t *err = json_object_get(ff, "error");
    const char *type = json_string_value(json_object_get(err, "type"));
    const char *msg = json_string_value(json_object_get(err, "message"));
    const char *tail = json_string_value(json_object_get(ff, "tail")), *last = NULL;

    if (!json_is_integer(json_object_get(ff, "rank")))
        return false;
    *rank = (int)json_integer_value(json_object_get(ff, "rank"));
    if (type && msg && !strcmp(type, "ModuleNotFoundError") &&
        !strncmp(msg, NO_MODULE, strlen(NO_MODULE)))
        return module_name(msg, module, n);
    /* The traceback's last line names the exception that ended the rank; an earlier one may
     * have been caught. */
    for (const char *p = tail; p && (p = strstr(p, line)); p++)
        if (p == tail || p[-1] == '\n')
            last = p;
    return last && module_name(last + strlen(line) - strlen(NO_MODULE), module, n);
}

bool python_wants_local_rank(const json_t *summary, int *rank)
{
    const json_t *ff = json_object_get(summary, "first_failure");
    const char *tail = json_string_value(json_object_get(ff, "tail"));

    if (!json_is_integer(json_object_get(ff, "rank")) || !tail)
        return false;
    *rank = (int)json_integer_value(json_object_get(ff, "rank"));
    return strstr(tail, "local_rank") || strstr(tail, "local-rank");
}

void python_print_missing(FILE *out, const struct python_choice *c, const char *found,
                          const char *module, int rank)
{
    fprintf(out, "gpurun: rank %d has no module '%s' in Python '%s' ", rank, module, c->path);
    switch (c->source) {
    case PYTHON_GIVEN:
        fprintf(out, "(--python's): give --python the path of a Python that has it\n");
        break;
    case PYTHON_VENV:
        fprintf(out,
                "(the active venv's, VIRTUAL_ENV): install '%s' there, or choose another "
                "Python with --python PATH\n",
                module);
        break;
    case PYTHON_PATH:
        fprintf(out,
                "(the first on each node's PATH%s%s%s): activate the venv that has it, or "
                "choose a Python with --python PATH\n",
                found ? "; here '" : "", found ? found : "", found ? "'" : "");
        break;
    }
}
