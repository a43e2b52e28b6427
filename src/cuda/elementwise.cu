// Elementwise kernels: the unary, binary and comparison ops of src/math/elementwise_ops.h,
// copy (any dtype pair), fill, where, Philox draws and the inf/nan check.
//
// Every kernel is a grid-stride loop of 256-thread blocks, in one of two shapes:
// - vec: every operand contiguous, of one floating dtype and 16-byte aligned; each thread
//   moves 16 bytes per operand per step (4 F32, 8 F16/BF16, 2 F64), the flat index is the
//   element index;
// - gen: any layout and dtypes. The flat index is split over the coalesced shape into a
//   byte offset per operand: in 32-bit arithmetic with multiply-shift division when the
//   element count and every operand's offset range fit in int32 (nearly always), else in
//   64-bit. Operands load through a dtype switch (the same for the whole grid, so warps do
//   not diverge) into FP32, or F64 for F64 and integer inputs, as the CPU computes. What a
//   gen kernel does per element is a "body" struct, so one kernel template serves all.
// The op is a template parameter (a kernel per op, stamped from the formula lists), so no
// kernel switches on the op per element. F16/BF16 are stored with src/math/half.h rounding.
// Results are bit-identical to the CPU's where the compiler evaluates a formula as the C
// build does: no contraction of a * b + c into an FMA (nvcc -fmad=false; g++ for the emulated
// device -ffp-contract=off and the C build's -march, which decides MT_FMAF), and the same
// libm (pow, and the F64 transcendentals, differ by an ulp or so on a GPU).
#include "cuda_compat.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#include "kernels.h"
#include "../math/elementwise_ops.h"
#include "../math/half.h"
#include "../math/philox.h"

#define EW_DEV __device__ __forceinline__
#ifdef __CUDACC__
#define EW_UNROLL _Pragma("unroll")
#else
#define EW_UNROLL
#endif

namespace { // internal linkage: other .cu files have helpers of similar names

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

// C stored as dtype dt as the CPU's stores do: F16/BF16 round to nearest even (from double
// through FP32), integers truncate toward zero, BOOL is "not zero".
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
        *(int64_t *)p = (int64_t)v;
        break;
    case MT_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    default:
        *(uint8_t *)p = v != (C)0;
        break;
    }
}

// ---------------------------------------------------------------- the formulas as functors

// ew_unary_fn<MT_OP_X, C>::f(x, p) and ew_binary_fn<MT_OP_X, C>::f(a, b), one specialisation
// per line of the lists, for float and double (EW_T is the list's element type).
template <mt_op_id OP, typename C> struct ew_unary_fn;
template <mt_op_id OP, typename C> struct ew_binary_fn;
template <mt_op_id OP> struct ew_compare_fn;
#define EW_UNARY_FN(ID, COST, EXPR)                                                                \
    template <> struct ew_unary_fn<MT_OP_##ID, EW_T> {                                             \
        static EW_DEV EW_T f(EW_T x, EW_T p) {                                                     \
            (void)p;                                                                               \
            return (EXPR);                                                                         \
        }                                                                                          \
    };
#define EW_BINARY_FN(ID, COST, EXPR)                                                               \
    template <> struct ew_binary_fn<MT_OP_##ID, EW_T> {                                            \
        static EW_DEV EW_T f(EW_T a, EW_T b) { return (EXPR); }                                    \
    };
#define EW_T float
MT_UNARY_FORMULAS(EW_UNARY_FN, float, f)
MT_BINARY_FORMULAS(EW_BINARY_FN, float, f)
#undef EW_T
#define EW_T double
MT_UNARY_FORMULAS(EW_UNARY_FN, double, d)
MT_BINARY_FORMULAS(EW_BINARY_FN, double, d)
#undef EW_T
#define EW_COMPARE_FN(ID, EXPR)                                                                    \
    template <> struct ew_compare_fn<MT_OP_##ID> {                                                 \
        template <typename C> static EW_DEV bool f(C a, C b) { return (EXPR); }                    \
    };
MT_COMPARE_FORMULAS(EW_COMPARE_FN)

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

// ---------------------------------------------------------------- gen kernel and bodies

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

// A body: nops operands; apply() handles one element at the operands' byte offsets and
// returns true when it found an inf/nan (only the check's body does).
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

template <mt_op_id OP, typename C> struct ew_unary_body {
    static constexpr int nops = 2;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &x) {
        C a = ew_load<C>(o.p[1] + off[1], o.dt[1]);
        ew_store<C>(o.p[0] + off[0], o.dt[0], ew_unary_fn<OP, C>::f(a, (C)x.p));
        return false;
    }
};
template <mt_op_id OP, typename C> struct ew_binary_body {
    static constexpr int nops = 3;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        C a = ew_load<C>(o.p[1] + off[1], o.dt[1]), b = ew_load<C>(o.p[2] + off[2], o.dt[2]);
        ew_store<C>(o.p[0] + off[0], o.dt[0], ew_binary_fn<OP, C>::f(a, b));
        return false;
    }
};
// C = float, double or int64_t (integers exactly); the output is BOOL.
template <mt_op_id OP, typename C> struct ew_compare_body {
    static constexpr int nops = 3;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        C a = ew_load<C>(o.p[1] + off[1], o.dt[1]), b = ew_load<C>(o.p[2] + off[2], o.dt[2]);
        *(uint8_t *)(o.p[0] + off[0]) = (uint8_t)ew_compare_fn<OP>::template f<C>(a, b);
        return false;
    }
};
template <typename C> struct ew_convert_body {
    static constexpr int nops = 2;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        ew_store<C>(o.p[0] + off[0], o.dt[0], ew_load<C>(o.p[1] + off[1], o.dt[1]));
        return false;
    }
};
// Same-dtype moves only need the element size: T is an unsigned integer of that size.
template <typename T> struct ew_copy_body {
    static constexpr int nops = 2;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        *(T *)(o.p[0] + off[0]) = *(const T *)(o.p[1] + off[1]);
        return false;
    }
};
template <typename T> struct ew_fill_body {
    static constexpr int nops = 1;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &x) {
        *(T *)(o.p[0] + off[0]) = (T)x.bits;
        return false;
    }
};
// where: cond (BOOL) ? a : b. C void moves T-sized elements; else a and b have other dtypes
// than the output and convert through C.
template <typename T, typename C> struct ew_where_body {
    static constexpr int nops = 4;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        // selects, not an index into off: it stays in registers (no local memory)
        bool first = *(const uint8_t *)(o.p[1] + off[1]) != 0;
        const char *src = first ? o.p[2] + off[2] : o.p[3] + off[3];
        if constexpr (std::is_void<C>::value)
            *(T *)(o.p[0] + off[0]) = *(const T *)src;
        else
            ew_store<C>(o.p[0] + off[0], o.dt[0], ew_load<C>(src, first ? o.dt[2] : o.dt[3]));
        return false;
    }
};
// The exponent field all ones; the bits are tested, no conversion.
template <class S> struct ew_nonfinite_body {
    static constexpr int nops = 1;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        typedef typename S::raw R;
        return (R)(*(const R *)(o.p[0] + off[0]) & S::inf_mask) == S::inf_mask;
    }
};

// ---------------------------------------------------------------- vec kernels

// out = op(a[, b]) over contiguous runs of storage S. N inputs (1 or 2).
template <mt_op_id OP, class S, int N> struct ew_map_cfg {
    typedef S st;
    typedef typename S::comp C;
    typedef typename S::bits B;
    static EW_DEV C f(C a, C b, C p) {
        if constexpr (N == 1) {
            (void)b;
            return ew_unary_fn<OP, C>::f(a, p);
        } else {
            (void)p;
            return ew_binary_fn<OP, C>::f(a, b);
        }
    }
    static constexpr int inputs = N;
};
template <class K>
__global__ void ew_map_vec(typename K::B *out, const typename K::B *a, const typename K::B *b,
                           int64_t n, typename K::C p, bool aligned) {
    typedef typename K::st S;
    typedef ew_vec<typename K::B, ew_width<typename K::B>> V;
    const int w = ew_width<typename K::B>;
    int64_t groups = aligned ? n / w : 0;
    for (int64_t g = ew_first<int64_t>(); g < groups; g += ew_step<int64_t>()) {
        V x = ((const V *)a)[g], y = x, z;
        if constexpr (K::inputs == 2) y = ((const V *)b)[g];
        EW_UNROLL
        for (int j = 0; j < w; j++) z.v[j] = S::store(K::f(S::load(x.v[j]), S::load(y.v[j]), p));
        ((V *)out)[g] = z;
    }
    for (int64_t i = groups * w + ew_first<int64_t>(); i < n; i += ew_step<int64_t>())
        out[i] = S::store(K::f(S::load(a[i]), S::load(K::inputs == 2 ? b[i] : a[i]), p));
}

// Conversion of contiguous runs between floating storages, 4 elements per step, through
// double when either side is F64 (as the CPU's wide path), else float.
template <class D, class S> struct ew_conv_cfg {
    typedef D dst;
    typedef S src;
    typedef
        typename std::conditional<std::is_same<D, ew_f64>::value || std::is_same<S, ew_f64>::value,
                                  double, float>::type comp;
    static EW_DEV typename D::bits f(typename S::bits v) {
        return D::store((typename D::comp)(comp)S::load(v));
    }
};
template <class K>
__global__ void ew_convert_vec(typename K::dst::bits *out, const typename K::src::bits *in,
                               int64_t n, bool aligned) {
    typedef ew_vec<typename K::dst::bits, 4> VD;
    typedef ew_vec<typename K::src::bits, 4> VS;
    int64_t groups = aligned ? n / 4 : 0;
    for (int64_t g = ew_first<int64_t>(); g < groups; g += ew_step<int64_t>()) {
        VS x = ((const VS *)in)[g];
        VD y;
        EW_UNROLL
        for (int j = 0; j < 4; j++) y.v[j] = K::f(x.v[j]);
        ((VD *)out)[g] = y;
    }
    for (int64_t i = groups * 4 + ew_first<int64_t>(); i < n; i += ew_step<int64_t>())
        out[i] = K::f(in[i]);
}

template <class S>
__global__ void ew_nonfinite_vec(const typename S::raw *t, int64_t n, bool aligned, int *flag) {
    typedef typename S::raw R;
    typedef ew_vec<R, ew_width<R>> V;
    bool bad = false;
    int64_t groups = aligned ? n / ew_width<R> : 0;
    for (int64_t g = ew_first<int64_t>(); g < groups; g += ew_step<int64_t>()) {
        V x = ((const V *)t)[g];
        EW_UNROLL
        for (int j = 0; j < ew_width<R>; j++) bad |= (R)(x.v[j] & S::inf_mask) == S::inf_mask;
    }
    for (int64_t i = groups * ew_width<R> + ew_first<int64_t>(); i < n; i += ew_step<int64_t>())
        bad |= (R)(t[i] & S::inf_mask) == S::inf_mask;
    if (bad) *flag = 1; // every writer stores the same value
}

// Element i = draw i of (seed, offset), in FP32, then stored as the CPU stores it. Uniform:
// a thread takes 4 consecutive elements from a multiple of 4, whose 4 calls share one Philox
// block, which the compiler then computes once.
template <class S>
__global__ void ew_uniform(typename S::bits *out, int64_t n, uint64_t seed, uint64_t offset,
                           bool aligned) {
    typedef ew_vec<typename S::bits, 4> V;
    int64_t groups = (n + 3) / 4;
    for (int64_t g = ew_first<int64_t>(); g < groups; g += ew_step<int64_t>()) {
        uint64_t base = (uint64_t)g << 2; // i = base | j: i / 4 == g, visibly to the compiler
        V y;
        EW_UNROLL
        for (int j = 0; j < 4; j++)
            y.v[j] =
                S::store((typename S::comp)mt_philox_uniform(seed, offset, base | (uint64_t)j));
        if (aligned && (int64_t)base + 4 <= n) {
            ((V *)out)[g] = y;
        } else {
            EW_UNROLL
            for (int j = 0; j < 4; j++)
                if ((int64_t)base + j < n) out[base + (uint64_t)j] = y.v[j];
        }
    }
}
// Normal: one element per step. Sharing the block across a Box-Muller pair would let the
// compiler merge the pair's sinf and cosf into sincosf, whose (never taken) slow path needs
// local memory; normal draws initialise weights, they are not in the training loop.
template <class S>
__global__ void ew_normal(typename S::bits *out, int64_t n, uint64_t seed, uint64_t offset) {
    for (int64_t i = ew_first<int64_t>(); i < n; i += ew_step<int64_t>())
        out[i] = S::store((typename S::comp)mt_philox_normal(seed, offset, (uint64_t)i));
}

// A 2-D transpose (dst rows dense, src dense along dst's columns) through a shared tile, so
// that both the reads and the writes are coalesced. Block 32 x 8; tiles in a grid-stride
// loop (the whole block takes the same tile, so the barriers are uniform).
template <typename T>
__global__ void ew_copy_transpose(T *dst, const T *src, int64_t rows, int64_t cols,
                                  int64_t dst_row_stride, int64_t src_col_stride) {
    MT_SHARED(T, tile, 32 * 33); // padded: a column read hits 32 banks
    int64_t tiles_c = (cols + 31) / 32, tiles = (rows + 31) / 32 * tiles_c;
    int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        int64_t r0 = t / tiles_c * 32, c0 = t % tiles_c * 32;
        for (int k = ty; k < 32; k += 8) { // threads along rows: src is dense there
            int64_t r = r0 + tx, c = c0 + k;
            if (r < rows && c < cols) tile[k * 33 + tx] = src[r + c * src_col_stride];
        }
        __syncthreads();
        for (int k = ty; k < 32; k += 8) { // threads along columns: dst is dense there
            int64_t r = r0 + k, c = c0 + tx;
            if (r < rows && c < cols) dst[r * dst_row_stride + c] = tile[tx * 33 + k];
        }
        __syncthreads(); // the tile is refilled by the next step
    }
}

// ---------------------------------------------------------------- host side: planning

int64_t ew_size(mt_dtype dt) {
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

bool ew_floating(mt_dtype dt) {
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
unsigned ew_blocks(const mt_cuda_ctx *c, int64_t work) {
    int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
    int64_t b = (work + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < cap ? b : cap);
}

bool ew_aligned(const void *p, size_t bytes) {
    return (uintptr_t)p % bytes == 0;
}

// The launch's status; a failed call (memcpy, memset) wins over the sticky last error,
// which is read either way so that it does not surface at a later, unrelated launch.
int ew_status(cudaError_t e) {
    cudaError_t last = cudaGetLastError();
    return (int)(e != cudaSuccess ? e : last);
}

// 32-bit arithmetic is exact when the element count and, for every operand, the range of
// byte offsets (either sign) fit in int32.
bool ew_fits32(const mt_cuda_iter *it) {
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

ew_div32 ew_make_div(uint32_t d) {
    ew_div32 q;
    q.d = d;
    q.s = 0;
    while (q.s < 32 && (1ull << q.s) < d) q.s++;
    q.m = (uint32_t)(((1ull << 32) * ((1ull << q.s) - d)) / d + 1);
    return q;
}

ew_geom32 ew_geom_of32(const mt_cuda_iter *it) {
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

ew_geom64 ew_geom_of64(const mt_cuda_iter *it) {
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

ew_ops ew_ops_of(const mt_cuda_iter *it) {
    ew_ops o;
    memset(&o, 0, sizeof o);
    for (int k = 0; k < it->nops; k++) {
        o.p[k] = it->data[k];
        o.dt[k] = it->dtype[k];
    }
    return o;
}

ew_extra ew_extra_of(double p, uint64_t bits, int *flag) {
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

// ---------------------------------------------------------------- host side: launchers

// The registers of a gen op: double for F64 and integer inputs (the CPU's rule), else float.
bool ew_wide(mt_dtype dt) {
    return dt == MT_F64 || dt == MT_I64 || dt == MT_I32;
}

template <mt_op_id OP, int N>
int ew_map_run(const mt_cuda_ctx *c, const mt_cuda_iter *it, double p) {
    mt_dtype dt = it->dtype[1];
    bool same = it->dtype[0] == dt && (N == 1 || it->dtype[2] == dt);
    if (it->contiguous && same && ew_floating(dt))
        return ew_with_storage(dt, [&](auto s) {
            typedef ew_map_cfg<OP, decltype(s), N> K;
            typedef typename K::B B;
            bool al = ew_aligned(it->data[0], 16) && ew_aligned(it->data[1], 16) &&
                      (N == 1 || ew_aligned(it->data[2], 16));
            int64_t work = al ? (it->numel + ew_width<B> - 1) / ew_width<B> : it->numel;
            MT_LAUNCH(ew_map_vec<K>, ew_blocks(c, work), EW_THREADS, 0, c->stream, (B *)it->data[0],
                      (const B *)it->data[1], (const B *)it->data[N == 1 ? 1 : 2], it->numel,
                      (typename K::C)p, al);
            return (int)cudaGetLastError();
        });
    bool wide = ew_wide(dt) || (N == 2 && ew_wide(it->dtype[2]));
    if constexpr (N == 1) {
        ew_extra x = ew_extra_of(p, 0, NULL);
        return wide ? ew_launch_gen<ew_unary_body<OP, double>>(c, it, x)
                    : ew_launch_gen<ew_unary_body<OP, float>>(c, it, x);
    } else {
        return wide ? ew_launch_gen<ew_binary_body<OP, double>>(c, it)
                    : ew_launch_gen<ew_binary_body<OP, float>>(c, it);
    }
}

// Integers and BOOL compare as integers (exact past 2^53); F64 in double; the rest in float.
template <mt_op_id OP> int ew_compare_run(const mt_cuda_ctx *c, const mt_cuda_iter *it) {
    mt_dtype dt = it->dtype[1];
    if (!ew_floating(dt)) return ew_launch_gen<ew_compare_body<OP, int64_t>>(c, it);
    if (dt == MT_F64 || it->dtype[2] == MT_F64)
        return ew_launch_gen<ew_compare_body<OP, double>>(c, it);
    return ew_launch_gen<ew_compare_body<OP, float>>(c, it);
}

// Same dtype, not contiguous: a 2-D transpose through tiles, else element moves.
template <typename T> int ew_copy_same(const mt_cuda_ctx *c, const mt_cuda_iter *it) {
    const int64_t *ds = it->strides[0], *ss = it->strides[1];
    if (it->ndim == 2 && ds[1] == 1 && ss[0] == 1 && ss[1] != 1 && it->shape[0] >= 32 &&
        it->shape[1] >= 32) {
        int64_t tiles = (it->shape[0] + 31) / 32 * ((it->shape[1] + 31) / 32);
        int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
        MT_LAUNCH(ew_copy_transpose<T>, (unsigned)(tiles < cap ? tiles : cap), dim3(32, 8), 0,
                  c->stream, (T *)it->data[0], (const T *)it->data[1], it->shape[0], it->shape[1],
                  ds[0], ss[1]);
        return (int)cudaGetLastError();
    }
    return ew_launch_gen<ew_copy_body<T>>(c, it);
}

// The value in the destination dtype, as cpu_fill converts it.
uint64_t ew_fill_bits(mt_dtype dt, double value) {
    uint64_t bits = 0;
    float f = (float)value;
    int64_t i64 = (int64_t)value;
    int32_t i32 = (int32_t)value;
    switch (dt) {
    case MT_F32:
        memcpy(&bits, &f, 4);
        break;
    case MT_F64:
        memcpy(&bits, &value, 8);
        break;
    case MT_F16:
        bits = mt_f32_to_f16(f);
        break;
    case MT_BF16:
        bits = mt_f32_to_bf16(f);
        break;
    case MT_I64:
        memcpy(&bits, &i64, 8);
        break;
    case MT_I32:
        memcpy(&bits, &i32, 4);
        break;
    default:
        bits = value != 0.0;
        break;
    }
    return bits;
}

} // namespace

// ---------------------------------------------------------------- the launchers of kernels.h

extern "C" int mt_cuda_unary(const mt_cuda_ctx *c, mt_op_id op, const mt_cuda_iter *it, double p) {
    if (it->numel == 0) return 0;
#define EW_UNARY_CASE(ID, COST, EXPR)                                                              \
    case MT_OP_##ID:                                                                               \
        return ew_map_run<MT_OP_##ID, 1>(c, it, p);
    switch (op) {
        MT_UNARY_FORMULAS(EW_UNARY_CASE, float, f)
    default:
        return (int)cudaErrorInvalidValue;
    }
#undef EW_UNARY_CASE
}

extern "C" int mt_cuda_binary(const mt_cuda_ctx *c, mt_op_id op, const mt_cuda_iter *it) {
    if (it->numel == 0) return 0;
#define EW_BINARY_CASE(ID, COST, EXPR)                                                             \
    case MT_OP_##ID:                                                                               \
        return ew_map_run<MT_OP_##ID, 2>(c, it, 0);
#define EW_COMPARE_CASE(ID, EXPR)                                                                  \
    case MT_OP_##ID:                                                                               \
        return ew_compare_run<MT_OP_##ID>(c, it);
    switch (op) {
        MT_BINARY_FORMULAS(EW_BINARY_CASE, float, f)
        MT_COMPARE_FORMULAS(EW_COMPARE_CASE)
    default:
        return (int)cudaErrorInvalidValue;
    }
#undef EW_BINARY_CASE
#undef EW_COMPARE_CASE
}

extern "C" int mt_cuda_copy(const mt_cuda_ctx *c, const mt_cuda_iter *it) {
    if (it->numel == 0) return 0;
    mt_dtype dd = it->dtype[0], sd = it->dtype[1];
    if (dd == sd && it->contiguous)
        return ew_status(cudaMemcpyAsync(it->data[0], it->data[1],
                                         (size_t)(it->numel * ew_size(dd)),
                                         cudaMemcpyDeviceToDevice, c->stream));
    if (dd == sd)
        return ew_with_size(ew_size(dd), [&](auto t) { return ew_copy_same<decltype(t)>(c, it); });
    if (it->contiguous && ew_floating(dd) && ew_floating(sd))
        return ew_with_storage(dd, [&](auto d) {
            return ew_with_storage(sd, [&](auto s) {
                typedef ew_conv_cfg<decltype(d), decltype(s)> K;
                // 4 elements per access: each side aligned to 4 of its elements
                bool al = ew_aligned(it->data[0], 4 * sizeof(typename K::dst::bits)) &&
                          ew_aligned(it->data[1], 4 * sizeof(typename K::src::bits));
                MT_LAUNCH(ew_convert_vec<K>, ew_blocks(c, al ? (it->numel + 3) / 4 : it->numel),
                          EW_THREADS, 0, c->stream, (typename K::dst::bits *)it->data[0],
                          (const typename K::src::bits *)it->data[1], it->numel, al);
                return (int)cudaGetLastError();
            });
        });
    // through double when either side needs more than FP32 holds (the CPU's wide path)
    if (dd == MT_F64 || sd == MT_F64 || sd == MT_I64 || sd == MT_I32)
        return ew_launch_gen<ew_convert_body<double>>(c, it);
    return ew_launch_gen<ew_convert_body<float>>(c, it);
}

extern "C" int mt_cuda_fill(const mt_cuda_ctx *c, const mt_cuda_iter *it, double value) {
    if (it->numel == 0) return 0;
    int64_t es = ew_size(it->dtype[0]);
    uint64_t bits = ew_fill_bits(it->dtype[0], value);
    bool bytes_equal = true; // then a memset writes the pattern (zeros, mostly)
    for (int64_t b = 1; b < es; b++)
        bytes_equal = bytes_equal && ((bits >> (8 * b)) & 0xff) == (bits & 0xff);
    if (it->contiguous && bytes_equal)
        return ew_status(
            cudaMemsetAsync(it->data[0], (int)(bits & 0xff), (size_t)(it->numel * es), c->stream));
    return ew_with_size(es, [&](auto t) {
        return ew_launch_gen<ew_fill_body<decltype(t)>>(c, it, ew_extra_of(0, bits, NULL));
    });
}

extern "C" int mt_cuda_where(const mt_cuda_ctx *c, const mt_cuda_iter *it) {
    if (it->numel == 0) return 0;
    mt_dtype dt = it->dtype[0];
    if (it->dtype[2] != dt || it->dtype[3] != dt) // promoted by the caller; converted if not
        return ew_launch_gen<ew_where_body<uint8_t, double>>(c, it);
    return ew_with_size(ew_size(dt), [&](auto t) {
        return ew_launch_gen<ew_where_body<decltype(t), void>>(c, it);
    });
}

extern "C" int mt_cuda_random(const mt_cuda_ctx *c, char *out, mt_dtype dt, int64_t n, bool normal,
                              uint64_t seed, uint64_t offset) {
    if (n == 0) return 0;
    if (!ew_floating(dt)) return (int)cudaErrorInvalidValue;
    return ew_with_storage(dt, [&](auto s) {
        typedef decltype(s) S;
        typedef typename S::bits B;
        if (normal) {
            MT_LAUNCH(ew_normal<S>, ew_blocks(c, n), EW_THREADS, 0, c->stream, (B *)out, n, seed,
                      offset);
        } else {
            bool al = ew_aligned(out, 4 * sizeof(B));
            MT_LAUNCH(ew_uniform<S>, ew_blocks(c, (n + 3) / 4), EW_THREADS, 0, c->stream, (B *)out,
                      n, seed, offset, al);
        }
        return (int)cudaGetLastError();
    });
}

extern "C" int mt_cuda_has_nonfinite(const mt_cuda_ctx *c, const mt_cuda_iter *it, int *flag) {
    if (it->numel == 0 || !ew_floating(it->dtype[0])) return 0; // integers hold no inf/nan
    return ew_with_storage(it->dtype[0], [&](auto s) {
        typedef decltype(s) S;
        typedef typename S::raw R;
        if (!it->contiguous)
            return ew_launch_gen<ew_nonfinite_body<S>>(c, it, ew_extra_of(0, 0, flag));
        bool al = ew_aligned(it->data[0], 16);
        MT_LAUNCH(ew_nonfinite_vec<S>,
                  ew_blocks(c, al ? (it->numel + ew_width<R> - 1) / ew_width<R> : it->numel),
                  EW_THREADS, 0, c->stream, (const R *)it->data[0], it->numel, al, flag);
        return (int)cudaGetLastError();
    });
}
