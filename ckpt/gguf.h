/* GGUF reader (llama.cpp's single-file model format), versions 2 and 3,
 * little-endian files.
 *
 * File layout (all integers little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x    { string key | u32 value type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type
 *                 | u64 offset (from the data section start) }
 *   zero padding to `alignment` | data section
 * where string = u64 length + bytes (no NUL), an array value = u32 element
 * type + u64 count + elements, and alignment = general.alignment (u32, a
 * power of two) or 32. ne[0] is the innermost (contiguous) dimension, so a
 * Hugging Face [out, in] weight is stored with ne = {in, out}.
 *
 * The file is memory-mapped read-only and every length, count and offset is
 * checked against the bytes that remain before anything is allocated from
 * it; a malformed file is an error naming the file, what was being read and
 * the byte offset, logged once, and gguf_open fails with BT_ERR_INVALID (bad
 * bytes), BT_ERR_UNSUPPORTED (valid but not handled: version 1, big-endian,
 * unknown ggml type), BT_ERR_IO or BT_ERR_NOMEM. Metadata strings and tensor
 * data point into the mapping and live until gguf_close.
 *
 *   gguf_t *g;
 *   if (gguf_open("m.gguf", &g) != BT_OK) return ...;
 *   int64_t n; gguf_get_i64(g, "llama.block_count", &n);
 *   const gguf_tensor_t *t = gguf_tensor_find(g, "blk.0.attn_q.weight");
 *   float *w = malloc(t->n_elems * sizeof *w); gguf_tensor_to_f32(g, t, w);
 *   gguf_close(g);
 */
#ifndef BT_CKPT_GGUF_H
#define BT_CKPT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "ckpt/dequant.h"

#define GGUF_MAGIC             0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4
#define GGUF_MAX_NAME          1024 /* longest tensor name / metadata key accepted */
#define GGUF_MAX_DEPTH         8    /* deepest nesting of arrays accepted */

/* Metadata value types; the numbers are the file's. */
typedef enum {
    GGUF_TYPE_U8 = 0,
    GGUF_TYPE_I8,
    GGUF_TYPE_U16,
    GGUF_TYPE_I16,
    GGUF_TYPE_U32,
    GGUF_TYPE_I32,
    GGUF_TYPE_F32,
    GGUF_TYPE_BOOL,
    GGUF_TYPE_STRING,
    GGUF_TYPE_ARRAY,
    GGUF_TYPE_U64,
    GGUF_TYPE_I64,
    GGUF_TYPE_F64,
    GGUF_TYPE_COUNT,
} gguf_type_t;

/* A string inside the mapping: not NUL-terminated, may hold any bytes. */
typedef struct {
    const char *ptr;
    uint64_t    len;
} gguf_str_t;

typedef struct gguf_value {
    gguf_type_t type;
    union {
        uint64_t   u64;  /* U8, U16, U32, U64 */
        int64_t    i64;  /* I8, I16, I32, I64 */
        double     f64;  /* F32, F64 */
        bool       b;    /* BOOL */
        gguf_str_t str;  /* STRING */
        struct {
            gguf_type_t elem_type;
            uint64_t    n;
            /* Fixed-size elements: packed little-endian in the mapping at
             * raw, items NULL. STRING and ARRAY elements: items[n]. */
            const uint8_t           *raw;
            const struct gguf_value *items;
        } arr;
    };
} gguf_value_t;

typedef struct {
    gguf_str_t   key;
    gguf_value_t value;
} gguf_kv_t;

typedef struct {
    const char    *name;     /* NUL-terminated copy, owned by the gguf_t */
    uint32_t       type;     /* ggml type id (dequant_type_t) */
    uint32_t       n_dims;   /* 0..GGUF_MAX_DIMS */
    int64_t        ne[GGUF_MAX_DIMS]; /* ne[0] innermost; 1 past n_dims */
    int64_t        n_elems;
    uint64_t       offset;   /* from the start of the data section */
    uint64_t       nbytes;
    const uint8_t *data;     /* into the mapping */
} gguf_tensor_t;

typedef struct gguf {
    char           *path;        /* file name used in messages */
    uint32_t        version;
    uint64_t        alignment;
    uint64_t        n_kv;
    gguf_kv_t      *kv;          /* [n_kv] in file order */
    uint64_t        n_tensors;
    gguf_tensor_t  *tensors;     /* [n_tensors] in file order */
    const uint8_t  *base;        /* the whole file */
    uint64_t        size;
    uint64_t        data_offset; /* start of the data section in the file */
    /* private */
    uint64_t       *kv_sorted;      /* kv indices sorted by key */
    uint64_t       *tensor_sorted;  /* tensor indices sorted by name */
    char           *names;          /* tensor name storage */
    void           *map;            /* mmap'd region, NULL for gguf_open_mem */
} gguf_t;

/* Opens and validates path. On success *out is set; free with gguf_close. */
bt_status_t gguf_open(const char *path, gguf_t **out);

/* Same over a caller buffer that must outlive the gguf_t (not copied);
 * name is used in messages. */
bt_status_t gguf_open_mem(const void *buf, size_t size, const char *name, gguf_t **out);

void gguf_close(gguf_t *g);

/* ---- metadata ------------------------------------------------------------
 * Getters answer BT_ERR_NOT_FOUND (not logged: optional keys are common) when
 * the key is absent and BT_ERR_INVALID (logged) when it has another type or
 * its value does not fit. */
const gguf_kv_t *gguf_kv_find(const gguf_t *g, const char *key);
/* any integer type holding a value >= 0 */
bt_status_t gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out);
/* any integer type holding a value <= INT64_MAX */
bt_status_t gguf_get_i64(const gguf_t *g, const char *key, int64_t *out);
/* F32 or F64 */
bt_status_t gguf_get_f64(const gguf_t *g, const char *key, double *out);
bt_status_t gguf_get_bool(const gguf_t *g, const char *key, bool *out);
bt_status_t gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out);
/* an ARRAY whose elements have elem_type (GGUF_TYPE_COUNT: any) */
bt_status_t gguf_get_array(const gguf_t *g, const char *key, gguf_type_t elem_type,
                           const gguf_value_t **out);

/* Element i of an array value (i < arr->n, asserted). _i64 takes any integer
 * or BOOL element type, _f64 F32/F64; a mismatch is BT_ERR_INVALID. */
bt_status_t gguf_array_i64(const gguf_value_t *arr, uint64_t i, int64_t *out);
bt_status_t gguf_array_f64(const gguf_value_t *arr, uint64_t i, double *out);
bt_status_t gguf_array_str(const gguf_value_t *arr, uint64_t i, gguf_str_t *out);

/* True when s equals the NUL-terminated c. */
bool gguf_str_eq(gguf_str_t s, const char *c);

const char *gguf_type_name(gguf_type_t t);

/* ---- tensors -------------------------------------------------------------- */
const gguf_tensor_t *gguf_tensor_find(const gguf_t *g, const char *name);

/* Dequantizes t into out[t->n_elems] in file order (row-major over ne, ne[0]
 * fastest). BT_ERR_UNSUPPORTED (logged) for a type we cannot dequantize. */
bt_status_t gguf_tensor_to_f32(const gguf_t *g, const gguf_tensor_t *t, float *out);

/* ---- llama, qwen2 and qwen3 architectures -> Hugging Face -------------------
 * Fields named as in a transformers LlamaConfig (config.json); the metadata
 * keys below are spelled with the file's architecture as their prefix
 * ("llama.block_count", "qwen2.block_count"). */
typedef enum {
    GGUF_ARCH_LLAMA = 0, /* LlamaForCausalLM (Mistral files too); Q/K rows permuted */
    GGUF_ARCH_QWEN2,     /* Qwen2ForCausalLM: q/k/v biases; rows as HF stores them */
    GGUF_ARCH_QWEN3,     /* Qwen3ForCausalLM: per-head q/k norms; rows as HF stores them */
} gguf_arch_t;

typedef struct {
    gguf_arch_t arch;                /* general.architecture */
    int64_t vocab_size;              /* length of tokenizer.ggml.tokens, else llama.vocab_size */
    int64_t hidden_size;             /* llama.embedding_length */
    int64_t intermediate_size;       /* llama.feed_forward_length */
    int64_t num_hidden_layers;       /* llama.block_count */
    int64_t num_attention_heads;     /* llama.attention.head_count */
    int64_t num_key_value_heads;     /* llama.attention.head_count_kv, else head_count */
    int64_t head_dim;                /* llama.attention.key_length, else hidden / heads */
    int64_t max_position_embeddings; /* llama.context_length */
    double  rope_theta;              /* llama.rope.freq_base, else 10000 */
    double  rope_linear_factor;      /* llama.rope.scaling.factor for type "linear"; 0 = none */
    double  rms_norm_eps;            /* llama.attention.layer_norm_rms_epsilon */
    bool    tie_word_embeddings;     /* no output.weight tensor */
    bool    attention_bias;          /* blk.0.attn_q.bias exists */
    int64_t bos_token_id;            /* tokenizer.ggml.*_token_id; -1 when absent */
    int64_t eos_token_id;
    int64_t pad_token_id;
    int64_t unk_token_id;
} gguf_llama_config_t;

/* Fills cfg from a general.architecture llama, qwen2 or qwen3 file. Missing required
 * keys, inconsistent values and unsupported RoPE scaling are logged errors
 * (BT_ERR_INVALID / BT_ERR_UNSUPPORTED). */
bt_status_t gguf_llama_config(const gguf_t *g, gguf_llama_config_t *cfg);

/* cfg as Hugging Face config.json text (LlamaForCausalLM, the fields
 * transformers writes, "rope_parameters" plus the legacy "rope_theta" /
 * "rope_scaling"), e.g. for ckpt_hf_config_parse(). *out_text is malloc'd. */
bt_status_t gguf_llama_config_json(const gguf_llama_config_t *cfg, char **out_text);

/* How a GGUF llama tensor's rows must be reordered to get the HF layout.
 * llama.cpp's converter stores q_proj / k_proj (weights and biases) with the
 * rows of every head interleaved for its RoPE (GGUF row 2j+i of a head is
 * HF row i*D/2+j), over num_attention_heads heads for Q and
 * num_key_value_heads heads for K. */
typedef enum {
    GGUF_PERMUTE_NONE = 0,
    GGUF_PERMUTE_Q,
    GGUF_PERMUTE_K,
} gguf_permute_t;

/* Maps a GGUF llama tensor name ("blk.3.attn_q.weight") to the HF name
 * ("model.layers.3.self_attn.q_proj.weight") and the row permutation to
 * undo. BT_ERR_NOT_FOUND (not logged) for names without an HF counterpart
 * (e.g. rope_freqs.weight), BT_ERR_INVALID when hf_size is too small. */
bt_status_t gguf_llama_tensor_name(const char *gguf_name, char *hf_name, size_t hf_size,
                                   gguf_permute_t *permute);

/* dst[rows, cols] = src with the rows of each of n_head heads put back from
 * llama.cpp's RoPE order into HF order. rows % (2 * n_head) == 0 (asserted);
 * dst and src must not overlap. A bias is cols = 1. */
void gguf_llama_unpermute_rows(float *dst, const float *src, int64_t rows, int64_t cols,
                               int64_t n_head);

/* Dequantizes t and undoes the permutation its name calls for, giving the HF
 * tensor [ne[n_dims-1], ..., ne[0]] in out[t->n_elems]. */
bt_status_t gguf_llama_tensor_to_hf_f32(const gguf_t *g, const gguf_llama_config_t *cfg,
                                        const gguf_tensor_t *t, float *out);

/* Writes a Hugging Face tokenizer.json (byte-level BPE) equivalent to the
 * GGUF vocabulary (tokenizer.ggml.model "gpt2"): tokens -> model.vocab,
 * merges -> model.merges (pairs), CONTROL tokens (token_type 3) -> special
 * added tokens, USER_DEFINED (4) -> added tokens. The pre-tokenizer follows
 * tokenizer.ggml.pre as llama.cpp reads it: "smollm" (and the other names
 * llama.cpp splits into single digits first, see docs/GGUF.md) ->
 * Digits(individual) + ByteLevel; "gpt2"/"default"/absent -> ByteLevel with
 * the GPT-2 split; any other name -> BT_ERR_UNSUPPORTED. transformers'
 * converter writes plain ByteLevel for "smollm", which tokenizes runs of
 * spaces before a digit differently from the model's own tokenizer. */
bt_status_t gguf_tokenizer_write_json(const gguf_t *g, const char *path);

#endif
