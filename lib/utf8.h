/* UTF-8 for text that goes on the wire or into a JSON record from a source that promises
 * nothing: a rank's output, a stack, a hostname. JSON (and jansson) hold only valid UTF-8, so
 * such text is made valid before it is packed, never after a refusal. */
#ifndef GPURUN_UTF8_H
#define GPURUN_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* What stands for a byte that does not begin a valid sequence: U+FFFD, 3 bytes. */
#define UTF8_REPLACEMENT     "\xef\xbf\xbd"
#define UTF8_REPLACEMENT_LEN 3

/* The length of the valid UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF) that starts at s, of the n bytes there; 0 when none starts there (an invalid
 * or cut sequence, or n == 0). NUL is a valid 1-byte sequence here. */
size_t utf8_seq_len(const unsigned char *s, size_t n);

/* Whether the n bytes at s are valid UTF-8 and hold no NUL. */
bool utf8_is_valid(const char *s, size_t n);

/* Copies the n bytes at src into dst (cap bytes, cap >= 1) as valid UTF-8 without NUL: each
 * byte that begins no valid sequence, and each NUL, becomes UTF8_REPLACEMENT; the copy ends at
 * the last whole character that fits in cap - 1 bytes. dst is NUL-terminated. Returns the
 * bytes written, the NUL not counted. */
size_t utf8_sanitize(char *dst, size_t cap, const char *src, size_t n);

/* The longest escape utf8_escape_controls() writes for one byte or character ("\u009b"). */
#define UTF8_ESCAPE_MAX 6

/* Copies the n bytes at src into dst (cap bytes, cap >= 1) as text that a terminal shows and
 * never obeys: valid UTF-8 without control characters, for gpurun's own lines that quote what
 * a rank printed (a failing rank's last lines, its exception). Each C0 control but tab (a
 * newline too: a record is one line), DEL, and each byte that begins no valid sequence become
 * "\xHH" (ESC is "\x1b"); each C1 control character (U+0080..U+009F, which some terminals
 * obey as ESC [ and the like) becomes "\u00HH"; the rest is copied. The copy ends at the last
 * whole escape or character that fits in cap - 1 bytes; dst is NUL-terminated. Returns the
 * bytes written, the NUL not counted. */
size_t utf8_escape_controls(char *dst, size_t cap, const char *src, size_t n);

/* Where to cut the n bytes at s, which the byte next goes on, so that no character is split:
 * n, or, when next continues a character begun in s (a lead byte at most 3 bytes back), the
 * start of that character. Bytes that are not UTF-8 are cut anywhere (n). */
size_t utf8_cut_len(const char *s, size_t n, unsigned char next);

/* The length of the longest prefix of the NUL-terminated s that is at most max bytes and
 * ends on a character boundary (where s is valid UTF-8; a stray continuation byte counts as
 * a character of its own). For cutting valid text to a limit. */
size_t utf8_prefix_len(const char *s, size_t max);

#endif
