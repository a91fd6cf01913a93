/* Round-trip formatting of doubles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/format.h"

/* The digits are written into a local buffer and copied out: GCC 12 with
 * the sanitizers at -O0 warns (-Wformat-truncation) that a parameter
 * passed to snprintf may be NULL. */
int llmt_format_double(char text[32], double v)
{
    char buf[32] = {0};
    int n = 0;
    for (int digits = 15; digits <= 17; digits++) {
        /* At most 24 characters: sign, 17 digits, point, e-308. */
        n = snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (n < 0 || n >= 32 || strtod(buf, NULL) == v)
            break;
    }
    memcpy(text, buf, sizeof buf);
    return n;
}

int llmt_format_float(char text[32], float v)
{
    char buf[32] = {0};
    int n = 0;
    for (int digits = 6; digits <= 9; digits++) {
        n = snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (n < 0 || n >= 32 || strtof(buf, NULL) == v)
            break;
    }
    memcpy(text, buf, sizeof buf);
    return n;
}
