/* Printing bytes that should be UTF-8 text, escaped where they are not. */
#ifndef LLMT_EXAMPLES_TEXT_ESCAPE_H
#define LLMT_EXAMPLES_TEXT_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

/* Writes bytes[0..n) to f: valid UTF-8 as it is, a backslash as "\\", and
 * every byte of an invalid sequence, a control character (C0, DEL, C1) or
 * NUL as "\xNN". */
void text_print_escaped(FILE *f, const void *bytes, size_t n);

#endif
