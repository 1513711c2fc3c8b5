/* Attention through cuDNN's fused SDPA graphs (forward and backward), built
 * with the cuDNN frontend's graph API, for BATON_CUDA_ATTN=cudnn.
 *
 * Why: cuDNN's sm90 flash kernels (warpgroup products fed by TMA) are what
 * torch runs for bf16 attention on Hopper; baton's own mma.sync kernels
 * (attention.cu) trail them by about a third on the backward (bench/
 * GPU_NOTES.md). Both take q[B,T,H,D] rows as they lie (cuDNN is told the
 * [B,H,T,D] dims with [B,T,H,D] strides) and both save lse[B,Hq,Tq] as the
 * natural-log log-sum-exp of the scaled scores, so either backward takes
 * either forward's lse and the context-parallel merge takes cuDNN's.
 *
 * cuDNN is opened at run time (the frontend's dynamic loading, dlopen of
 * libcudnn.so.9), so libbaton_cuda.so does not depend on it: where it is
 * missing, too old, or declines a shape, the call returns DNN_DECLINED with
 * the reason and the backend runs its own kernels. Built without the
 * frontend's headers (make deps fetches them), every call declines.
 *
 * Masks: causal with the queries at the start of the keys (q_offset 0,
 * Tq == Tk: cuDNN's top-left diagonal) or at their end (q_offset + Tq == Tk:
 * bottom-right); a sliding window of w keys is the diagonal band's left
 * bound w (query i sees keys i - w < j <= i). Other offsets decline.
 *
 * Determinism: cuDNN's backward accumulates dQ with atomics, so its last
 * bits vary between runs, as on the own kernels' fast path.
 *
 * Graphs are built once per shape (a build costs milliseconds to seconds)
 * and kept per stream, at most DNN_MAX_GRAPHS; a declined shape is
 * remembered too and reported once. Decoding steps (one query row, a new key
 * count each) are left to baton's kernels. */
#include "kernels/cuda/cuda.h"

#include "base/log.h"

#include <stdio.h>
#include <string.h>

#ifdef BT_HAVE_CUDNN_FE

#include <dlfcn.h>

#include <cstring> /* the frontend's shim uses std::strlen without it */

#include <cudnn_frontend.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

/* the frontend's dynamic loading reads this handle */
void *cudnn_frontend::cudnn_dlhandle = nullptr;

namespace {

enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV };

struct dnn_key {
    int bwd, dt, causal;
    int64_t B, Tq, Tk, Hq, Hkv, D, Dv, q_offset, window;
    float scale;
    bool operator==(const dnn_key &o) const { return !memcmp(this, &o, sizeof o); }
};

struct dnn_entry {
    dnn_key key;
    std::shared_ptr<fe::graph::Graph> g; /* NULL: declined */
    int64_t ws;
};

std::once_flag dnn_lib_once;
std::string dnn_lib_why; /* why libcudnn could not be opened, written once */

/* streams of several threads may ask at once: the library is opened once */
bool dnn_open_lib(std::string &why)
{
    std::call_once(dnn_lib_once, [] {
        void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            const char *e = dlerror();
            dnn_lib_why = std::string("cannot open libcudnn.so.9: ") + (e ? e : "?");
        } else {
            cudnn_frontend::cudnn_dlhandle = h;
        }
    });
    why = dnn_lib_why;
    return cudnn_frontend::cudnn_dlhandle != nullptr;
}

void set_why(char *why, size_t cap, const std::string &s)
{
    if (why && cap) snprintf(why, cap, "%s", s.c_str());
}

std::atomic<int64_t> dnn_done; /* calls cuDNN ran, for the op table's check */

/* Graphs kept per stream: each costs a build (milliseconds to seconds) and
 * some host memory, so a stream whose shapes keep changing (decoding with a
 * growing key count) stops building new ones and leaves those to baton's
 * kernels. */
constexpr size_t DNN_MAX_GRAPHS = 64;

} // namespace

extern "C" int64_t cuda_dnn_done_count(void) { return dnn_done; }

struct cuda_dnn {
    cudnnHandle_t h = nullptr;
    std::vector<dnn_entry> cache;
};

extern "C" bool cuda_dnn_usable(char *why, size_t cap)
{
    std::string w;
    try {
        if (!dnn_open_lib(w)) {
            set_why(why, cap, w);
            return false;
        }
        int64_t v = (int64_t)fe::detail::get_backend_version();
        if (v < 90000) {
            set_why(why, cap, "cuDNN " + std::to_string(v) + " is older than 9.0");
            return false;
        }
        return true;
    } catch (const std::exception &e) {
        set_why(why, cap, std::string("cuDNN: ") + e.what());
        return false;
    }
}

extern "C" bool cuda_dnn_create(cuda_dnn_t **out, char *why, size_t cap)
{
    *out = nullptr;
    if (!cuda_dnn_usable(why, cap)) return false;
    try {
        int64_t v = (int64_t)fe::detail::get_backend_version();
        cuda_dnn_t *d = new cuda_dnn_t;
        cudnnStatus_t st = fe::detail::create_handle(&d->h);
        if (st != CUDNN_STATUS_SUCCESS) {
            delete d;
            set_why(why, cap, std::string("cudnnCreate failed: ") + fe::detail::get_error_string(st));
            return false;
        }
        log_info("cuda: attention through cuDNN %lld (%s)", (long long)v,
                 fe::detail::get_backend_version_string().c_str());
        *out = d;
        return true;
    } catch (const std::exception &e) {
        set_why(why, cap, std::string("cuDNN: ") + e.what());
        return false;
    }
}

extern "C" void cuda_dnn_destroy(cuda_dnn_t *d)
{
    if (!d) return;
    d->cache.clear();
    try {
        if (d->h) fe::detail::destroy_handle(d->h);
    } catch (...) {
    }
    delete d;
}

static bool dnn_mask(const kern_attn_shape_t *sh, bool &bottom_right)
{
    bottom_right = false;
    if (!sh->causal) return sh->window <= 0;
    if (sh->q_offset == 0 && sh->Tq == sh->Tk) return true;
    if (sh->q_offset + sh->Tq == sh->Tk) {
        bottom_right = true;
        return true;
    }
    return false;
}

template <typename A> static void dnn_apply_mask(A &opt, const kern_attn_shape_t *sh)
{
    bool br;
    dnn_mask(sh, br);
    if (sh->causal) {
        if (br)
            opt.set_causal_mask_bottom_right(true);
        else
            opt.set_causal_mask(true);
    }
    if (sh->window > 0 && sh->Tk > sh->window) opt.set_diagonal_band_left_bound((int)sh->window);
}

/* [B,H,T,d] dims over rows laid out [B,T,H,d] */
static std::vector<int64_t> bthd_stride(int64_t T, int64_t H, int64_t d)
{
    return {T * H * d, d, H * d, 1};
}

static std::shared_ptr<fe::graph::Tensor_attributes>
dnn_tensor(fe::graph::Graph &g, const char *name, int64_t uid, int64_t B, int64_t H, int64_t T,
           int64_t d)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, H, T, d})
                        .set_stride(bthd_stride(T, H, d)));
}

static void dnn_out(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, int64_t B,
                    int64_t H, int64_t T, int64_t d)
{
    t->set_output(true).set_uid(uid).set_dim({B, H, T, d}).set_stride(bthd_stride(T, H, d));
}

static std::shared_ptr<fe::graph::Graph> dnn_build(cuda_dnn_t *d, const dnn_key &k,
                                                   const kern_attn_shape_t *sh, std::string &why)
{
    auto g = std::make_shared<fe::graph::Graph>();
    fe::DataType_t io = k.dt == DT_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = dnn_tensor(*g, "q", U_Q, sh->B, sh->Hq, sh->Tq, sh->D);
    auto kk = dnn_tensor(*g, "k", U_K, sh->B, sh->Hkv, sh->Tk, sh->D);
    auto v = dnn_tensor(*g, "v", U_V, sh->B, sh->Hkv, sh->Tk, sh->Dv);
    if (!k.bwd) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("baton_sdpa")
                       .set_generate_stats(true)
                       .set_attn_scale(sh->scale);
        dnn_apply_mask(opt, sh);
        auto [o, stats] = g->sdpa(q, kk, v, opt);
        dnn_out(o, U_O, sh->B, sh->Hq, sh->Tq, sh->Dv);
        stats->set_output(true)
            .set_uid(U_STATS)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({sh->B, sh->Hq, sh->Tq, 1})
            .set_stride({sh->Hq * sh->Tq, sh->Tq, 1, 1});
    } else {
        auto o = dnn_tensor(*g, "o", U_O, sh->B, sh->Hq, sh->Tq, sh->Dv);
        auto dout = dnn_tensor(*g, "do", U_DO, sh->B, sh->Hq, sh->Tq, sh->Dv);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(U_STATS)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_dim({sh->B, sh->Hq, sh->Tq, 1})
                                   .set_stride({sh->Hq * sh->Tq, sh->Tq, 1, 1}));
        auto opt = fe::graph::SDPA_backward_attributes()
                       .set_name("baton_sdpa_bwd")
                       .set_attn_scale(sh->scale);
        dnn_apply_mask(opt, sh);
        auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, opt);
        dnn_out(dq, U_DQ, sh->B, sh->Hq, sh->Tq, sh->D);
        dnn_out(dk, U_DK, sh->B, sh->Hkv, sh->Tk, sh->D);
        dnn_out(dv, U_DV, sh->B, sh->Hkv, sh->Tk, sh->Dv);
    }
    fe::error_t e = g->build(d->h, {fe::HeurMode_t::A});
    if (!e.is_good()) {
        why = e.get_message();
        return nullptr;
    }
    return g;
}

/* the cached graph of this call, built on first use (its g NULL when cuDNN
 * declined the shape); NULL when the stream holds its most graphs */
static dnn_entry *dnn_lookup(cuda_dnn_t *d, int bwd, dtype_t dt, const kern_attn_shape_t *sh,
                             std::string &why)
{
    dnn_key k;
    memset(&k, 0, sizeof k); /* the key is compared bytewise, padding included */
    k.bwd = bwd;
    k.dt = (int)dt;
    k.causal = sh->causal;
    k.B = sh->B, k.Tq = sh->Tq, k.Tk = sh->Tk, k.Hq = sh->Hq, k.Hkv = sh->Hkv;
    k.D = sh->D, k.Dv = sh->Dv, k.q_offset = sh->q_offset, k.window = sh->window;
    k.scale = sh->scale;
    for (auto &en : d->cache)
        if (en.key == k) {
            if (!en.g) why = "declined before";
            return &en;
        }
    if (d->cache.size() >= DNN_MAX_GRAPHS) {
        why = "this stream already holds " + std::to_string(DNN_MAX_GRAPHS) + " attention graphs";
        return nullptr;
    }
    dnn_entry en;
    en.key = k;
    en.ws = 0;
    en.g = dnn_build(d, k, sh, why);
    if (en.g) {
        if (!en.g->get_workspace_size(en.ws).is_good()) en.ws = 0;
    } else {
        log_info("cuda: cuDNN declines %s attention B=%lld Tq=%lld Tk=%lld Hq=%lld Hkv=%lld "
                 "D=%lld Dv=%lld: %s; baton's kernels run it",
                 bwd ? "backward" : "forward", (long long)sh->B, (long long)sh->Tq,
                 (long long)sh->Tk, (long long)sh->Hq, (long long)sh->Hkv, (long long)sh->D,
                 (long long)sh->Dv, why.c_str());
    }
    d->cache.push_back(std::move(en));
    return &d->cache.back();
}

static int dnn_run(cuda_dnn_t *d, cudaStream_t st, int bwd, dtype_t dt,
                   const kern_attn_shape_t *sh, std::unordered_map<int64_t, void *> &ptrs,
                   cuda_dnn_ws_fn ws_fn, void *ws_ctx, char *why, size_t cap)
{
    if (dt != DT_BF16 && dt != DT_F16) {
        set_why(why, cap, "cuDNN attention takes bf16 or f16 only");
        return CUDA_DNN_DECLINED;
    }
    bool br;
    if (!dnn_mask(sh, br)) {
        set_why(why, cap, "a causal query offset other than 0 or Tk - Tq");
        return CUDA_DNN_DECLINED;
    }
    if (sh->Tq == 1) { /* a decoding step: a graph per key count would be built */
        set_why(why, cap, "one query row (decoding)");
        return CUDA_DNN_DECLINED;
    }
    try {
        std::string w;
        dnn_entry *en = dnn_lookup(d, bwd, dt, sh, w);
        if (!en || !en->g) {
            set_why(why, cap, w);
            return CUDA_DNN_DECLINED;
        }
        void *ws = nullptr;
        if (en->ws > 0 && !(ws = ws_fn(ws_ctx, (size_t)en->ws))) {
            set_why(why, cap, "no scratch for cuDNN's workspace");
            return CUDA_DNN_FAILED;
        }
        cudnnStatus_t s = fe::detail::set_stream(d->h, st);
        if (s != CUDNN_STATUS_SUCCESS) {
            set_why(why, cap, std::string("cudnnSetStream: ") + fe::detail::get_error_string(s));
            return CUDA_DNN_FAILED;
        }
        fe::error_t e = en->g->execute(d->h, ptrs, ws);
        if (!e.is_good()) {
            set_why(why, cap, "cuDNN execute: " + e.get_message());
            return CUDA_DNN_FAILED;
        }
        dnn_done++;
        return CUDA_DNN_DONE;
    } catch (const std::exception &ex) {
        set_why(why, cap, std::string("cuDNN: ") + ex.what());
        return CUDA_DNN_FAILED;
    }
}

extern "C" int cuda_dnn_attn_fwd(cuda_dnn_t *d, cudaStream_t st, void *out, float *lse,
                                 const void *q, const void *k, const void *v, dtype_t dt,
                                 const kern_attn_shape_t *sh, cuda_dnn_ws_fn ws_fn, void *ws_ctx,
                                 char *why, size_t cap)
{
    std::unordered_map<int64_t, void *> p = {{U_Q, (void *)q},  {U_K, (void *)k},
                                             {U_V, (void *)v},  {U_O, out},
                                             {U_STATS, (void *)lse}};
    return dnn_run(d, st, 0, dt, sh, p, ws_fn, ws_ctx, why, cap);
}

extern "C" int cuda_dnn_attn_bwd(cuda_dnn_t *d, cudaStream_t st, void *dq, void *dk, void *dv,
                                 const void *dout, const void *q, const void *k, const void *v,
                                 const void *out, const float *lse, dtype_t dt,
                                 const kern_attn_shape_t *sh, cuda_dnn_ws_fn ws_fn, void *ws_ctx,
                                 char *why, size_t cap)
{
    if (!dq || !dk || !dv) {
        set_why(why, cap, "cuDNN's backward writes dq, dk and dv together");
        return CUDA_DNN_DECLINED;
    }
    std::unordered_map<int64_t, void *> p = {
        {U_Q, (void *)q},      {U_K, (void *)k},   {U_V, (void *)v},   {U_O, (void *)out},
        {U_DO, (void *)dout},  {U_DQ, dq},         {U_DK, dk},         {U_DV, dv},
        {U_STATS, (void *)lse}};
    return dnn_run(d, st, 1, dt, sh, p, ws_fn, ws_ctx, why, cap);
}

#else /* built without the cuDNN frontend's headers */

struct cuda_dnn {
    int unused;
};

extern "C" int64_t cuda_dnn_done_count(void) { return 0; }

extern "C" bool cuda_dnn_create(cuda_dnn_t **out, char *why, size_t cap)
{
    *out = NULL;
    if (why && cap)
        snprintf(why, cap, "built without the cuDNN frontend headers (make deps fetches them)");
    return false;
}

extern "C" void cuda_dnn_destroy(cuda_dnn_t *d) { (void)d; }

extern "C" bool cuda_dnn_usable(char *why, size_t cap)
{
    if (why && cap)
        snprintf(why, cap, "built without the cuDNN frontend headers (make deps fetches them)");
    return false;
}

extern "C" int cuda_dnn_attn_fwd(cuda_dnn_t *d, cudaStream_t st, void *out, float *lse,
                                 const void *q, const void *k, const void *v, dtype_t dt,
                                 const kern_attn_shape_t *sh, cuda_dnn_ws_fn ws_fn, void *ws_ctx,
                                 char *why, size_t cap)
{
    return CUDA_DNN_DECLINED;
}

extern "C" int cuda_dnn_attn_bwd(cuda_dnn_t *d, cudaStream_t st, void *dq, void *dk, void *dv,
                                 const void *dout, const void *q, const void *k, const void *v,
                                 const void *out, const float *lse, dtype_t dt,
                                 const kern_attn_shape_t *sh, cuda_dnn_ws_fn ws_fn, void *ws_ctx,
                                 char *why, size_t cap)
{
    return CUDA_DNN_DECLINED;
}

#endif
