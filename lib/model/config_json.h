/* The model configuration as a JSON object, for safetensors metadata and
 * checkpoint manifests. */
#ifndef LLMT_MODEL_CONFIG_JSON_H
#define LLMT_MODEL_CONFIG_JSON_H

#include "llmt/model.h"
#include "util/json.h"

/* Writes cfg as an object {"vocab_size": ..., ...} at the writer's position;
 * the RoPE scaling fields only when cfg has scaling, so configurations
 * without it keep the text version 1 wrote. */
int llmt_model_config_write_json(llmt_jw *w, const llmt_model_config *cfg);

/* Reads an object written by llmt_model_config_write_json: every field
 * present with the right type, nothing else (the RoPE scaling fields are
 * present exactly when "rope_scaling" is, as "llama3"). LLMT_ECORRUPT names the field;
 * the result is not yet validated as a configuration. */
int llmt_model_config_read_json(const llmt_json *obj, llmt_model_config *cfg);

/* The first architecture field (all but precision) in which a and b differ,
 * or NULL when they agree; *va and *vb receive the two values as text. */
const char *llmt_model_config_mismatch(const llmt_model_config *a, const llmt_model_config *b,
                                       char *va, char *vb, size_t cap);

#endif
