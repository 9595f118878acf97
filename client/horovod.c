/* Whether a job uses horovod (horovod.h): a rule on the command and its script's text, and
 * the reading of that text. A false "yes" costs one port that serves the job's own hosts only;
 * a false "no" leaves hvd.init() without a rendezvous, so the rule errs towards yes. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "horovod.h"
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

/* Reads the regular file path into buf (cap bytes at most): the bytes read, or 0. */
static size_t read_head(const char *path, char *buf, size_t cap)
{
    struct stat st;
    size_t len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

    if (fd < 0)
        return 0;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    while (len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    return len;
}

static bool ends_in_py(const char *s)
{
    size_t n = strlen(s);

    return n > 3 && !strcmp(s + n - 3, ".py");
}

size_t horovod_script_text(char *const *argv, int argc, char *buf, size_t cap)
{
    size_t n;

    if (cap > HOROVOD_SCRIPT_MAX)
        cap = HOROVOD_SCRIPT_MAX;
    for (int i = 0; i < argc; i++)
        if (argv[i] && ends_in_py(argv[i]) && (n = read_head(argv[i], buf, cap)) > 0)
            return n;
    if (argc > 0 && argv[0] && (n = read_head(argv[0], buf, cap)) > 2 && !memcmp(buf, "#!", 2))
        return n;
    return 0;
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
    text = malloc(HOROVOD_SCRIPT_MAX);
    if (!text)
        return 1; /* unsure: yes, the cheaper mistake */
    n = horovod_script_text(argv, argc, text, HOROVOD_SCRIPT_MAX);
    seen = horovod_seen(argv, argc, text, n);
    free(text);
    return seen;
}
