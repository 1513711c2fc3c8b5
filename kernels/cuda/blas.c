/* Dense products through cuBLASLt, in the row-major terms of kern_matmul.
 *
 * cuBLASLt is column-major. A row-major [R, C] matrix is the column-major
 * [C, R] matrix with the same bytes, so c[M,N] = op(a) op(b) is computed as
 * c^T[N,M] = op(b)^T op(a)^T: b becomes Lt's A operand and a its B operand,
 * with the transposes kept (a row-major [K,N] b is a column-major [N,K]
 * matrix, already op(A) when !trans_b). The bias epilogue adds a vector
 * along the rows of Lt's D, which are the columns of c: bias[N] per column,
 * as linear_fwd wants.
 *
 * Plans: creating descriptors and asking the heuristic costs tens of
 * microseconds, more than a small product, so each stream keeps the last
 * CUDA_LT_PLANS plans keyed by shape, dtypes, transposes, epilogue and the
 * pointers' alignments (cuBLASLt's algorithms depend on alignment; tensors
 * narrowed to rows can start anywhere). A stream belongs to one thread at a
 * time (kernels/device.h), so the cache needs no lock. */
#ifdef BT_HAVE_CUDA

#include "kernels/cuda/cuda.h"

#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CUDA_LT_PLANS = 64 };

typedef struct {
    bool used;
    dtype_t ab_dt, c_dt;
    int64_t M, N, K;
    bool trans_a, trans_b, bias;
    uint32_t align; /* log2 of the alignments of a, b, c, bias, 4 bits each */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* Lt's A (our b), B (our a), C = D */
    cublasLtMatmulAlgo_t algo;
    size_t ws_needed;
} cuda_plan_t;

struct cuda_lt {
    cublasLtHandle_t h;
    cuda_plan_t plans[CUDA_LT_PLANS];
    int next; /* round-robin replacement */
};

size_t cuda_lt_version(void) { return cublasLtGetVersion(); }

cudaError_t cuda_lt_create(cuda_lt_t **out, char *why, size_t why_cap)
{
    cuda_lt_t *lt = calloc(1, sizeof *lt);
    if (!lt) {
        snprintf(why, why_cap, "out of host memory");
        return cudaErrorMemoryAllocation;
    }
    cublasStatus_t st = cublasLtCreate(&lt->h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_cap, "cublasLtCreate: %s", cublasLtGetStatusString(st));
        free(lt);
        return st == CUBLAS_STATUS_ALLOC_FAILED ? cudaErrorMemoryAllocation : cudaErrorUnknown;
    }
    *out = lt;
    return cudaSuccess;
}

static void cuda_plan_release(cuda_plan_t *p)
{
    if (!p->used) return;
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = false;
}

void cuda_lt_destroy(cuda_lt_t *lt)
{
    if (!lt) return;
    for (int i = 0; i < CUDA_LT_PLANS; i++) cuda_plan_release(&lt->plans[i]);
    cublasLtDestroy(lt->h);
    free(lt);
}

static cudaDataType_t cuda_lt_type(dtype_t dt) { return dt == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* log2 of the largest power of two dividing p, at most 8 (256 bytes) */
static uint32_t cuda_lt_align_log2(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t l = 0;
    while (l < 8 && !(u & ((uintptr_t)1 << l))) l++;
    return l;
}

static bool cuda_lt_fail(char *why, size_t cap, const char *what, cublasStatus_t st)
{
    snprintf(why, cap, "%s: %s", what, cublasLtGetStatusString(st));
    return false;
}

#define LT_TRY(call, what)                                                                         \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            ok = cuda_lt_fail(why, why_cap, what, st_);                                            \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Builds the plan for g into p (p->used on success). */
static bool cuda_plan_build(cuda_lt_t *lt, cuda_plan_t *p, const cuda_gemm_t *g, uint32_t align,
                            size_t ws_bytes, bool *no_algo, char *why, size_t why_cap)
{
    bool ok = true;
    cublasLtMatmulPreference_t pref = NULL;
    memset(p, 0, sizeof *p);
    p->ab_dt = g->ab_dt, p->c_dt = g->c_dt, p->M = g->M, p->N = g->N, p->K = g->K;
    p->trans_a = g->trans_a, p->trans_b = g->trans_b, p->bias = g->bias != NULL;
    p->align = align;
    cudaDataType_t tab = cuda_lt_type(g->ab_dt), tc = cuda_lt_type(g->c_dt);
    uint64_t ra = (uint64_t)(g->trans_b ? g->K : g->N), ca = (uint64_t)(g->trans_b ? g->N : g->K);
    uint64_t rb = (uint64_t)(g->trans_a ? g->M : g->K), cb = (uint64_t)(g->trans_a ? g->K : g->M);
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
    p->used = true; /* from here on cuda_plan_release undoes what exists */
    int32_t opa = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "set TRANSA");
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "set TRANSB");
    if (g->bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                              sizeof epi),
               "set EPILOGUE");
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                              sizeof g->bias),
               "set BIAS_POINTER");
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p->la, tab, ra, ca, (int64_t)ra), "layout A");
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lb, tab, rb, cb, (int64_t)rb), "layout B");
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lc, tc, (uint64_t)g->N, (uint64_t)g->M, (int64_t)g->N),
           "layout C");
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t wsb = ws_bytes;
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                sizeof wsb),
           "set MAX_WORKSPACE_BYTES");
    /* Lt's A is our b, B is our a */
    uint32_t al_a = 1u << ((align >> 4) & 15), al_b = 1u << (align & 15);
    uint32_t al_c = 1u << ((align >> 8) & 15);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al_a, sizeof al_a),
           "set MIN_ALIGNMENT_A");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al_b, sizeof al_b),
           "set MIN_ALIGNMENT_B");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al_c, sizeof al_c),
           "set MIN_ALIGNMENT_C");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al_c, sizeof al_c),
           "set MIN_ALIGNMENT_D");
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt->h, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res,
                                          &found),
           "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1) {
        *no_algo = true;
        snprintf(why, why_cap, "cuBLASLt has no algorithm for %s x %s -> %s [%lld,%lld,%lld]%s",
                 dtype_name(g->ab_dt), dtype_name(g->ab_dt), dtype_name(g->c_dt), (long long)g->M,
                 (long long)g->N, (long long)g->K, g->bias ? " with the bias epilogue" : "");
        ok = false;
        goto done;
    }
    p->algo = res.algo;
    p->ws_needed = res.workspaceSize;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) cuda_plan_release(p);
    return ok;
}

static volatile bool cuda_lt_declines; /* test hook: cuda_lt_set_declined */

void cuda_lt_set_declined(bool on) { cuda_lt_declines = on; }

bool cuda_lt_gemm(cuda_lt_t *lt, cudaStream_t st, void *ws, size_t ws_bytes, const cuda_gemm_t *g,
                  bool *no_algo, char *why, size_t why_cap)
{
    *no_algo = false;
    if (cuda_lt_declines) {
        *no_algo = true;
        snprintf(why, why_cap, "cuBLASLt declined by the test hook");
        return false;
    }
    uint32_t align = cuda_lt_align_log2(g->a) | cuda_lt_align_log2(g->b) << 4 |
                     cuda_lt_align_log2(g->c) << 8 |
                     (g->bias ? cuda_lt_align_log2(g->bias) << 12 : 0);
    cuda_plan_t *p = NULL;
    for (int i = 0; i < CUDA_LT_PLANS && !p; i++) {
        cuda_plan_t *c = &lt->plans[i];
        if (c->used && c->ab_dt == g->ab_dt && c->c_dt == g->c_dt && c->M == g->M &&
            c->N == g->N && c->K == g->K && c->trans_a == g->trans_a && c->trans_b == g->trans_b &&
            c->bias == (g->bias != NULL) && c->align == align && c->ws_needed <= ws_bytes)
            p = c;
    }
    if (!p) {
        p = &lt->plans[lt->next];
        lt->next = (lt->next + 1) % CUDA_LT_PLANS;
        cuda_plan_release(p);
        if (!cuda_plan_build(lt, p, g, align, ws_bytes, no_algo, why, why_cap)) return false;
    }
    bool ok = true;
    if (g->bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                              sizeof g->bias),
               "set BIAS_POINTER");
    cublasStatus_t mst = cublasLtMatmul(lt->h, p->desc, &g->alpha, g->b, p->la, g->a, p->lb,
                                        &g->beta, g->c, p->lc, g->c, p->lc, &p->algo,
                                        p->ws_needed ? ws : NULL, p->ws_needed, st);
    if (mst == CUBLAS_STATUS_NOT_SUPPORTED) *no_algo = true;
    LT_TRY(mst, "cublasLtMatmul");
done:
    return ok;
}

#endif /* BT_HAVE_CUDA */
