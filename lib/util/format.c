/* Round-trip formatting of doubles. */
#include <stdio.h>
#include <stdlib.h>

#include "util/format.h"

int llmt_format_double(char text[32], double v)
{
    int n = 0;
    for (int digits = 15; digits <= 17; digits++) {
        /* At most 24 characters: sign, 17 digits, point, e-308. */
        n = snprintf(text, 32, "%.*g", digits, v);
        if (n < 0 || n >= 32 || strtod(text, NULL) == v)
            break;
    }
    return n;
}

int llmt_format_float(char text[32], float v)
{
    int n = 0;
    for (int digits = 6; digits <= 9; digits++) {
        n = snprintf(text, 32, "%.*g", digits, (double)v);
        if (n < 0 || n >= 32 || strtof(text, NULL) == v)
            break;
    }
    return n;
}
