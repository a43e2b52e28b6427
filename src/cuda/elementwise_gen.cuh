// What both elementwise kernel files (elementwise.cu: the ops with a formula; copy_fill.cu:
// copy, fill, where, Philox draws and the inf/nan check) are built on: the floating storages
// and the dtype-switched loads and stores, the gen kernel that runs a per-element "body" over
// any layout and dtypes, and the host side of planning and launching it.
//
// Every kernel is a grid-stride loop of 256-thread blocks, in one of two shapes:
// - vec: every operand contiguous, of one floating dtype and 16-byte aligned; each thread
//   moves 16 bytes per operand per step (4 F32, 8 F16/BF16, 2 F64), the flat index is the
//   element index (the vec kernels are in the two .cu files);
// - gen: any layout and dtypes. The flat index is split over the coalesced shape into a
//   byte offset per operand: in 32-bit arithmetic with multiply-shift division when the
//   element count and every operand's offset range fit in int32 (nearly always), else in
//   64-bit. Operands load through a dtype switch (the same for the whole grid, so warps do
//   not diverge) into FP32, or F64 for F64 and integer inputs, as the CPU computes. What a
//   gen kernel does per element is a "body" struct, so one kernel template serves all.
// Everything is in an anonymous namespace: each .cu file gets its own copy (other .cu files
// have helpers of similar names), so the host functions are inline (no unused-function
// warnings where a file does not call one).
#ifndef MT_CUDA_ELEMENTWISE_GEN_CUH
#define MT_CUDA_ELEMENTWISE_GEN_CUH
#include "cuda_compat.h"
#include <stdint.h>
#include <string.h>
#include "kernels.h"
#include "../math/half.h"
#include "../math/int_convert.h"

#define EW_DEV __device__ __forceinline__
#ifdef __CUDACC__
#define EW_UNROLL _Pragma("unroll")
#else
#define EW_UNROLL
#endif

namespace { // internal linkage: see above

constexpr int EW_THREADS = 256;

// ---------------------------------------------------------------- storage and conversion

// Floating storage as template arguments (F16 and BF16 are both 16-bit words, so tags):
// bits is what memory holds, comp the register type the formulas run in, raw the bits as
// an unsigned integer and inf_mask its exponent field (all ones: inf or NaN).
template <typename B, typename C, typename R, R MASK> struct ew_storage {
    typedef B bits;
    typedef C comp;
    typedef R raw;
    static constexpr R inf_mask = MASK;
};
struct ew_f32 : ew_storage<float, float, uint32_t, 0x7f800000u> {
    static EW_DEV float load(float b) { return b; }
    static EW_DEV float store(float v) { return v; }
};
struct ew_f16 : ew_storage<uint16_t, float, uint16_t, 0x7c00u> {
    static EW_DEV float load(uint16_t b) { return mt_f16_to_f32(b); }
    static EW_DEV uint16_t store(float v) { return mt_f32_to_f16(v); }
};
struct ew_bf16 : ew_storage<uint16_t, float, uint16_t, 0x7f80u> {
    static EW_DEV float load(uint16_t b) { return mt_bf16_to_f32(b); }
    static EW_DEV uint16_t store(float v) { return mt_f32_to_bf16(v); }
};
struct ew_f64 : ew_storage<double, double, uint64_t, 0x7ff0000000000000ull> {
    static EW_DEV double load(double b) { return b; }
    static EW_DEV double store(double v) { return v; }
};

// V elements moved as one aligned access; 16-byte accesses hold ew_width<T> elements.
template <typename T, int V> struct alignas(sizeof(T) * V) ew_vec { T v[V]; };
template <typename T> constexpr int ew_width = (int)(16 / sizeof(T));

// Any dtype widened to C as the CPU's loads do (cpu_convert.c): integers convert, BOOL is
// 0 or 1. For C = int64_t (integer comparisons) values load exactly, BOOL as its byte.
template <typename C> EW_DEV C ew_load(const char *p, mt_dtype dt) {
    switch (dt) {
    case MT_F32:
        return (C) * (const float *)p;
    case MT_F16:
        return (C)mt_f16_to_f32(*(const uint16_t *)p);
    case MT_BF16:
        return (C)mt_bf16_to_f32(*(const uint16_t *)p);
    case MT_F64:
        return (C) * (const double *)p;
    case MT_I64:
        return (C) * (const int64_t *)p;
    case MT_I32:
        return (C) * (const int32_t *)p;
    default:
        return *(const uint8_t *)p ? (C)1 : (C)0;
    }
}
template <> EW_DEV int64_t ew_load<int64_t>(const char *p, mt_dtype dt) {
    switch (dt) {
    case MT_I64:
        return *(const int64_t *)p;
    case MT_I32:
        return *(const int32_t *)p;
    default:
        return *(const uint8_t *)p;
    }
}

// Integer stores through src/math/int_convert.h, as the CPU's: a floating value truncates
// (NaN and out of range: the minimum; a GPU's own conversion would saturate), an integer wraps.
template <typename C> EW_DEV int64_t ew_int64_of(C v) {
    return mt_f64_to_i64((double)v);
}
template <> EW_DEV int64_t ew_int64_of<int64_t>(int64_t v) {
    return v;
}
template <typename C> EW_DEV int32_t ew_int32_of(C v) {
    return mt_f64_to_i32((double)v);
}
template <> EW_DEV int32_t ew_int32_of<int64_t>(int64_t v) {
    return mt_i64_to_i32(v);
}

// C stored as dtype dt as the CPU's stores do: F16/BF16 round to nearest even (from double
// through FP32), integers as above, BOOL is "not zero".
template <typename C> EW_DEV void ew_store(char *p, mt_dtype dt, C v) {
    switch (dt) {
    case MT_F32:
        *(float *)p = (float)v;
        break;
    case MT_F16:
        *(uint16_t *)p = mt_f32_to_f16((float)v);
        break;
    case MT_BF16:
        *(uint16_t *)p = mt_f32_to_bf16((float)v);
        break;
    case MT_F64:
        *(double *)p = (double)v;
        break;
    case MT_I64:
        *(int64_t *)p = ew_int64_of(v);
        break;
    case MT_I32:
        *(int32_t *)p = ew_int32_of(v);
        break;
    default:
        *(uint8_t *)p = v != (C)0;
        break;
    }
}

// ---------------------------------------------------------------- index arithmetic

// n / d for n < 2^31 by a multiply and a shift (d >= 1): m and s chosen on the host so that
// q = (mulhi(n, m) + n) >> s (Granlund-Montgomery; the division PyTorch's indexing uses).
struct ew_div32 {
    uint32_t d, m, s;
};
EW_DEV uint32_t ew_div(const ew_div32 &q, uint32_t n) {
    uint32_t t = (uint32_t)(((uint64_t)n * q.m) >> 32);
    return (t + n) >> q.s;
}

// The coalesced shape with byte strides, for 32-bit and 64-bit index arithmetic. The dim
// loops are unrolled with a guard, so the arrays are indexed by constants and stay in the
// kernel's parameter bank (no local memory).
struct ew_geom32 {
    typedef uint32_t index;
    int ndim;
    ew_div32 div[MT_MAX_DIMS];
    int32_t stride[MT_CUDA_ITER_MAX][MT_MAX_DIMS];
    template <int N> EW_DEV void offsets(uint32_t i, int64_t (&off)[N]) const {
        int32_t o[N];
        EW_UNROLL
        for (int k = 0; k < N; k++) o[k] = 0;
        EW_UNROLL
        for (int d = MT_MAX_DIMS - 1; d > 0; d--) {
            if (d >= ndim) continue;
            uint32_t q = ew_div(div[d], i);
            int32_t r = (int32_t)(i - q * div[d].d);
            i = q;
            EW_UNROLL
            for (int k = 0; k < N; k++) o[k] += r * stride[k][d];
        }
        EW_UNROLL
        for (int k = 0; k < N; k++) off[k] = o[k] + (int32_t)i * stride[k][0];
    }
};
struct ew_geom64 {
    typedef int64_t index;
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    int64_t stride[MT_CUDA_ITER_MAX][MT_MAX_DIMS];
    template <int N> EW_DEV void offsets(int64_t i, int64_t (&off)[N]) const {
        EW_UNROLL
        for (int k = 0; k < N; k++) off[k] = 0;
        EW_UNROLL
        for (int d = MT_MAX_DIMS - 1; d > 0; d--) {
            if (d >= ndim) continue;
            int64_t q = i / shape[d], r = i - q * shape[d];
            i = q;
            EW_UNROLL
            for (int k = 0; k < N; k++) off[k] += r * stride[k][d];
        }
        EW_UNROLL
        for (int k = 0; k < N; k++) off[k] += i * stride[k][0];
    }
};

// The grid-stride loop's first index and step.
template <typename I> EW_DEV I ew_first() {
    return (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
}
template <typename I> EW_DEV I ew_step() {
    return (I)gridDim.x * (I)blockDim.x;
}

// ---------------------------------------------------------------- the gen kernel

// Operand pointers and dtypes (operand 0 the output), and what some bodies take besides.
struct ew_ops {
    char *p[MT_CUDA_ITER_MAX];
    mt_dtype dt[MT_CUDA_ITER_MAX];
};
struct ew_extra {
    double p;      // the unary op's scalar (narrowed to the register type, as the CPU does)
    uint64_t bits; // fill: the element's bits
    int *flag;     // has_nonfinite: the device flag
};

// A body (defined by the .cu files): nops operands; apply() handles one element at the operands'
// byte offsets and returns true when it found an inf/nan (only the check's body does).
template <class B, class G> struct ew_gen_cfg { // one type, so a launch names it without a comma
    typedef B body;
    typedef G geom;
    typedef typename G::index index;
};
template <class K>
__global__ void ew_gen(typename K::geom g, ew_ops o, typename K::index n, ew_extra x) {
    typedef typename K::index I;
    bool flagged = false;
    for (I i = ew_first<I>(); i < n; i += ew_step<I>()) {
        int64_t off[K::body::nops];
        g.offsets(i, off);
        flagged |= K::body::apply(o, off, x);
    }
    if (flagged) *x.flag = 1; // every writer stores the same value
}

// ---------------------------------------------------------------- host side: planning

inline int64_t ew_size(mt_dtype dt) {
    switch (dt) {
    case MT_F64:
    case MT_I64:
        return 8;
    case MT_F32:
    case MT_I32:
        return 4;
    case MT_F16:
    case MT_BF16:
        return 2;
    default:
        return 1;
    }
}

inline bool ew_floating(mt_dtype dt) {
    return dt == MT_F32 || dt == MT_F16 || dt == MT_BF16 || dt == MT_F64;
}

// fn(S()) for the storage S of floating dtype dt.
template <class Fn> int ew_with_storage(mt_dtype dt, Fn fn) {
    switch (dt) {
    case MT_F16:
        return fn(ew_f16());
    case MT_BF16:
        return fn(ew_bf16());
    case MT_F64:
        return fn(ew_f64());
    default:
        return fn(ew_f32());
    }
}
// fn(T()) for the unsigned integer T of es bytes.
template <class Fn> int ew_with_size(int64_t es, Fn fn) {
    switch (es) {
    case 1:
        return fn(uint8_t());
    case 2:
        return fn(uint16_t());
    case 4:
        return fn(uint32_t());
    default:
        return fn(uint64_t());
    }
}

// Blocks for `work` grid-stride items: enough to cover it, at most 32 per SM (4 waves of
// fully resident 256-thread blocks; more only adds scheduling).
inline unsigned ew_blocks(const mt_cuda_ctx *c, int64_t work) {
    int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
    int64_t b = (work + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < cap ? b : cap);
}

inline bool ew_aligned(const void *p, size_t bytes) {
    return (uintptr_t)p % bytes == 0;
}

// The launch's status; a failed call (memcpy, memset) wins over the sticky last error,
// which is read either way so that it does not surface at a later, unrelated launch.
inline int ew_status(cudaError_t e) {
    cudaError_t last = cudaGetLastError();
    return (int)(e != cudaSuccess ? e : last);
}

// 32-bit arithmetic is exact when the element count and, for every operand, the range of
// byte offsets (either sign) fit in int32.
inline bool ew_fits32(const mt_cuda_iter *it) {
    if (it->numel > INT32_MAX) return false;
    for (int k = 0; k < it->nops; k++) {
        int64_t es = ew_size(it->dtype[k]), span = 0;
        for (int d = 0; d < it->ndim; d++) {
            int64_t s = it->strides[k][d] * es;
            span += (s < 0 ? -s : s) * (it->shape[d] - 1);
            if (span > INT32_MAX) return false;
        }
    }
    return true;
}

inline ew_div32 ew_make_div(uint32_t d) {
    ew_div32 q;
    q.d = d;
    q.s = 0;
    while (q.s < 32 && (1ull << q.s) < d) q.s++;
    q.m = (uint32_t)(((1ull << 32) * ((1ull << q.s) - d)) / d + 1);
    return q;
}

inline ew_geom32 ew_geom_of32(const mt_cuda_iter *it) {
    ew_geom32 g;
    memset(&g, 0, sizeof g);
    g.ndim = it->ndim;
    for (int d = 0; d < it->ndim; d++) {
        g.div[d] = ew_make_div((uint32_t)it->shape[d]);
        for (int k = 0; k < it->nops; k++)
            g.stride[k][d] = (int32_t)(it->strides[k][d] * ew_size(it->dtype[k]));
    }
    return g;
}

inline ew_geom64 ew_geom_of64(const mt_cuda_iter *it) {
    ew_geom64 g;
    memset(&g, 0, sizeof g);
    g.ndim = it->ndim;
    for (int d = 0; d < it->ndim; d++) {
        g.shape[d] = it->shape[d];
        for (int k = 0; k < it->nops; k++)
            g.stride[k][d] = it->strides[k][d] * ew_size(it->dtype[k]);
    }
    return g;
}

inline ew_ops ew_ops_of(const mt_cuda_iter *it) {
    ew_ops o;
    memset(&o, 0, sizeof o);
    for (int k = 0; k < it->nops; k++) {
        o.p[k] = it->data[k];
        o.dt[k] = it->dtype[k];
    }
    return o;
}

inline ew_extra ew_extra_of(double p, uint64_t bits, int *flag) {
    ew_extra x;
    x.p = p;
    x.bits = bits;
    x.flag = flag;
    return x;
}

// The gen kernel with body B over `it`, in 32-bit index arithmetic when it fits.
template <class B> int ew_launch_gen(const mt_cuda_ctx *c, const mt_cuda_iter *it, ew_extra x) {
    unsigned grid = ew_blocks(c, it->numel);
    if (ew_fits32(it)) {
        typedef ew_gen_cfg<B, ew_geom32> K;
        MT_LAUNCH(ew_gen<K>, grid, EW_THREADS, 0, c->stream, ew_geom_of32(it), ew_ops_of(it),
                  (uint32_t)it->numel, x);
    } else {
        typedef ew_gen_cfg<B, ew_geom64> K;
        MT_LAUNCH(ew_gen<K>, grid, EW_THREADS, 0, c->stream, ew_geom_of64(it), ew_ops_of(it),
                  it->numel, x);
    }
    return (int)cudaGetLastError();
}
template <class B> int ew_launch_gen(const mt_cuda_ctx *c, const mt_cuda_iter *it) {
    return ew_launch_gen<B>(c, it, ew_extra_of(0, 0, NULL));
}

} // namespace

#endif
