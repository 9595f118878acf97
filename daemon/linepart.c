/* A rank's line not yet ended, on the merged stream (linepart.h). */
#include "linepart.h"
#include "utf8.h"
#include "banned.h"

bool linepart_due(const char *line, size_t len, size_t shown, int64_t quiet_ms, bool tty,
                  struct linepart *p)
{
    /* 0x80 continues any character begun at the end of line: the cut then comes before it. */
    size_t whole = utf8_cut_len(line, len, 0x80);

    if (quiet_ms < (tty ? LINEPART_TTY_MS : LINEPART_FILE_MS) || whole <= shown)
        return false;
    p->from = linepart_rest(shown, tty);
    p->to = whole;
    return true;
}

size_t linepart_rest(size_t shown, bool tty)
{
    return tty ? 0 : shown;
}
