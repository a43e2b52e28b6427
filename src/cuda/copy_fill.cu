// The elementwise kernels that store values without an op formula: copy (any dtype pair:
// same-dtype moves, a tiled 2-D transpose, conversions), fill, where, the Philox draws of
// the random fills, and the inf/nan check. The gen kernel they run on
// for any layout and dtypes, the storages and the launch planning are in elementwise_gen.cuh;
// the ops with a formula are in elementwise.cu. Conversions round as the CPU's
// (src/cpu/cpu_convert.c) and draws are the CPU's Philox sequence, so both backends store the
// same bits.
#include "elementwise_gen.cuh"
#include <type_traits>
#include "../math/philox.h"
#include "../math/uniform_digits.h"

namespace { // internal linkage: other .cu files have helpers of similar names

// ---------------------------------------------------------------- gen bodies

template <typename C> struct ew_convert_body {
    static constexpr int nops = 2;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        ew_store<C>(o.p[0] + off[0], o.dt[0], ew_load<C>(o.p[1] + off[1], o.dt[1]));
        return false;
    }
};
// Between integer dtypes: exact loads (a BOOL byte other than 0 reads as 1, as on the CPU),
// I32 stores wrap.
struct ew_int_convert_body {
    static constexpr int nops = 2;
    static EW_DEV bool apply(const ew_ops &o, const int64_t *off, const ew_extra &) {
        const char *from = o.p[1] + off[1];
        int64_t v =
            o.dt[1] == MT_BOOL ? *(const uint8_t *)from != 0 : ew_load<int64_t>(from, o.dt[1]);
        ew_store<int64_t>(o.p[0] + off[0], o.dt[0], v);
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

// ---------------------------------------------------------------- vec and tiled kernels

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
                           int digits, bool aligned) {
    typedef ew_vec<typename S::bits, 4> V;
    int64_t groups = (n + 3) / 4;
    for (int64_t g = ew_first<int64_t>(); g < groups; g += ew_step<int64_t>()) {
        uint64_t base = (uint64_t)g << 2; // i = base | j: i / 4 == g, visibly to the compiler
        V y;
        EW_UNROLL
        for (int j = 0; j < 4; j++)
            y.v[j] =
                S::store((typename S::comp)mt_philox_uniform_digits(seed, offset,
                                                                     base | (uint64_t)j, digits));
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

// ---------------------------------------------------------------- host side: launchers

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
    int64_t i64 = mt_f64_to_i64(value);
    int32_t i32 = mt_f64_to_i32(value);
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
    // between integer dtypes in integers (a double loses I64 values above 2^53)
    if (!ew_floating(dd) && !ew_floating(sd)) return ew_launch_gen<ew_int_convert_body>(c, it);
    // through double when either side is F64 (the CPU's wide path); an integer to F32 in
    // one rounding, and on to F16/BF16 from that float, as torch
    if (dd == MT_F64 || sd == MT_F64)
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
            int digits = mt_uniform_digits(dt); // as the CPU: never 1.0 once stored
            MT_LAUNCH(ew_uniform<S>, ew_blocks(c, (n + 3) / 4), EW_THREADS, 0, c->stream, (B *)out,
                      n, seed, offset, digits, al);
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
