/* The context-parallel attention core (model/cp_attn.c) against the float64
 * attention reference of the whole sequence: for cp in {1, 2, 4}, every CP
 * rank's local out and lse equal the reference rows of its chunks (r and
 * 2*cp-1-r), and the rank-summed dK, dV (what the reduce-scatter makes) and
 * each rank's dQ equal the reference gradients. K and V have their own head
 * sizes (Dv != D, as MLA has) and several query heads share a KV head. Also:
 * positions, the host split, and to_seq / to_ranks as inverses. */
#include "model/cp_attn.h"
#include "tests/ref_attention.h"

/* rows [B,T,row] of src gathered for one rank through cp_attn_split_host */
static float *split(const float *src, int64_t B, int64_t T, int64_t row, int cp, int r)
{
    float *dst = kt_alloc(B * T / cp * row);
    cp_attn_split_host(dst, src, B, T, (size_t)row * sizeof(float), cp, r);
    return dst;
}

static void cp_case(bool ring, int cp, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv,
                    uint64_t seed)
{
    kt_rng_t rng = {seed};
    attn_shape_t s = {B, T, T, Hq, Hkv, D, Dv, true, 0, 0};
    int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D, nv = B * T * Hkv * Dv;
    int64_t no = B * T * Hq * Dv, nl = B * Hq * T, L = T / (2 * cp), Tl = 2 * L;
    float scale = (float)(1.0 / sqrt((double)D));
    float *q = kt_rand(&rng, nq, -1.5, 1.5), *k = kt_rand(&rng, nk, -1.5, 1.5);
    float *v = kt_rand(&rng, nv, -1, 1), *dout = kt_rand(&rng, no, -1, 1);
    attn_ctx_t c = {s, scale, kt_to_d(q, nq), kt_to_d(k, nk), kt_to_d(v, nv), kt_to_d(dout, no)};
    double *rout = kt_alloc_d(no), *rlse = kt_alloc_d(nl);
    double *rdq = kt_alloc_d(nq), *rdk = kt_alloc_d(nk), *rdv = kt_alloc_d(nv);
    ref_attn_fwd(rout, rlse, &c);
    ref_attn_bwd(rdq, rdk, rdv, rout, &c);

    /* every rank's K and V as an all-gather leaves them: [cp*B, 2L, H, Dh] */
    float *kr = kt_alloc(nk), *vr = kt_alloc(nv);
    for (int r = 0; r < cp; r++) {
        float *kl = split(k, B, T, Hkv * D, cp, r), *vl = split(v, B, T, Hkv * Dv, cp, r);
        memcpy(kr + r * (nk / cp), kl, (size_t)(nk / cp) * sizeof(float));
        memcpy(vr + r * (nv / cp), vl, (size_t)(nv / cp) * sizeof(float));
        free(kl);
        free(vl);
    }
    tensor_t KR = tensor_4d(kr, DT_F32, cp * B, Tl, Hkv, D), VR = tensor_4d(vr, DT_F32, cp * B, Tl, Hkv, Dv);
    float *ks = kt_alloc(nk), *vs = kt_alloc(nv);
    tensor_t KS = tensor_4d(ks, DT_F32, B, T, Hkv, D), VS = tensor_4d(vs, DT_F32, B, T, Hkv, Dv);
    cp_attn_to_seq(kern_stream_host(), &KS, &KR, cp);
    cp_attn_to_seq(kern_stream_host(), &VS, &VR, cp);
    CHECK(!memcmp(ks, k, (size_t)nk * sizeof *k));
    CHECK(!memcmp(vs, v, (size_t)nv * sizeof *v));

    float *dks = kt_alloc(nk), *dvs = kt_alloc(nv); /* sum over ranks, sequence order */
    memset(dks, 0, (size_t)nk * sizeof *dks);
    memset(dvs, 0, (size_t)nv * sizeof *dvs);
    /* ring: each block's dK, dV in rank order, as they return to their owner */
    float *dkr = kt_alloc(nk), *dvr = kt_alloc(nv);
    memset(dkr, 0, (size_t)nk * sizeof *dkr);
    memset(dvr, 0, (size_t)nv * sizeof *dvr);
    float *po = kt_alloc(L * Hq * Dv), *pl = kt_alloc(Hq * L);
    tensor_t PO = tensor_4d(po, DT_F32, 1, L, Hq, Dv), PL = tensor_3d(pl, DT_F32, 1, Hq, L);
    double *rdk_d = kt_alloc_d(nk), *rdv_d = kt_alloc_d(nv);
    memcpy(rdk_d, rdk, (size_t)nk * sizeof *rdk);
    memcpy(rdv_d, rdv, (size_t)nv * sizeof *rdv);
    char what[96];
    for (int r = 0; r < cp; r++) {
        snprintf(what, sizeof what, "%s cp=%d rank %d B%lld T%lld Hq%lld Hkv%lld D%lld Dv%lld", ring ? "ring" : "allgather", cp, r,
                 (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D,
                 (long long)Dv);
        int32_t *pos = malloc((size_t)(B * Tl) * sizeof *pos);
        cp_attn_positions(pos, B, L, cp, r);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Tl; i++) {
                int64_t chunk = i < L ? r : 2 * cp - 1 - r;
                CHECK(pos[b * Tl + i] == chunk * L + i % L);
            }
        float *ql = split(q, B, T, Hq * D, cp, r), *gl = split(dout, B, T, Hq * Dv, cp, r);
        float *ol = kt_alloc(B * Tl * Hq * Dv), *ll = kt_alloc(B * 2 * Hq * L);
        float *dql = kt_alloc(B * Tl * Hq * D);
        memset(dql, 0, (size_t)(B * Tl * Hq * D) * sizeof *dql);
        tensor_t Q = tensor_4d(ql, DT_F32, B, Tl, Hq, D), O = tensor_4d(ol, DT_F32, B, Tl, Hq, Dv);
        tensor_t G = tensor_4d(gl, DT_F32, B, Tl, Hq, Dv), DQ = tensor_4d(dql, DT_F32, B, Tl, Hq, D);
        int64_t lsh[4] = {B, 2, Hq, L};
        tensor_t LS = tensor_make(ll, DT_F32, DEVICE_CPU, 4, lsh);
        tensor_t DK = tensor_4d(dks, DT_F32, B, T, Hkv, D), DV = tensor_4d(dvs, DT_F32, B, T, Hkv, Dv);
        if (!ring) {
            cp_attn_fwd(kern_stream_host(), &O, &LS, &Q, &KS, &VS, scale, cp, r);
            cp_attn_bwd(kern_stream_host(), &DQ, &DK, &DV, &G, &Q, &KS, &VS, &O, &LS, scale, cp, r);
        } else {
            /* the blocks in the order a ring sending to rank + 1 brings them */
            for (int pass = 0; pass < 2; pass++)
                for (int t = 0; t < cp; t++) {
                    int src = (r - t + cp) % cp;
                    tensor_t KB = tensor_4d(kr + src * (nk / cp), DT_F32, B, Tl, Hkv, D);
                    tensor_t VB = tensor_4d(vr + src * (nv / cp), DT_F32, B, Tl, Hkv, Dv);
                    tensor_t DKB = tensor_4d(dkr + src * (nk / cp), DT_F32, B, Tl, Hkv, D);
                    tensor_t DVB = tensor_4d(dvr + src * (nv / cp), DT_F32, B, Tl, Hkv, Dv);
                    if (pass == 0)
                        cp_attn_ring_fwd(kern_stream_host(), &O, &LS, &PO, &PL, &Q, &KB, &VB,
                                         scale, cp, r, src);
                    else
                        cp_attn_ring_bwd(kern_stream_host(), &DQ, &DKB, &DVB, &G, &Q, &KB, &VB,
                                         &O, &LS, scale, cp, r, src);
                }
        }
        /* the reference rows of this rank's chunks */
        double *ro = kt_alloc_d(B * Tl * Hq * Dv), *rl = kt_alloc_d(B * 2 * Hq * L);
        double *rq = kt_alloc_d(B * Tl * Hq * D);
        for (int64_t b = 0; b < B; b++)
            for (int h = 0; h < 2; h++) {
                int64_t g0 = (int64_t)cp_attn_chunk(cp, r, h) * L;
                for (int64_t i = 0; i < L; i++) {
                    int64_t li = b * Tl + h * L + i, gi = b * T + g0 + i;
                    memcpy(ro + li * Hq * Dv, rout + gi * Hq * Dv, (size_t)(Hq * Dv) * sizeof *ro);
                    memcpy(rq + li * Hq * D, rdq + gi * Hq * D, (size_t)(Hq * D) * sizeof *rq);
                    for (int64_t hh = 0; hh < Hq; hh++)
                        rl[((b * 2 + h) * Hq + hh) * L + i] = rlse[(b * Hq + hh) * T + g0 + i];
                }
            }
        int before = test_case_failures;
        kt_close("cp out", ol, ro, B * Tl * Hq * Dv, 1e-5);
        kt_close("cp lse", ll, rl, B * 2 * Hq * L, 1e-5);
        kt_close("cp dq", dql, rq, B * Tl * Hq * D, 1e-4);
        if (test_case_failures != before) fprintf(stderr, "  in %s\n", what);
        free(pos);
        free(ql);
        free(gl);
        free(ol);
        free(ll);
        free(dql);
        free(ro);
        free(rl);
        free(rq);
    }
    if (ring) {
        tensor_t DKR = tensor_4d(dkr, DT_F32, cp * B, Tl, Hkv, D);
        tensor_t DVR = tensor_4d(dvr, DT_F32, cp * B, Tl, Hkv, Dv);
        tensor_t DK = tensor_4d(dks, DT_F32, B, T, Hkv, D), DV = tensor_4d(dvs, DT_F32, B, T, Hkv, Dv);
        cp_attn_to_seq(kern_stream_host(), &DK, &DKR, cp);
        cp_attn_to_seq(kern_stream_host(), &DV, &DVR, cp);
    }
    kt_close("cp dk (rank sum)", dks, rdk_d, nk, 1e-4);
    kt_close("cp dv (rank sum)", dvs, rdv_d, nv, 1e-4);
    /* to_ranks inverts to_seq (the order the reduce-scatter of dK, dV needs) */
    float *back = kt_alloc(nk);
    tensor_t BK = tensor_4d(back, DT_F32, cp * B, Tl, Hkv, D);
    cp_attn_to_ranks(kern_stream_host(), &BK, &KS, cp);
    CHECK(!memcmp(back, kr, (size_t)nk * sizeof *kr));
    free(back);
    free(dkr);
    free(dvr);
    free(po);
    free(pl);
    free(rdk_d);
    free(rdv_d);
    free(dks);
    free(dvs);
    free(ks);
    free(vs);
    free(kr);
    free(vr);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(c.q);
    free(c.k);
    free(c.v);
    free(c.R);
    free(rout);
    free(rlse);
    free(rdq);
    free(rdk);
    free(rdv);
}

static void cp_cases(bool ring)
{
    cp_case(ring, 1, 2, 6, 2, 1, 4, 4, 1);
    cp_case(ring, 2, 2, 8, 4, 2, 6, 4, 2);
    cp_case(ring, 4, 2, 16, 4, 1, 6, 10, 4); /* Dv > D, as MLA has */
    cp_case(ring, 4, 1, 64, 3, 3, 4, 2, 5);
}

static void test_cp_attn_allgather(void) { cp_cases(false); }
static void test_cp_attn_ring(void) { cp_cases(true); }

/* 34-token chunks: the key prefixes cross the kernel's 64-row query blocks */
static void test_cp_attn_long(void)
{
    cp_case(false, 2, 1, 136, 2, 1, 8, 6, 3);
    cp_case(true, 2, 1, 136, 2, 1, 8, 6, 3);
}

int main(int argc, char **argv) { TEST_RUN(argc, argv, test_cp_attn_allgather, test_cp_attn_ring, test_cp_attn_long); }
