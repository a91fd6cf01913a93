/* The CUDA backend's op table without a device, for planning. The plugin
 * exports, beside its entry point, a function that hands out its op table
 * without opening a device (cuda/cuda_backend.cu); libllmt loads the plugin
 * for it (lib/core/cuda_plugin.c). Only the table's size functions
 * (scratch_bytes, attention_saved_bytes, optim_scratch_bytes) may be called
 * on it: the other ops need an opened device. So a CUDA plan needs the plugin
 * and its libraries, but neither a GPU nor a driver. */
#ifndef LLMT_CORE_CUDA_PLUGIN_OPS_H
#define LLMT_CORE_CUDA_PLUGIN_OPS_H

#include "ops/ops.h"

#define LLMT_CUDA_PLUGIN_OPS_ENTRY "llmt_plugin_cuda_ops"

/* The plugin's function: checks host->abi (LLMT_EVERSION when it differs),
 * then writes the op table, which lives as long as the process. */
typedef int (*llmt_plugin_ops_fn)(const llmt_plugin_host *host, const llmt_backend_ops **out);

/* Loads the plugin as llmt_cuda_plugin_load does and writes its op table to
 * *out. LLMT_EUNSUPPORTED when the plugin cannot be loaded (or this build has
 * none), naming the file and the reason. */
int llmt_cuda_plugin_ops(const llmt_backend_ops **out);

#endif
