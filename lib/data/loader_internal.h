/* What the library's other parts read of a loader. */
#ifndef LLMT_DATA_LOADER_INTERNAL_H
#define LLMT_DATA_LOADER_INTERNAL_H

#include "llmt/data.h"

/* The batch size and seq_len a loader serves (loader not NULL). */
void llmt_loader_shape(const llmt_loader *loader, int32_t *batch_size, int32_t *seq_len);

#endif
