/* AdamW, element by element with exactly the operations of
 * kernels/cpu/adamw.c (two fused multiply-adds, correctly rounded sqrt and
 * division, the host-formed constants of cuda_adamw_k_t). The intrinsics
 * pin every rounding, so nvcc cannot contract or reorder them: f32 results
 * are bit-identical to the CPU twin. */
#include "kernels/cuda/common.cuh"

template <class TP, class TG>
__global__ void k_adamw(TP *param, void *copy, dtype_t copy_dt, const TG *grad, float *m, float *v,
                        int64_t n, cuda_adamw_k_t k)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float p = cu_ld(param, i), g = cu_ld(grad, i);
        if (k.decays) p = __fmul_rn(p, k.decay);
        float mi = __fmaf_rn(k.w1, __fsub_rn(g, m[i]), m[i]);
        float vi = __fmaf_rn(__fmul_rn(k.w2, g), g, __fmul_rn(v[i], k.b2));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2s), k.eps);
        p = __fadd_rn(p, __fdiv_rn(__fmul_rn(k.neg_step, mi), denom));
        m[i] = mi;
        v[i] = vi;
        cu_st(param, i, p);
        if (copy) {
            if (copy_dt == DT_F32) ((float *)copy)[i] = p;
            else if (copy_dt == DT_F64) ((double *)copy)[i] = p;
            else if (copy_dt == DT_BF16) ((uint16_t *)copy)[i] = cu_f32_to_bf16(p);
            else ((uint16_t *)copy)[i] = cu_f32_to_f16(p);
        }
    }
}

extern "C" cudaError_t cuda_adamw(cudaStream_t st, void *param, dtype_t param_dt, void *param_copy,
                                  dtype_t copy_dt, const void *grad, dtype_t grad_dt, float *m,
                                  float *v, int64_t n, const cuda_adamw_k_t *k)
{
    if (n <= 0) return cudaGetLastError();
    unsigned nb = cu_blocks(n, 256);
    if (param_dt == DT_BF16)
        CU_DISPATCH_FT(grad_dt, TG,
                       k_adamw<cu_bf16_t, TG><<<nb, 256, 0, st>>>((cu_bf16_t *)param, param_copy,
                                                                  copy_dt, (const TG *)grad, m, v,
                                                                  n, *k));
    else
        CU_DISPATCH_FT(grad_dt, TG,
                       k_adamw<float, TG><<<nb, 256, 0, st>>>((float *)param, param_copy, copy_dt,
                                                              (const TG *)grad, m, v, n, *k));
    return cudaGetLastError();
}
