/* Shared includes and helpers of the CMocka unit tests. */
#ifndef LLMT_TEST_UTIL_H
#define LLMT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include <string.h>

/* Fails the test unless haystack contains needle, printing both. */
#define assert_contains(haystack, needle)                                                 \
    do {                                                                                  \
        const char *h_ = (haystack), *n_ = (needle);                                      \
        if (!strstr(h_, n_))                                                              \
            fail_msg("expected \"%s\" to contain \"%s\"", h_, n_);                        \
    } while (0)

#endif
