/* libllmt version. CMake reads the three numbers below; keep their form. */
#ifndef LLMT_VERSION_H
#define LLMT_VERSION_H

#define LLMT_VERSION_MAJOR 0
#define LLMT_VERSION_MINOR 1
#define LLMT_VERSION_PATCH 0

#define LLMT_VERSION_NUMBER \
    (LLMT_VERSION_MAJOR * 10000 + LLMT_VERSION_MINOR * 100 + LLMT_VERSION_PATCH)

#define LLMT_STRINGIFY_(x) #x
#define LLMT_STRINGIFY(x) LLMT_STRINGIFY_(x)
#define LLMT_VERSION_STRING                                                    \
    LLMT_STRINGIFY(LLMT_VERSION_MAJOR) "." LLMT_STRINGIFY(LLMT_VERSION_MINOR) \
        "." LLMT_STRINGIFY(LLMT_VERSION_PATCH)

#endif
