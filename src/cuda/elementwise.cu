// The elementwise ops with a formula: the unary, binary and comparison ops of
// src/math/elementwise_ops.h, on the gen kernel of elementwise_gen.cuh (any layout and
// dtypes) or, where every operand is contiguous, of one floating dtype and 16-byte aligned, a
// vec kernel (16 bytes per operand per step). Copies, fills and the other kernels that store
// values without a formula are in copy_fill.cu.
//
// The op is a template parameter (a kernel per op, stamped from the formula lists), so no
// kernel switches on the op per element. F16/BF16 are stored with src/math/half.h rounding.
// Results are bit-identical to the CPU's where the compiler evaluates a formula as the C
// build does: no contraction of a * b + c into an FMA (nvcc -fmad=false; g++ for the emulated
// device -ffp-contract=off), src/math's explicit FMAs as fmaf on both (correctly rounded),
// and the same libm (pow, and the F64 transcendentals, differ by an ulp or so on a GPU).
#include "elementwise_gen.cuh"
#include <math.h>
#include "../math/elementwise_ops.h"

namespace { // internal linkage: other .cu files have helpers of similar names

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

// ---------------------------------------------------------------- gen bodies

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
