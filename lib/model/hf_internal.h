/* Hugging Face model directories (LlamaForCausalLM): file names and the
 * config.json mapping shared by import (hf_import.c) and export
 * (hf_export.c). */
#ifndef LLMT_MODEL_HF_INTERNAL_H
#define LLMT_MODEL_HF_INTERNAL_H

#include "llmt/model.h"

#define LLMT_HF_CONFIG "config.json"
#define LLMT_HF_WEIGHTS "model.safetensors"
#define LLMT_HF_INDEX "model.safetensors.index.json"

/* Reads dir/config.json into *cfg (precision FP32): refuses what this library
 * does not implement with LLMT_EUNSUPPORTED and what is malformed with
 * LLMT_ECORRUPT, naming the file and the key. Not yet validated as a
 * configuration (llmt_model_create does that). */
int llmt_hf_config_read(const char *dir, llmt_model_config *cfg);

/* Writes cfg as config.json at path (synced), with torch_dtype from dtype and
 * the BOS/EOS ids of opts. */
int llmt_hf_config_write(const char *path, const llmt_model_config *cfg,
                         const llmt_hf_export_options *opts);

/* Whether dir holds a config.json (what makes it a Hugging Face directory). */
int llmt_hf_is_model_dir(const char *dir);

#endif
