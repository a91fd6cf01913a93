/* Double-precision reference LLaMA: plain loops, no shortcuts, following
 * transformers' modeling_llama.py (RMSNorm, rotate_half RoPE, repeat_kv GQA,
 * causal softmax, SwiGLU MLP, final norm, LM head, cross-entropy). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama_ref.h"

int ref_weights_from_model(llmt_model *m, ref_weights *w)
{
    memset(w, 0, sizeof *w);
    llmt_model_get_config(m, &w->cfg);
    w->count = llmt_model_num_tensors(m);
    w->names = calloc((size_t)w->count, sizeof *w->names);
    w->data = calloc((size_t)w->count, sizeof *w->data);
    w->numel = calloc((size_t)w->count, sizeof *w->numel);
    for (int32_t i = 0; i < w->count; i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        if (llmt_model_tensor_info(m, i, &info))
            return -1;
        w->names[i] = strdup(info.name);
        w->numel[i] = info.numel;
        float *tmp = malloc((size_t)info.numel * sizeof *tmp);
        w->data[i] = malloc((size_t)info.numel * sizeof(double));
        if (llmt_model_get_param(m, info.name, tmp, (size_t)info.numel))
            return -1;
        for (int64_t j = 0; j < info.numel; j++)
            w->data[i][j] = tmp[j];
        free(tmp);
    }
    return 0;
}

void ref_weights_free(ref_weights *w)
{
    for (int32_t i = 0; i < w->count; i++) {
        free(w->names[i]);
        free(w->data[i]);
    }
    free(w->names);
    free(w->data);
    free(w->numel);
}

double *ref_tensor(const ref_weights *w, const char *name)
{
    for (int32_t i = 0; i < w->count; i++)
        if (strcmp(w->names[i], name) == 0)
            return w->data[i];
    fprintf(stderr, "ref_tensor: no tensor %s\n", name);
    abort();
}

static double *layer_tensor(const ref_weights *w, int layer, const char *suffix)
{
    char name[128];
    snprintf(name, sizeof name, "model.layers.%d.%s", layer, suffix);
    return ref_tensor(w, name);
}

/* y[n] = x[k] W[n][k]^T  (a torch Linear without bias) */
static void linear(double *y, const double *x, const double *W, int n, int k)
{
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < k; j++)
            s += x[j] * W[(size_t)i * k + j];
        y[i] = s;
    }
}

static void rmsnorm(double *y, const double *x, const double *w, int d, double eps)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++)
        y[i] = w[i] * (x[i] * r);
}

/* q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1) */
static void rope(double *v, int hd, int pos, double theta)
{
    int half = hd / 2;
    double out[1024];
    for (int i = 0; i < hd; i++) {
        int f = i % half;
        double inv_freq = pow(theta, -2.0 * f / hd);
        double c = cos(pos * inv_freq), s = sin(pos * inv_freq);
        double rot = i < half ? -v[i + half] : v[i - half];
        out[i] = v[i] * c + rot * s;
    }
    memcpy(v, out, (size_t)hd * sizeof *v);
}

double ref_forward(const ref_weights *w, const int32_t *tokens, const int32_t *targets,
                   int batch, int seq, double *logits)
{
    const llmt_model_config *c = &w->cfg;
    const int d = c->hidden_size, H = c->num_heads, KV = c->num_kv_heads, hd = d / H;
    const int F = c->ffn_size, V = c->vocab_size, L = c->num_layers;
    const double eps = c->rms_norm_eps;
    double *x = malloc(sizeof(double) * (size_t)seq * d);
    double *h = malloc(sizeof(double) * (size_t)seq * d);
    double *q = malloc(sizeof(double) * (size_t)seq * H * hd);
    double *k = malloc(sizeof(double) * (size_t)seq * KV * hd);
    double *v = malloc(sizeof(double) * (size_t)seq * KV * hd);
    double *o = malloc(sizeof(double) * (size_t)seq * H * hd);
    double *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F);
    double *tmp = malloc(sizeof(double) * (size_t)(d > V ? d : V));
    double *p = malloc(sizeof(double) * seq);
    double loss = 0;
    int counted = 0;
    const double *embed = ref_tensor(w, "model.embed_tokens.weight");
    const double *head = c->tie_embeddings ? embed : ref_tensor(w, "lm_head.weight");
    for (int b = 0; b < batch; b++) {
        for (int t = 0; t < seq; t++)
            memcpy(x + (size_t)t * d, embed + (size_t)tokens[b * seq + t] * d, sizeof(double) * d);
        for (int l = 0; l < L; l++) {
            const double *wq = layer_tensor(w, l, "self_attn.q_proj.weight");
            const double *wk = layer_tensor(w, l, "self_attn.k_proj.weight");
            const double *wv = layer_tensor(w, l, "self_attn.v_proj.weight");
            const double *wo = layer_tensor(w, l, "self_attn.o_proj.weight");
            for (int t = 0; t < seq; t++) {
                rmsnorm(h + (size_t)t * d, x + (size_t)t * d,
                        layer_tensor(w, l, "input_layernorm.weight"), d, eps);
                linear(q + (size_t)t * H * hd, h + (size_t)t * d, wq, H * hd, d);
                linear(k + (size_t)t * KV * hd, h + (size_t)t * d, wk, KV * hd, d);
                linear(v + (size_t)t * KV * hd, h + (size_t)t * d, wv, KV * hd, d);
                for (int hh = 0; hh < H; hh++)
                    rope(q + (size_t)t * H * hd + hh * hd, hd, t, c->rope_theta);
                for (int kh = 0; kh < KV; kh++)
                    rope(k + (size_t)t * KV * hd + kh * hd, hd, t, c->rope_theta);
            }
            for (int hh = 0; hh < H; hh++) {
                int kh = hh / (H / KV); /* repeat_kv */
                for (int i = 0; i < seq; i++) {
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= i; j++) {
                        double s = 0;
                        for (int e = 0; e < hd; e++)
                            s += q[(size_t)i * H * hd + hh * hd + e] *
                                 k[(size_t)j * KV * hd + kh * hd + e];
                        p[j] = s / sqrt((double)hd);
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    for (int j = 0; j <= i; j++)
                        sum += (p[j] = exp(p[j] - mx));
                    for (int e = 0; e < hd; e++) {
                        double acc = 0;
                        for (int j = 0; j <= i; j++)
                            acc += p[j] / sum * v[(size_t)j * KV * hd + kh * hd + e];
                        o[(size_t)i * H * hd + hh * hd + e] = acc;
                    }
                }
            }
            for (int t = 0; t < seq; t++) {
                linear(tmp, o + (size_t)t * H * hd, wo, d, H * hd);
                for (int i = 0; i < d; i++)
                    x[(size_t)t * d + i] += tmp[i];
                rmsnorm(h + (size_t)t * d, x + (size_t)t * d,
                        layer_tensor(w, l, "post_attention_layernorm.weight"), d, eps);
                linear(g, h + (size_t)t * d, layer_tensor(w, l, "mlp.gate_proj.weight"), F, d);
                linear(u, h + (size_t)t * d, layer_tensor(w, l, "mlp.up_proj.weight"), F, d);
                for (int i = 0; i < F; i++)
                    g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
                linear(tmp, g, layer_tensor(w, l, "mlp.down_proj.weight"), d, F);
                for (int i = 0; i < d; i++)
                    x[(size_t)t * d + i] += tmp[i];
            }
        }
        for (int t = 0; t < seq; t++) {
            rmsnorm(h, x + (size_t)t * d, ref_tensor(w, "model.norm.weight"), d, eps);
            linear(tmp, h, head, V, d);
            if (logits)
                memcpy(logits + ((size_t)b * seq + t) * V, tmp, sizeof(double) * V);
            int32_t target = targets ? targets[b * seq + t] : -1;
            if (target >= 0) {
                double mx = tmp[0], sum = 0;
                for (int i = 1; i < V; i++)
                    mx = tmp[i] > mx ? tmp[i] : mx;
                for (int i = 0; i < V; i++)
                    sum += exp(tmp[i] - mx);
                loss += mx + log(sum) - tmp[target];
                counted++;
            }
        }
    }
    free(x); free(h); free(q); free(k); free(v); free(o); free(g); free(u); free(tmp); free(p);
    return counted ? loss / counted : 0.0;
}
