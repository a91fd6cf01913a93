/* libFuzzer target: the checkpoint MANIFEST parser. Inputs with an odd last
 * byte (a JSON body ends in '}') get a valid checksum trailer appended, so the fuzzer reaches the JSON
 * and field checks behind the checksum; the others are parsed as they are. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ckpt/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    llmt_manifest m;
    if (size && (data[size - 1] & 1)) {
        char *text = malloc(size + 24);
        memcpy(text, data, size);
        text[size] = '\n';
        snprintf(text + size + 1, 23, "xxh3:%016" PRIx64 "\n", XXH3_64bits(text, size + 1));
        if (llmt_manifest_parse(text, size + 23, &m) == 0)
            llmt_manifest_clear(&m);
        free(text);
    } else if (llmt_manifest_parse((const char *)data, size, &m) == 0) {
        llmt_manifest_clear(&m);
    }
    return 0;
}
