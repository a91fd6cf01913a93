/* UTF-8 checking for text_print_escaped (text_escape.h). */
#include "text_escape.h"

/* The length of the valid UTF-8 sequence at s (1..4) within the `left`
 * bytes there, or 0 when the bytes are not one: a stray continuation byte,
 * an overlong form, a surrogate, a code point above U+10FFFF, or a sequence
 * cut short. */
static int utf8_length(const unsigned char *s, size_t left)
{
    if (s[0] < 0x80)
        return 1;
    int n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
            : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if ((size_t)n > left)
        return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))
        return 0;
    return n;
}

void text_print_escaped(FILE *f, const void *bytes, size_t n)
{
    const unsigned char *s = bytes, *end = s + n;
    while (s < end) {
        int len = utf8_length(s, (size_t)(end - s));
        if (*s == '\\')
            fputs("\\\\", f);
        else if (len == 0 || *s < 0x20 || *s == 0x7f)
            fprintf(f, "\\x%02x", *s);
        else if (s[0] == 0xc2 && s[1] < 0xa0) /* C1 controls U+0080..U+009F */
            fprintf(f, "\\x%02x\\x%02x", s[0], s[1]);
        else
            fwrite(s, 1, (size_t)len, f);
        s += len ? len : 1;
    }
}
