// Multi-tensor kernels for mixed precision and the optimizers: the fused unscale + inf/nan
// check, the dynamic loss-scale update and the fused optimizer step (SGD, Momentum with or
// without nesterov, Adam, AdamW).
//
// multi_tensor_apply (PyTorch's MultiTensorApply.cuh, Apex's multi_tensor_apply.cuh): a table
// of tensor addresses, sizes and a block -> (tensor, chunk) map travels BY VALUE as the kernel
// parameter, so one launch covers many tensors without a device-side table to upload. The
// table stays under the 4 KiB parameter limit (static_asserts below); the host fills it and
// launches when the tensor slots or the block map are full, a tensor cut by a launch goes on
// in slot 0 of the next. One 512-thread block per 65,536-element chunk; each thread takes 4
// elements per step, as one aligned vector access per operand when every pointer of the
// tensor allows, else 4 strided scalar accesses (coalesced across the block).
// Dense tensors are grouped by parameter dtype, one kernel instantiation per (kind, dtype),
// so no per-element dtype switch; anything else (a non-dense operand, a gradient whose dtype
// differs from its parameter's) goes through a one-tensor strided kernel that switches on
// the dtypes at run time: rare, and simple.
//
// No host ever reads device memory here: found_inf, inv_scale and Adam's step count are
// read by the kernels. The optimizer kernels return at once when *found_inf != 0 (Apex's
// noop flag); Adam's step count is read by every block and incremented by a one-thread
// kernel queued after all the update kernels (stream order makes that safe).
//
// The formulas come from src/math/optim_math.h, the constants folded as cpu_optim.c does, so
// results are the CPU's bits where the compiler evaluates the formulas as the C build does
// (no FMA contraction: nvcc -fmad=false; on the emulated device g++ with -ffp-contract=off)
// and the device pow equals libm's (Adam's bias correction, in double).
#include "cuda_compat.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"
#include "../math/dense_layout.h"
#include "../math/half.h"

#ifdef __CUDACC__
#define MTA_UNROLL _Pragma("unroll")
#else
#define MTA_UNROLL
#endif
#define MTA_DEV __device__ __forceinline__

namespace { // internal linkage: other .cu files have helpers of similar names

constexpr int MTA_THREADS = 512;
constexpr int MTA_ILP = 4;                      // elements per thread per step
constexpr int MTA_STEP = MTA_THREADS * MTA_ILP; // elements per block per step
constexpr int64_t MTA_CHUNK = 65536;            // elements per block
constexpr int MTA_MAX_BLOCKS = 320;             // block map entries per launch
// The one-tensor optimizer kernel: fewer threads, so its five strided offsets (64-bit
// divisions over up to 8 dims) fit in registers without spilling.
constexpr int MTA_STRIDED_THREADS = 256;
constexpr size_t MTA_PARAM_LIMIT = 4096; // bytes of kernel parameters, every GPU
constexpr size_t MTA_OTHER_PARAMS = 256; // room kept for a kernel's other arguments
static_assert(MTA_CHUNK % MTA_STEP == 0, "a chunk is whole steps, so chunk starts stay aligned");

// ---------------------------------------------------------------- the tensor table

// D addresses per tensor (one per operand), as the kernel parameter. block_to_tensor is a
// byte, so at most 255 tensors; block_to_chunk an int (2^31 chunks of 65,536 elements).
template <int D> struct mta_list {
    static constexpr int max_tensors =
        (int)((MTA_PARAM_LIMIT - MTA_OTHER_PARAMS - MTA_MAX_BLOCKS * 5) / (D * 8 + 8));
    char *addr[D][max_tensors];
    int64_t numel[max_tensors];
    unsigned char block_to_tensor[MTA_MAX_BLOCKS];
    int block_to_chunk[MTA_MAX_BLOCKS];
};
static_assert(mta_list<1>::max_tensors <= 255, "block_to_tensor is a byte");

// Fills the table tensor by tensor and calls launch(table, blocks) whenever the block map or
// the tensor slots are full, and once at the end. take(i, addr, &numel) says whether tensor
// i belongs to this pass (and gives its D addresses and element count).
template <int D, class Take, class Launch> void mta_apply(int n, Take take, Launch launch) {
    typedef mta_list<D> L;
    static_assert(sizeof(L) <= MTA_PARAM_LIMIT - MTA_OTHER_PARAMS, "kernel parameter limit");
    L tl;
    memset(&tl, 0, sizeof tl); // unused slots travel too: keep them defined
    int nt = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        char *addr[D];
        int64_t numel = 0;
        if (!take(i, addr, &numel) || numel <= 0) continue;
        for (int d = 0; d < D; d++) tl.addr[d][nt] = addr[d];
        tl.numel[nt] = numel;
        int64_t chunks = (numel + MTA_CHUNK - 1) / MTA_CHUNK;
        for (int64_t ch = 0; ch < chunks; ch++) {
            tl.block_to_tensor[nb] = (unsigned char)nt;
            tl.block_to_chunk[nb] = (int)ch;
            nb++;
            bool last = ch == chunks - 1;
            if (nb < MTA_MAX_BLOCKS && !(last && nt + 1 == L::max_tensors)) continue;
            launch(tl, nb); // the launch copies the table: it may be refilled at once
            nb = 0;
            if (last) {
                nt = -1; // the tensor is done: the next one starts in slot 0
            } else {     // the rest of this tensor goes on in slot 0
                for (int d = 0; d < D; d++) tl.addr[d][0] = tl.addr[d][nt];
                tl.numel[0] = tl.numel[nt];
                nt = 0;
            }
        }
        nt++;
    }
    if (nb > 0) launch(tl, nb);
}

// Row-major with no gaps (size-1 dims may have any stride): element i in row-major order is at
// data + i (the strided kernels' flat index).
__host__ __device__ bool mta_dense(const mt_cuda_array &a) {
    int64_t s = 1;
    for (int d = a.ndim - 1; d >= 0; d--) {
        if (a.shape[d] != 1 && a.strides[d] != s) return false;
        s *= a.shape[d];
    }
    return true;
}

// Dense in any dim order (row-major, channels-last): element i in memory order is data + i.
bool mta_packed(const mt_cuda_array &a) {
    return mt_dims_dense(a.ndim, a.shape, a.strides);
}

// b has a's shape and strides: memory position i of both is the same element.
bool mta_same_layout(const mt_cuda_array &a, const mt_cuda_array &b) {
    return a.ndim == b.ndim && memcmp(a.shape, b.shape, (size_t)a.ndim * sizeof *a.shape) == 0 &&
           mt_dims_same_strides(a.ndim, a.shape, a.strides, b.strides);
}

bool mta_floating(mt_dtype dt) {
    return dt == MT_F32 || dt == MT_F16 || dt == MT_BF16 || dt == MT_F64;
}

// The block's chunk of table entry t: its first element and length.
template <class L> MTA_DEV int mta_tensor(const L &tl) {
    return tl.block_to_tensor[blockIdx.x];
}
template <class L> MTA_DEV int64_t mta_begin(const L &tl) {
    return (int64_t)tl.block_to_chunk[blockIdx.x] * MTA_CHUNK;
}
template <class L> MTA_DEV int64_t mta_length(const L &tl, int t) {
    int64_t rest = tl.numel[t] - mta_begin(tl);
    return rest < MTA_CHUNK ? rest : MTA_CHUNK;
}

// Slot S of entry t, or null where the table has no slot S (a kind with fewer moments).
template <int S, int D> MTA_DEV char *mta_slot(const mta_list<D> &tl, int t) {
    if constexpr (S < D) {
        return tl.addr[S][t];
    } else {
        (void)tl;
        (void)t;
        return nullptr;
    }
}

// ---------------------------------------------------------------- storage and access

// bits: what memory holds; comp: the register type (FP32, F64 for F64); bad(b): inf or NaN,
// read off the exponent field so it is exact and costs no conversion.
struct mta_f32 {
    typedef float bits;
    typedef float comp;
    static constexpr mt_dtype dtype = MT_F32;
    static MTA_DEV float load(float b) { return b; }
    static MTA_DEV float store(float v) { return v; }
    static MTA_DEV bool bad(float b) { return (mt_f32_bits(b) & 0x7f800000u) == 0x7f800000u; }
};
struct mta_f16 {
    typedef uint16_t bits;
    typedef float comp;
    static constexpr mt_dtype dtype = MT_F16;
    static MTA_DEV float load(uint16_t b) { return mt_f16_to_f32(b); }
    static MTA_DEV uint16_t store(float v) { return mt_f32_to_f16(v); }
    static MTA_DEV bool bad(uint16_t b) { return (b & 0x7c00u) == 0x7c00u; }
};
struct mta_bf16 {
    typedef uint16_t bits;
    typedef float comp;
    static constexpr mt_dtype dtype = MT_BF16;
    static MTA_DEV float load(uint16_t b) { return mt_bf16_to_f32(b); }
    static MTA_DEV uint16_t store(float v) { return mt_f32_to_bf16(v); }
    static MTA_DEV bool bad(uint16_t b) { return (b & 0x7f80u) == 0x7f80u; }
};
struct mta_f64 {
    typedef double bits;
    typedef double comp;
    static constexpr mt_dtype dtype = MT_F64;
    static MTA_DEV double load(double b) { return b; }
    static MTA_DEV double store(double v) { return v; }
    static MTA_DEV bool bad(double b) {
        uint64_t u;
        memcpy(&u, &b, sizeof u);
        return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    }
};

// Four elements as one aligned access.
template <typename T> struct alignas(sizeof(T) * MTA_ILP) mta_vec { T v[MTA_ILP]; };
template <typename T> MTA_DEV bool mta_vec_aligned(const T *p) {
    return p == nullptr || (uintptr_t)p % alignof(mta_vec<T>) == 0;
}

// Element j of this thread's four in the step at i0: consecutive (VEC: one vector access)
// or 512 apart (scalar: each access coalesced across the block).
template <bool VEC> MTA_DEV int64_t mta_at(int64_t i0, int j) {
    return VEC ? i0 + (int64_t)threadIdx.x * MTA_ILP + j
               : i0 + (int64_t)threadIdx.x + (int64_t)j * MTA_THREADS;
}
template <bool VEC, typename T>
MTA_DEV void mta_load(T (&r)[MTA_ILP], const T *p, int64_t i0, int64_t n) {
    if (VEC && mta_at<VEC>(i0, MTA_ILP - 1) < n) {
        mta_vec<T> q = *(const mta_vec<T> *)(p + mta_at<VEC>(i0, 0));
        MTA_UNROLL
        for (int j = 0; j < MTA_ILP; j++) r[j] = q.v[j];
        return;
    }
    MTA_UNROLL
    for (int j = 0; j < MTA_ILP; j++)
        if (mta_at<VEC>(i0, j) < n) r[j] = p[mta_at<VEC>(i0, j)];
}
template <bool VEC, typename T>
MTA_DEV void mta_store(T *p, const T (&r)[MTA_ILP], int64_t i0, int64_t n) {
    if (VEC && mta_at<VEC>(i0, MTA_ILP - 1) < n) {
        mta_vec<T> q;
        MTA_UNROLL
        for (int j = 0; j < MTA_ILP; j++) q.v[j] = r[j];
        *(mta_vec<T> *)(p + mta_at<VEC>(i0, 0)) = q;
        return;
    }
    MTA_UNROLL
    for (int j = 0; j < MTA_ILP; j++)
        if (mta_at<VEC>(i0, j) < n) p[mta_at<VEC>(i0, j)] = r[j];
}

// Strided access for the one-tensor kernels: the element offset of flat index i, and loads
// and stores of any floating dtype as the CPU's converters do (F16/BF16 through FP32).
MTA_DEV int64_t mta_offset(const mt_cuda_array &a, bool dense, int64_t i) {
    if (dense) return i;
    int64_t off = 0;
    MTA_UNROLL
    for (int d = MT_MAX_DIMS - 1; d >= 0; d--) {
        if (d >= a.ndim) continue;
        int64_t q = i / a.shape[d];
        off += (i - q * a.shape[d]) * a.strides[d];
        i = q;
    }
    return off;
}
template <typename C> MTA_DEV C mta_get(const char *p, mt_dtype dt, int64_t off) {
    switch (dt) {
    case MT_F16:
        return (C)mt_f16_to_f32(((const uint16_t *)p)[off]);
    case MT_BF16:
        return (C)mt_bf16_to_f32(((const uint16_t *)p)[off]);
    case MT_F64:
        return (C)((const double *)p)[off];
    default:
        return (C)((const float *)p)[off];
    }
}
template <typename C> MTA_DEV void mta_put(char *p, mt_dtype dt, int64_t off, C v) {
    switch (dt) {
    case MT_F16:
        ((uint16_t *)p)[off] = mt_f32_to_f16((float)v);
        break;
    case MT_BF16:
        ((uint16_t *)p)[off] = mt_f32_to_bf16((float)v);
        break;
    case MT_F64:
        ((double *)p)[off] = (double)v;
        break;
    default:
        ((float *)p)[off] = (float)v;
        break;
    }
}

// ---------------------------------------------------------------- unscale

// Multiplies n elements at x by inv (when scale) and returns whether any was inf/nan.
// Check-only (inv == 1) stores nothing, so a NaN's payload survives as on the CPU.
template <class S, bool VEC>
MTA_DEV bool mta_unscale_span(typename S::bits *x, int64_t n, typename S::comp inv, bool scale) {
    typedef typename S::bits B;
    bool bad = false;
    for (int64_t i0 = 0; i0 < n; i0 += MTA_STEP) {
        B b[MTA_ILP] = {}; // lanes past n stay 0: finite, never stored
        mta_load<VEC>(b, x, i0, n);
        MTA_UNROLL
        for (int j = 0; j < MTA_ILP; j++) bad |= S::bad(b[j]);
        if (!scale) continue;
        MTA_UNROLL
        for (int j = 0; j < MTA_ILP; j++) b[j] = S::store(S::load(b[j]) * inv);
        mta_store<VEC>(x, b, i0, n);
    }
    return bad;
}

template <class S>
__global__ void __launch_bounds__(MTA_THREADS)
    mta_unscale_dense(mta_list<1> tl, const float *inv_scale, float *found_inf) {
    typedef typename S::bits B;
    typedef typename S::comp C;
    int t = mta_tensor(tl);
    int64_t n = mta_length(tl, t);
    B *x = (B *)tl.addr[0][t] + mta_begin(tl);
    float inv = inv_scale ? *inv_scale : 1.0f; // F64 multiplies by the same value widened
    bool scale = inv != 1.0f;
    bool bad = mta_vec_aligned(x) ? mta_unscale_span<S, true>(x, n, (C)inv, scale)
                                  : mta_unscale_span<S, false>(x, n, (C)inv, scale);
    if (bad) *found_inf = 1.0f; // every writer stores the same value; nobody clears it
}

// One non-dense tensor; block b takes flat indices [b * MTA_CHUNK, + MTA_CHUNK).
__global__ void __launch_bounds__(MTA_THREADS)
    mta_unscale_strided(mt_cuda_array t, const float *inv_scale, float *found_inf) {
    float inv = inv_scale ? *inv_scale : 1.0f;
    bool scale = inv != 1.0f, bad = false;
    int64_t b = (int64_t)blockIdx.x * MTA_CHUNK;
    int64_t e = b + MTA_CHUNK < t.numel ? b + MTA_CHUNK : t.numel;
    for (int64_t i = b + (int64_t)threadIdx.x; i < e; i += MTA_THREADS) {
        int64_t off = mta_offset(t, false, i);
        if (t.dtype == MT_F64) { // uniform across the grid
            double x = ((double *)t.data)[off];
            bad |= mta_f64::bad(x);
            if (scale) ((double *)t.data)[off] = x * (double)inv;
        } else {
            float x = mta_get<float>(t.data, t.dtype, off);
            bad |= mta_f32::bad(x);
            if (scale) mta_put<float>(t.data, t.dtype, off, x * inv);
        }
    }
    if (bad) *found_inf = 1.0f;
}

// One MTA pass over the dense gradients of dtype S::dtype.
template <class S>
void mta_unscale_pass(const mt_cuda_ctx *c, const mt_cuda_array *g, int n, const float *inv,
                      float *found_inf) {
    auto take = [&](int i, char **addr, int64_t *numel) {
        if (!g[i].data || g[i].dtype != S::dtype || !mta_packed(g[i])) return false;
        addr[0] = g[i].data;
        *numel = g[i].numel;
        return true;
    };
    auto launch = [&](const mta_list<1> &tl, int blocks) {
        MT_LAUNCH(mta_unscale_dense<S>, blocks, MTA_THREADS, 0, c->stream, tl, inv, found_inf);
    };
    mta_apply<1>(n, take, launch);
}

// ---------------------------------------------------------------- loss scale update

// One thread: the F32 device scalars widened to double, as cpu_amp.c reads them.
__global__ void mta_scale_update(mt_cuda_scale_update_args a) {
    double scale = *a.scale, good = *a.good_steps, bad = *a.bad_steps;
    double skipped = *a.skipped_steps;
    bool found = a.found_inf && *a.found_inf != 0.0f;
    mt_loss_scale_update(found, &scale, &good, &bad, &skipped, a.growth_factor, a.backoff_factor,
                         a.growth_interval, a.backoff_after, a.min_scale, a.max_scale);
    *a.scale = (float)scale;
    *a.good_steps = (float)good;
    *a.bad_steps = (float)bad;
    *a.skipped_steps = (float)skipped;
}

// ---------------------------------------------------------------- optimizer step

enum { MTA_SGD, MTA_MOMENTUM, MTA_NESTEROV, MTA_ADAM }; // AdamW is Adam with other constants

// The optim_math.h formulas by compute type (their names carry a suffix).
MTA_DEV mt_optim_consts_f mta_narrow(const mt_optim_hyper *h, float) {
    return mt_optim_narrow_f(h);
}
MTA_DEV mt_optim_consts_d mta_narrow(const mt_optim_hyper *h, double) {
    return mt_optim_narrow_d(h);
}
MTA_DEV float mta_sgd(float p, float g, const mt_optim_consts_f &c) {
    return mt_sgd_update_f(p, g, c);
}
MTA_DEV double mta_sgd(double p, double g, const mt_optim_consts_d &c) {
    return mt_sgd_update_d(p, g, c);
}
MTA_DEV float mta_momentum(float p, float g, float *b, const mt_optim_consts_f &c, bool nest) {
    return mt_momentum_update_f(p, g, b, c, nest);
}
MTA_DEV double mta_momentum(double p, double g, double *b, const mt_optim_consts_d &c, bool nest) {
    return mt_momentum_update_d(p, g, b, c, nest);
}
MTA_DEV float mta_adam(float p, float g, float *m, float *v, const mt_optim_consts_f &c) {
    return mt_adam_update_f(p, g, m, v, c);
}
MTA_DEV double mta_adam(double p, double g, double *m, double *v, const mt_optim_consts_d &c) {
    return mt_adam_update_d(p, g, m, v, c);
}

// One (kind, parameter storage) pair: the table depth (param, grad, master, moments, and for
// Adam the parameter's step count) and the update with the kind fixed at compile time, so each
// loop keeps one form (as cpu_optim.c).
template <int K, class S> struct mta_optim {
    typedef S st;
    typedef typename S::comp C;
    typedef decltype(mta_narrow(nullptr, C())) consts;
    static constexpr int moments = K == MTA_SGD ? 0 : K == MTA_ADAM ? 2 : 1;
    static constexpr bool adam = K == MTA_ADAM;
    static constexpr int depth = 3 + moments + (adam ? 1 : 0);
    static MTA_DEV C update(C p, C g, C &m, C &v, const consts &c) {
        if (K == MTA_SGD) return mta_sgd(p, g, c);
        if (K == MTA_MOMENTUM) return mta_momentum(p, g, &m, c, false);
        if (K == MTA_NESTEROV) return mta_momentum(p, g, &m, c, true);
        return mta_adam(p, g, &m, &v, c);
    }
};

// What every optimizer kernel takes besides its tensors: the constants folded on the host
// (inv_scale, step_size and bc2_sqrt are filled per block from the device scalars). Adam's
// step counts are per parameter: the dense kernel finds its tensor's in the table, the strided
// one takes it here.
struct mta_optim_args {
    mt_optim_hyper h;
    const float *found_inf, *inv_scale, *step_count;
};
static_assert(sizeof(mta_optim_args) <= MTA_OTHER_PARAMS, "parameter limit");

// Thread 0 reads the device scalars and folds this step's constants (in double, as the CPU
// does: Adam's t = *step + 1, step the count of the block's tensor), the block shares them
// through shared memory. Returns false, for every thread, when *found_inf is set: the step is
// skipped.
template <class U>
MTA_DEV bool mta_optim_begin(const mta_optim_args &a, const float *step, typename U::consts *out) {
    typedef typename U::consts CS;
    MT_SHARED(CS, mta_consts, 1);
    MT_SHARED(int, mta_go, 1);
    if (threadIdx.x == 0) {
        bool skip = a.found_inf && *a.found_inf != 0.0f;
        *mta_go = !skip;
        if (!skip) {
            mt_optim_hyper h = a.h;
            h.inv_scale = a.inv_scale ? (double)*a.inv_scale : 1.0;
            if (U::adam) {
                double t = (step ? (double)*step : 0.0) + 1.0;
                mt_adam_bias_correction(h.lr, h.beta1, h.beta2, t, &h.step_size, &h.bc2_sqrt);
            }
            *mta_consts = mta_narrow(&h, typename U::C());
        }
    }
    __syncthreads();
    if (!*mta_go) return false; // the same answer in every thread: nobody waits below
    *out = *mta_consts;
    return true;
}

// n elements of one chunk: p (storage), g (same storage), w (FP32 master or null), moments.
// With a master, the master is the working copy and the parameter receives it rounded.
template <class U, bool VEC>
MTA_DEV void mta_optim_span(typename U::st::bits *p, const typename U::st::bits *g, float *w,
                            typename U::C *m1, typename U::C *m2, int64_t n,
                            const typename U::consts &c) {
    typedef typename U::st S;
    typedef typename S::bits B;
    typedef typename U::C C;
    for (int64_t i0 = 0; i0 < n; i0 += MTA_STEP) {
        B pb[MTA_ILP] = {}, gb[MTA_ILP] = {};
        C pv[MTA_ILP] = {}, mv[MTA_ILP] = {}, vv[MTA_ILP] = {};
        float wv[MTA_ILP] = {};
        if (w) {
            mta_load<VEC>(wv, w, i0, n);
        } else {
            mta_load<VEC>(pb, p, i0, n);
        }
        mta_load<VEC>(gb, g, i0, n);
        if (U::moments >= 1) mta_load<VEC>(mv, m1, i0, n);
        if (U::moments >= 2) mta_load<VEC>(vv, m2, i0, n);
        MTA_UNROLL
        for (int j = 0; j < MTA_ILP; j++) {
            C x = w ? (C)wv[j] : S::load(pb[j]);
            pv[j] = U::update(x, S::load(gb[j]), mv[j], vv[j], c);
            wv[j] = (float)pv[j];
            pb[j] = S::store(pv[j]);
        }
        if (w) mta_store<VEC>(w, wv, i0, n);
        mta_store<VEC>(p, pb, i0, n);
        if (U::moments >= 1) mta_store<VEC>(m1, mv, i0, n);
        if (U::moments >= 2) mta_store<VEC>(m2, vv, i0, n);
    }
}

// Table slots: 0 param, 1 grad, 2 master (FP32, null when absent), 3 m / momentum, 4 v,
// 5 Adam's step count (F32, null when absent).
template <class U>
__global__ void __launch_bounds__(MTA_THREADS)
    mta_optim_dense(mta_list<U::depth> tl, mta_optim_args a) {
    typedef typename U::st::bits B;
    typedef typename U::C C;
    typename U::consts c;
    int t = mta_tensor(tl);
    if (!mta_optim_begin<U>(a, (const float *)mta_slot<5>(tl, t), &c)) return;
    int64_t b = mta_begin(tl), n = mta_length(tl, t);
    B *p = (B *)tl.addr[0][t] + b;
    const B *g = (const B *)tl.addr[1][t] + b;
    float *w = tl.addr[2][t] ? (float *)tl.addr[2][t] + b : nullptr;
    C *m1 = (C *)mta_slot<3>(tl, t), *m2 = (C *)mta_slot<4>(tl, t);
    m1 = m1 ? m1 + b : nullptr;
    m2 = m2 ? m2 + b : nullptr;
    bool vec = mta_vec_aligned(p) && mta_vec_aligned(g) && mta_vec_aligned(w) &&
               mta_vec_aligned(m1) && mta_vec_aligned(m2);
    if (vec)
        mta_optim_span<U, true>(p, g, w, m1, m2, n, c);
    else
        mta_optim_span<U, false>(p, g, w, m1, m2, n, c);
}

// One tensor whose operands are not all dense or whose gradient dtype differs: any floating
// dtypes for param and grad, loaded to the compute type as the CPU's converters do.
struct mta_optim_operands {
    mt_cuda_array p, g, w, m1, m2; // absent: data null
};
static_assert(sizeof(mta_optim_operands) + sizeof(mta_optim_args) <= MTA_PARAM_LIMIT,
              "parameter limit");

template <class U>
__global__ void __launch_bounds__(MTA_STRIDED_THREADS)
    mta_optim_strided(mta_optim_operands o, mta_optim_args a) {
    typedef typename U::C C;
    typename U::consts c;
    if (!mta_optim_begin<U>(a, a.step_count, &c)) return;
    bool dp = mta_dense(o.p), dg = mta_dense(o.g), dw = mta_dense(o.w);
    bool d1 = mta_dense(o.m1), d2 = mta_dense(o.m2);
    int64_t b = (int64_t)blockIdx.x * MTA_CHUNK;
    int64_t e = b + MTA_CHUNK < o.p.numel ? b + MTA_CHUNK : o.p.numel;
    for (int64_t i = b + (int64_t)threadIdx.x; i < e; i += MTA_STRIDED_THREADS) {
        int64_t op = mta_offset(o.p, dp, i), ow = mta_offset(o.w, dw, i);
        int64_t o1 = mta_offset(o.m1, d1, i), o2 = mta_offset(o.m2, d2, i);
        C x = o.w.data ? (C)((const float *)o.w.data)[ow] : mta_get<C>(o.p.data, o.p.dtype, op);
        C g = mta_get<C>(o.g.data, o.g.dtype, mta_offset(o.g, dg, i));
        C m = U::moments >= 1 ? ((const C *)o.m1.data)[o1] : (C)0;
        C v = U::moments >= 2 ? ((const C *)o.m2.data)[o2] : (C)0;
        C r = U::update(x, g, m, v, c);
        if (o.w.data) ((float *)o.w.data)[ow] = (float)r;
        mta_put<C>(o.p.data, o.p.dtype, op, r);
        if (U::moments >= 1) ((C *)o.m1.data)[o1] = m;
        if (U::moments >= 2) ((C *)o.m2.data)[o2] = v;
    }
}

// Runs after every update kernel of the call (stream order), so they all saw the old counts:
// advances n consecutive parameters' step counts.
__global__ void mta_optim_count(const float *found_inf, float *steps, int n) {
    if (found_inf && *found_inf != 0.0f) return;
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) steps[i] = (float)((double)steps[i] + 1.0); // as the CPU stores t
}

// ---------------------------------------------------------------- host side: optimizer

// The array of n entries, or an absent one (masters/moments may be omitted altogether).
const mt_cuda_array *mta_entry(const mt_cuda_array *a, int i) {
    static const mt_cuda_array absent = {};
    return a && a[i].data ? &a[i] : &absent;
}

// Whether parameter i takes part (a gradient, and elements to update).
bool mta_active(const mt_cuda_optim_args *a, int i) {
    return a->params[i].data && a->grads && a->grads[i].data && a->params[i].numel > 0;
}

int mta_moments(mt_optim_kind kind) {
    return kind == MT_OPTIM_SGD ? 0 : kind == MT_OPTIM_MOMENTUM ? 1 : 2;
}

// The layout the kernels rely on, checked before anything is queued: floating params and
// grads of the param's size, FP32 masters and moments of the compute type (F64 for F64
// params) of the same size, present where the kind needs them.
bool mta_optim_valid(const mt_cuda_optim_args *a) {
    for (int i = 0; i < a->n; i++) {
        if (!mta_active(a, i)) continue;
        const mt_cuda_array &p = a->params[i], &g = a->grads[i];
        const mt_cuda_array *w = mta_entry(a->masters, i);
        const mt_cuda_array *m[2] = {mta_entry(a->moment1, i), mta_entry(a->moment2, i)};
        mt_dtype comp = p.dtype == MT_F64 ? MT_F64 : MT_F32;
        if (!mta_floating(p.dtype) || !mta_floating(g.dtype) || g.numel != p.numel) return false;
        if (p.dtype != MT_F64 && w->data && (w->dtype != MT_F32 || w->numel != p.numel))
            return false;
        for (int k = 0; k < mta_moments(a->kind); k++)
            if (!m[k]->data || m[k]->dtype != comp || m[k]->numel != p.numel) return false;
    }
    return true;
}

// Whether (active) parameter i goes through the MTA kernels: the parameter dense (in any dim
// order: channels-last too) and every operand in its layout, so the kernels walk them all in
// memory order; the gradient in the parameter's dtype.
bool mta_optim_fast(const mt_cuda_optim_args *a, int i, int moments) {
    const mt_cuda_array &p = a->params[i], &g = a->grads[i];
    const mt_cuda_array *w = mta_entry(a->masters, i);
    bool ok = g.dtype == p.dtype && mta_packed(p) && mta_same_layout(p, g);
    if (p.dtype != MT_F64 && w->data) ok = ok && mta_same_layout(p, *w);
    if (moments >= 1) ok = ok && mta_same_layout(p, *mta_entry(a->moment1, i));
    if (moments >= 2) ok = ok && mta_same_layout(p, *mta_entry(a->moment2, i));
    return ok;
}

// One MTA pass over the active, fast parameters of storage U::st.
template <class U>
void mta_optim_pass(const mt_cuda_ctx *c, const mt_cuda_optim_args *a, const mta_optim_args &k) {
    constexpr int D = U::depth;
    auto take = [&](int i, char **addr, int64_t *numel) {
        const mt_cuda_array &p = a->params[i];
        if (!mta_active(a, i) || p.dtype != U::st::dtype || !mta_optim_fast(a, i, U::moments))
            return false;
        addr[0] = p.data;
        addr[1] = a->grads[i].data;
        addr[2] = p.dtype == MT_F64 ? nullptr : mta_entry(a->masters, i)->data; // CPU: F64 has none
        if constexpr (D > 3) addr[3] = a->moment1[i].data;
        if constexpr (D > 4) addr[4] = a->moment2[i].data;
        if constexpr (D > 5) addr[5] = a->step_count ? (char *)(a->step_count + i) : nullptr;
        *numel = p.numel;
        return true;
    };
    auto launch = [&](const mta_list<D> &tl, int blocks) {
        MT_LAUNCH(mta_optim_dense<U>, blocks, MTA_THREADS, 0, c->stream, tl, k);
    };
    mta_apply<D>(a->n, take, launch);
}

// The strided kernel for each active parameter the MTA passes left out.
template <class UF, class UD>
void mta_optim_rest(const mt_cuda_ctx *c, const mt_cuda_optim_args *a, const mta_optim_args &k) {
    for (int i = 0; i < a->n; i++) {
        if (!mta_active(a, i) || mta_optim_fast(a, i, UF::moments)) continue;
        const mt_cuda_array &p = a->params[i];
        mta_optim_operands o = {p, a->grads[i], *mta_entry(a->masters, i),
                                *mta_entry(a->moment1, i), *mta_entry(a->moment2, i)};
        int64_t blocks = (p.numel + MTA_CHUNK - 1) / MTA_CHUNK;
        mta_optim_args ki = k; // this parameter's step count
        ki.step_count = UF::adam && a->step_count ? a->step_count + i : nullptr;
        if (p.dtype == MT_F64) {
            o.w = mt_cuda_array{}; // the CPU updates F64 params in place, masters or not
            MT_LAUNCH(mta_optim_strided<UD>, blocks, MTA_STRIDED_THREADS, 0, c->stream, o, ki);
        } else {
            MT_LAUNCH(mta_optim_strided<UF>, blocks, MTA_STRIDED_THREADS, 0, c->stream, o, ki);
        }
    }
}

template <int K>
void mta_optim_run(const mt_cuda_ctx *c, const mt_cuda_optim_args *a, const mta_optim_args &k) {
    typedef mta_optim<K, mta_f32> U32;
    typedef mta_optim<K, mta_f16> U16;
    typedef mta_optim<K, mta_bf16> UB16;
    typedef mta_optim<K, mta_f64> U64;
    mta_optim_pass<U32>(c, a, k);
    mta_optim_pass<U16>(c, a, k);
    mta_optim_pass<UB16>(c, a, k);
    mta_optim_pass<U64>(c, a, k);
    mta_optim_rest<U32, U64>(c, a, k);
}

} // namespace

// ---------------------------------------------------------------- entry points

extern "C" int mt_cuda_unscale(const mt_cuda_ctx *c, const mt_cuda_array *grads, int n,
                               const float *inv_scale, float *found_inf) {
    if (n > 0 && (!grads || !found_inf)) return (int)cudaErrorInvalidValue;
    for (int i = 0; i < n; i++)
        if (grads[i].data && !mta_floating(grads[i].dtype)) return (int)cudaErrorInvalidValue;
    mta_unscale_pass<mta_f32>(c, grads, n, inv_scale, found_inf);
    mta_unscale_pass<mta_f16>(c, grads, n, inv_scale, found_inf);
    mta_unscale_pass<mta_bf16>(c, grads, n, inv_scale, found_inf);
    mta_unscale_pass<mta_f64>(c, grads, n, inv_scale, found_inf);
    for (int i = 0; i < n; i++) {
        const mt_cuda_array &g = grads[i];
        if (!g.data || g.numel <= 0 || mta_packed(g)) continue;
        int64_t blocks = (g.numel + MTA_CHUNK - 1) / MTA_CHUNK;
        MT_LAUNCH(mta_unscale_strided, blocks, MTA_THREADS, 0, c->stream, g, inv_scale, found_inf);
    }
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_scale_update(const mt_cuda_ctx *c, const mt_cuda_scale_update_args *a) {
    MT_LAUNCH(mta_scale_update, 1, 1, 0, c->stream, *a);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_optim_step(const mt_cuda_ctx *c, const mt_cuda_optim_args *a) {
    if (a->n > 0 && (!a->params || !mta_optim_valid(a))) return (int)cudaErrorInvalidValue;
    bool adam = a->kind == MT_OPTIM_ADAM || a->kind == MT_OPTIM_ADAMW;
    mta_optim_args k = {};
    k.h.lr = a->lr;
    k.h.momentum = a->momentum;
    k.h.beta1 = a->beta1;
    k.h.beta2 = a->beta2;
    k.h.eps = a->eps;
    mt_optim_weight_decay(a->lr, a->weight_decay, a->kind == MT_OPTIM_ADAMW, &k.h.l2, &k.h.decay);
    k.found_inf = a->found_inf;
    k.inv_scale = a->inv_scale;
    k.step_count = nullptr; // per parameter: the table's slot 5, or set per strided launch
    if (a->kind == MT_OPTIM_SGD)
        mta_optim_run<MTA_SGD>(c, a, k);
    else if (a->kind == MT_OPTIM_MOMENTUM)
        a->nesterov ? mta_optim_run<MTA_NESTEROV>(c, a, k) : mta_optim_run<MTA_MOMENTUM>(c, a, k);
    else
        mta_optim_run<MTA_ADAM>(c, a, k);
    // after every block used the old counts: each run of consecutive parameters that had a
    // gradient advances (empty ones too, as the CPU and torch count them)
    for (int i = 0; adam && a->step_count && a->stepped && i < a->n;) {
        if (!a->stepped[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j < a->n && a->stepped[j]) j++;
        MT_LAUNCH(mta_optim_count, (j - i + 255) / 256, 256, 0, c->stream, a->found_inf,
                  a->step_count + i, j - i);
        i = j;
    }
    return (int)cudaGetLastError();
}
