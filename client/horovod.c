/* Whether a job uses horovod (horovod.h): a rule on the command and its script's text, and
 * the reading of that text. A false "yes" costs one port that serves the job's own hosts only;
 * a false "no" leaves hvd.init() without a rendezvous, so the rule errs towards yes. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "horovod.h"
#include "scripthead.h"
#include "banned.h"

static bool mentions(const char *p, size_t n)
{
    static const char word[] = "horovod";
    const size_t w = sizeof(word) - 1;

    for (size_t i = 0; n >= w && i <= n - w; i++)
        if (!strncasecmp(p + i, word, w))
            return true;
    return false;
}

bool horovod_seen(char *const *argv, int argc, const char *text, size_t n)
{
    for (int i = 0; i < argc; i++)
        if (argv[i] && mentions(argv[i], strlen(argv[i])))
            return true;
    return text && mentions(text, n);
}

int horovod_decide(int choice, char *const *argv, int argc)
{
    char *text;
    size_t n;
    bool seen;

    if (choice != HOROVOD_AUTO)
        return choice == HOROVOD_ON;
    if (horovod_seen(argv, argc, NULL, 0))
        return 1;
    text = malloc(SCRIPT_HEAD_MAX);
    if (!text)
        return 1; /* unsure: yes, the cheaper mistake */
    n = script_head(NULL, argv, argc, text, SCRIPT_HEAD_MAX);
    seen = horovod_seen(argv, argc, text, n);
    free(text);
    return seen;
}
