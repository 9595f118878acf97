/* A rank's line not yet ended, on the merged stream: when it is shown as it stands, and which
 * of its bytes each showing and its end write. A terminal draws each showing over the last
 * (a '\r' redraw), so it gets the whole line each time; a file or a pipe keeps every byte it
 * is given, so it gets each byte once: the line so far as a labelled line of its own, and
 * what the rank adds to it later as another (docs/design.md, section 4). Pure functions. */
#ifndef GPURUN_LINEPART_H
#define GPURUN_LINEPART_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How long a line waits without its end, no byte of the rank's coming meanwhile, before a
 * terminal shows it as it stands: a progress bar that draws '\r' first and its text after is
 * then seen as it moves, not one step late. */
#define LINEPART_TTY_MS  100
/* The same for a file or a pipe (a batch output file under tail -f), where each showing stays
 * for good: long enough that a line a rank writes in pieces, as print() does (the text, then
 * its newline), is never cut in two by a moment's pause, short enough to be seen at once. */
#define LINEPART_FILE_MS 300

/* What linepart_due() picked: line[from..to) goes to the stream now. */
struct linepart {
    size_t from, to;
};

/* Whether line[0..len), a line without its end of which the stream has shown line[0..shown)
 * (shown <= len), is due to be shown now, quiet_ms after the rank's last bytes came, to a
 * terminal (tty) or not. A showing never ends inside a character: bytes of one still coming
 * wait for it. When due, fills *p: on a terminal the whole line so far ([0..to)), else the
 * bytes not shown yet ([shown..to)). */
bool linepart_due(const char *line, size_t len, size_t shown, int64_t quiet_ms, bool tty,
                  struct linepart *p);

/* Where the stream's copy of a line of which line[0..shown) was shown starts at its end (a
 * newline, or a '\r' that starts a redraw): 0 on a terminal, which draws the whole line over
 * what it showed, else shown. */
size_t linepart_rest(size_t shown, bool tty);

#endif
