// Reductions (SUM, MEAN, MAX over a dim mask) and the multi-tensor sum of squares.
//
// Plan (src/tensor/reduce_geom.h, shared with cpu_reduce.c): size-1 dims are dropped; kept
// dims (in order) and reduced dims (sorted by stride) are each coalesced where the layout
// allows. Three shapes of work:
// - rows: the reduced dims are walked by a group of threads per output (a sub-warp or warp
//   for short reductions, a block for long ones), lanes on consecutive reduced indices so a
//   contiguous run is read coalesced; shuffle trees combine the lanes;
// - columns: a kept dim is the contiguous one (sum over dim 0 of [N, C]): threadIdx.x runs
//   along it, threadIdx.y splits the reduced range, a shared-memory tree combines the ys;
// - few outputs (the whole tensor): either shape with the reduced range split over several
//   blocks; each writes a partial into scratch and a second kernel combines them per output.
// Accumulation in FP32 (F64 for F64 inputs); every tree has a fixed shape for a given plan,
// so results are bitwise reproducible (no float atomics). MAX propagates NaN.
#include "cuda_compat.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "element_access.cuh"
#include "../math/dense_layout.h"
#include "../tensor/reduce_geom.h"

// Threads to aim for when splitting a reduction (132 SMs x 2048: a full H100). A constant,
// not the device's SM count: the split shape sets the rounding, so results are the same
// bits on every GPU; on smaller GPUs the extra splits only queue.
#define MT_SPLIT_THREADS (132 * 2048)

// ---------------------------------------------------------------- element access

// Storage types as template arguments: the hot loops are instantiated per input dtype so the
// dtype switch is outside them. F16 and BF16 are both 16-bit words, so they get tag types.
struct mt_f16_tag {
    uint16_t b;
};
struct mt_bf16_tag {
    uint16_t b;
};
template <typename S> struct mt_acc_of {
    typedef float type; // F32, F16, BF16: FP32 accumulation
};
template <> struct mt_acc_of<double> { typedef double type; };
MT_DEV float mt_widen(float v) {
    return v;
}
MT_DEV double mt_widen(double v) {
    return v;
}
MT_DEV float mt_widen(mt_f16_tag v) {
    return mt_f16_to_f32(v.b);
}
MT_DEV float mt_widen(mt_bf16_tag v) {
    return mt_bf16_to_f32(v.b);
}

// ---------------------------------------------------------------- folds

template <typename A> MT_DEV A mt_identity(bool is_max) {
    return is_max ? (A)-INFINITY : (A)0;
}

// max(acc, x) with NaN winning, or acc + x. Commutative in value, so both lanes of a
// butterfly step hold the same result.
template <typename A> MT_DEV A mt_fold(A acc, A x, bool is_max) {
    if (!is_max) return acc + x;
    return (x > acc || x != x) ? x : acc;
}

// Butterfly over groups of `width` lanes (a power of two <= 32); every lane of a group ends
// with the group's value. All 32 lanes of the warp must call it.
template <typename A> MT_DEV A mt_warp_fold(A v, bool is_max, int width) {
    for (int o = width >> 1; o > 0; o >>= 1) v = mt_fold(v, __shfl_xor_sync(MT_FULL, v, o), is_max);
    return v;
}

// Whole-block fold (blockDim a multiple of 32, at most 1024 threads); every thread gets
// the result. Each warp repeats the final 32-lane fold instead of a broadcast, which saves
// a barrier. sm: 32 elements.
template <typename A> MT_DEV A mt_block_fold(A v, bool is_max, A *sm) {
    int t = (int)(threadIdx.x + threadIdx.y * blockDim.x);
    int nw = (int)(blockDim.x * blockDim.y) >> 5;
    v = mt_warp_fold(v, is_max, 32);
    if ((t & 31) == 0) sm[t >> 5] = v;
    __syncthreads();
    v = (t & 31) < nw ? sm[t & 31] : mt_identity<A>(is_max);
    v = mt_warp_fold(v, is_max, 32);
    __syncthreads(); // sm may be reused by the caller
    return v;
}

// ---------------------------------------------------------------- reduce plan

// Element strides. Kept dims outermost first (in column mode the contiguous one is moved
// last, V long, cut in vchunks chunks of blockDim.x); reduced dims outermost first, the last
// one the innermost run. Split s of an output covers reduced indices [s * chunk, + chunk).
typedef struct {
    const char *a;
    char *o;
    mt_dtype dt, odt;
    int op, nk, nr, splits;
    bool column;
    int64_t K, R, chunk, V, vchunks;
    int64_t kshape[MT_MAX_DIMS], kstride[MT_MAX_DIMS], ostride[MT_MAX_DIMS];
    int64_t rshape[MT_MAX_DIMS], rstride[MT_MAX_DIMS];
} mt_rplan;

// Input and output offsets of kept flat index k. Loops over dims are unrolled with a guard
// so the plan's arrays are indexed by constants and stay in the parameter bank.
MT_DEV void mt_kept_offsets(const mt_rplan &P, int64_t k, int64_t *ia, int64_t *io) {
    int64_t a = 0, o = 0;
    MT_UNROLL
    for (int d = MT_MAX_DIMS - 1; d >= 0; d--) {
        if (d >= P.nk) continue;
        int64_t q = k / P.kshape[d], i = k - q * P.kshape[d];
        a += i * P.kstride[d];
        o += i * P.ostride[d];
        k = q;
    }
    *ia = a;
    *io = o;
}

// Input offset of reduced flat index r; 32-bit division when the range allows (it is the
// per-element cost of multi-dim reductions).
MT_DEV int64_t mt_reduced_offset(const mt_rplan &P, int64_t r) {
    if (P.nr == 1) return r * P.rstride[0];
    int64_t off = 0;
    if (P.R <= (int64_t)UINT32_MAX) {
        uint32_t q = (uint32_t)r;
        MT_UNROLL
        for (int d = MT_MAX_DIMS - 1; d >= 0; d--) {
            if (d >= P.nr) continue;
            uint32_t n = (uint32_t)P.rshape[d], q2 = q / n;
            off += (int64_t)(q - q2 * n) * P.rstride[d];
            q = q2;
        }
        return off;
    }
    MT_UNROLL
    for (int d = MT_MAX_DIMS - 1; d >= 0; d--) {
        if (d >= P.nr) continue;
        int64_t q = r / P.rshape[d];
        off += (r - q * P.rshape[d]) * P.rstride[d];
        r = q;
    }
    return off;
}

// The final value of an output: MEAN divides in double by the reduced count (0 / 0 = NaN
// for an empty reduction, as the CPU gives).
template <typename A> MT_DEV void mt_reduce_store(const mt_rplan &P, int64_t io, A v) {
    if (P.op == MT_OP_MEAN)
        mt_store<double>(P.o, P.odt, io, (double)v / (double)P.R);
    else
        mt_store<A>(P.o, P.odt, io, v);
}

// A split's result: the output itself, or a partial at part[k * splits + split].
template <typename A>
MT_DEV void mt_reduce_put(const mt_rplan &P, A *part, int64_t k, int64_t sp, int64_t io, A v) {
    if (P.splits == 1)
        mt_reduce_store(P, io, v);
    else
        part[k * P.splits + sp] = v;
}

// ---------------------------------------------------------------- reduce kernels

// Rows: unit u = (output k, split sp) is a group of `width` lanes: a sub-warp or warp when
// width <= 32 (blockDim.x / width units per block), else the whole block.
template <typename S>
__global__ void __launch_bounds__(256)
    mt_reduce_rows(mt_rplan P, int width, typename mt_acc_of<S>::type *part) {
    typedef typename mt_acc_of<S>::type A;
    MT_SHARED(A, sm, 32);
    bool is_max = P.op == MT_OP_MAX;
    int lane = (int)threadIdx.x & (width - 1);
    int64_t u = (int64_t)blockIdx.x * ((int)blockDim.x / width) + (int)threadIdx.x / width;
    int64_t k = u / P.splits, sp = u - k * P.splits, ia = 0, io = 0;
    bool active = k < P.K; // idle lanes still take part in the shuffles
    A acc = mt_identity<A>(is_max);
    if (active) {
        mt_kept_offsets(P, k, &ia, &io);
        const S *a = (const S *)P.a + ia;
        int64_t rb = sp * P.chunk, re = rb + P.chunk < P.R ? rb + P.chunk : P.R;
        if (P.nr == 1) { // the common case: one strided run, no index arithmetic
            int64_t s = P.rstride[0];
            for (int64_t r = rb + lane; r < re; r += width)
                acc = mt_fold(acc, (A)mt_widen(a[r * s]), is_max);
        } else {
            for (int64_t r = rb + lane; r < re; r += width)
                acc = mt_fold(acc, (A)mt_widen(a[mt_reduced_offset(P, r)]), is_max);
        }
    }
    acc = width <= 32 ? mt_warp_fold(acc, is_max, width) : mt_block_fold(acc, is_max, sm);
    if (active && lane == 0) mt_reduce_put(P, part, k, sp, io, acc);
}

// Columns: block (cx, cy) covers cx consecutive outputs along the contiguous kept dim for
// one split; each thread folds every cy-th reduced index, then a tree over y in shared
// memory (fixed shape: deterministic). The (output group, split) tiles are taken in a
// grid-stride loop: a short contiguous kept dim makes about K / V of them, which can pass
// the grid's 2^31 - 1 blocks (a tile is block-uniform, so the barriers stay uniform).
template <typename S>
__global__ void __launch_bounds__(256)
    mt_reduce_cols(mt_rplan P, int64_t tiles, typename mt_acc_of<S>::type *part) {
    typedef typename mt_acc_of<S>::type A;
    MT_SHARED(A, sm, 256);
    bool is_max = P.op == MT_OP_MAX;
    int tx = (int)threadIdx.x, ty = (int)threadIdx.y, cx = (int)blockDim.x;
    for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
        int64_t t = b / P.splits, sp = b - t * P.splits;
        int64_t outer = t / P.vchunks, c = (t - outer * P.vchunks) * cx + tx;
        int64_t k = outer * P.V + c, ia = 0, io = 0;
        bool active = c < P.V;
        A acc = mt_identity<A>(is_max);
        if (active) {
            mt_kept_offsets(P, k, &ia, &io);
            const S *a = (const S *)P.a + ia;
            int64_t rb = sp * P.chunk, re = rb + P.chunk < P.R ? rb + P.chunk : P.R;
            for (int64_t r = rb + ty; r < re; r += (int)blockDim.y)
                acc = mt_fold(acc, (A)mt_widen(a[mt_reduced_offset(P, r)]), is_max);
        }
        sm[ty * cx + tx] = acc;
        __syncthreads();
        for (int h = (int)blockDim.y >> 1; h > 0; h >>= 1) {
            if (ty < h)
                sm[ty * cx + tx] = mt_fold(sm[ty * cx + tx], sm[(ty + h) * cx + tx], is_max);
            __syncthreads();
        }
        if (active && ty == 0) mt_reduce_put(P, part, k, sp, io, sm[tx]);
        __syncthreads(); // the next tile refills sm
    }
}

// Second pass: a warp per output folds its splits' partials in a fixed order.
template <typename A>
__global__ void __launch_bounds__(256) mt_reduce_finish(mt_rplan P, const A *part) {
    bool is_max = P.op == MT_OP_MAX;
    int lane = (int)threadIdx.x & 31;
    int64_t k = (int64_t)blockIdx.x * ((int)blockDim.x >> 5) + ((int)threadIdx.x >> 5);
    A acc = mt_identity<A>(is_max);
    if (k < P.K)
        for (int64_t s = lane; s < P.splits; s += 32)
            acc = mt_fold(acc, part[k * P.splits + s], is_max);
    acc = mt_warp_fold(acc, is_max, 32);
    if (k < P.K && lane == 0) {
        int64_t ia, io;
        mt_kept_offsets(P, k, &ia, &io);
        mt_reduce_store(P, io, acc);
    }
}

// ---------------------------------------------------------------- reduce host side

// Splits of the reduced range so that about MT_SPLIT_THREADS threads have work, each split
// keeping at least `min_per` elements; at most 4096 (the finisher's warp folds them).
static void mt_rplan_split(mt_rplan *P, int64_t units, int threads, int64_t min_per) {
    int64_t want = 1, busy = units * threads;
    if (busy < MT_SPLIT_THREADS) want = (MT_SPLIT_THREADS + busy - 1) / busy;
    int64_t most = P->R / min_per;
    if (want > most) want = most;
    if (want > 4096) want = 4096;
    if (want < 1) want = 1;
    P->chunk = (P->R + want - 1) / want;
    if (P->chunk < 1) P->chunk = 1;
    P->splits = (int)((P->R + P->chunk - 1) / P->chunk);
    if (P->splits < 1) P->splits = 1;
}

// Launches the first pass (and the finisher when split), with partials in scratch that is
// freed right after enqueuing: the allocator reuses blocks in stream order.
template <typename S> static cudaError_t mt_reduce_launch(const mt_cuda_ctx *c, mt_rplan *P) {
    typedef typename mt_acc_of<S>::type A;
    dim3 block(256), grid(1);
    int width = 0;
    int64_t tiles = 0; // column mode: (output group, split) tiles, grid-strided
    if (P->column) {
        int cy = P->R >= 8 ? 8 : mt_pow2_at_least(P->R, 8);
        int cx = mt_pow2_at_least(P->V, 256 / cy);
        if (cx < 32) cy = 256 / cx; // narrow columns: more rows per block
        P->vchunks = (P->V + cx - 1) / cx;
        mt_rplan_split(P, P->K / P->V * P->vchunks, 256, (int64_t)cy * 16);
        block = dim3((unsigned)cx, (unsigned)cy);
        tiles = P->K / P->V * P->vchunks * P->splits;
        int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
        grid = dim3((unsigned)(tiles < cap ? tiles : cap));
    } else {
        width = P->R > 1024 ? 256 : mt_pow2_at_least(P->R, 32);
        mt_rplan_split(P, P->K, width, (int64_t)width * 16);
        if (P->splits > 1) width = 256; // split ranges are long: a block each
        int64_t units = P->K * P->splits, per = 256 / width;
        grid = dim3((unsigned)((units + per - 1) / per));
    }
    A *part = NULL;
    size_t bytes = (size_t)P->K * (size_t)P->splits * sizeof(A);
    if (P->splits > 1 && !(part = (A *)c->scratch_alloc(c->device, bytes)))
        return cudaErrorMemoryAllocation;
    if (P->column)
        MT_LAUNCH(mt_reduce_cols<S>, grid, block, 0, c->stream, *P, tiles, part);
    else
        MT_LAUNCH(mt_reduce_rows<S>, grid, block, 0, c->stream, *P, width, part);
    if (part) {
        MT_LAUNCH(mt_reduce_finish<A>, dim3((unsigned)((P->K + 7) / 8)), dim3(256), 0, c->stream,
                  *P, (const A *)part);
        c->scratch_free(c->device, part, bytes);
    }
    return cudaGetLastError();
}

extern "C" int mt_cuda_reduce(const mt_cuda_ctx *c, mt_op_id op, const mt_cuda_array *out,
                              const mt_cuda_array *a, uint32_t mask) {
    if (!mt_is_floating(a->dtype) || !mt_is_floating(out->dtype) || a->ndim != out->ndim ||
        (op != MT_OP_SUM && op != MT_OP_MEAN && op != MT_OP_MAX))
        return (int)cudaErrorInvalidValue;
    mt_rplan P;
    memset(&P, 0, sizeof P);
    P.a = a->data;
    P.o = out->data;
    P.dt = a->dtype;
    P.odt = out->dtype;
    P.op = op;
    mt_reduce_geom g; // the CPU's geometry (src/tensor/reduce_geom.h), strides in elements
    mt_reduce_geom_make(&g, a->ndim, a->shape, a->strides, out->strides, mask);
    if (g.K == 0) return 0;
    P.nk = g.nk;
    P.nr = g.nr;
    P.K = g.K;
    P.R = g.R;
    P.column = g.column;
    P.V = g.column ? g.kshape[g.nk - 1] : 0;
    memcpy(P.kshape, g.kshape, sizeof g.kshape);
    memcpy(P.kstride, g.kstride, sizeof g.kstride);
    memcpy(P.ostride, g.ostride, sizeof g.ostride);
    memcpy(P.rshape, g.rshape, sizeof g.rshape);
    memcpy(P.rstride, g.rstride, sizeof g.rstride);
    switch (a->dtype) {
    case MT_F64:
        return (int)mt_reduce_launch<double>(c, &P);
    case MT_F16:
        return (int)mt_reduce_launch<mt_f16_tag>(c, &P);
    case MT_BF16:
        return (int)mt_reduce_launch<mt_bf16_tag>(c, &P);
    default:
        return (int)mt_reduce_launch<float>(c, &P);
    }
}

// ---------------------------------------------------------------- sum of squares

// Multi-tensor: dense tensors are cut into chunks of MT_SQ_CHUNK elements, a block each,
// described by a table passed by value as the kernel parameter (multi_tensor_apply style;
// MT_SQ_TABLE entries keep it under the 4 KiB parameter limit). Strided tensors (rare:
// user-set gradients) get a kernel of their own. Every block writes its sum (FP32 lanes,
// F64 for F64 tensors) as a double partial; one block adds the partials in a fixed order.
#define MT_SQ_CHUNK 16384
#define MT_SQ_TABLE 128

typedef struct {
    const char *p;
    int64_t n;
    int32_t first; // first block (of this launch) of the tensor
    int32_t dt;
} mt_sq_entry;

typedef struct {
    int count, blocks;
    int64_t part0; // partial index of this launch's block 0
    mt_sq_entry e[MT_SQ_TABLE];
} mt_sq_table;

template <typename S> MT_DEV float mt_sq_span(const S *x, int64_t b, int64_t e) {
    float acc = 0;
    for (int64_t i = b + (int)threadIdx.x; i < e; i += (int)blockDim.x) {
        float v = mt_widen(x[i]);
        acc += v * v;
    }
    return acc;
}

MT_DEV double mt_sq_span_d(const double *x, int64_t b, int64_t e) {
    double acc = 0;
    for (int64_t i = b + (int)threadIdx.x; i < e; i += (int)blockDim.x) acc += x[i] * x[i];
    return acc;
}

__global__ void __launch_bounds__(256) mt_sq_dense(mt_sq_table T, double *part) {
    MT_SHARED(float, smf, 32);
    MT_SHARED(double, smd, 32);
    int lo = 0, hi = T.count - 1; // the entry holding this block: last first <= blockIdx.x
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (T.e[mid].first <= (int)blockIdx.x)
            lo = mid;
        else
            hi = mid - 1;
    }
    mt_sq_entry E = T.e[lo];
    int64_t b = ((int64_t)blockIdx.x - E.first) * MT_SQ_CHUNK;
    int64_t e = b + MT_SQ_CHUNK < E.n ? b + MT_SQ_CHUNK : E.n;
    double sum;
    if (E.dt == MT_F64) { // block-uniform branch: the barriers inside are reached by all
        sum = mt_block_fold(mt_sq_span_d((const double *)E.p, b, e), false, smd);
    } else {
        float acc = E.dt == MT_F16    ? mt_sq_span((const mt_f16_tag *)E.p, b, e)
                    : E.dt == MT_BF16 ? mt_sq_span((const mt_bf16_tag *)E.p, b, e)
                                      : mt_sq_span((const float *)E.p, b, e);
        sum = (double)mt_block_fold(acc, false, smf);
    }
    if (threadIdx.x == 0) part[T.part0 + blockIdx.x] = sum;
}

// One strided tensor; block b covers flat indices [b * MT_SQ_CHUNK, + MT_SQ_CHUNK).
__global__ void __launch_bounds__(256) mt_sq_strided(mt_cuda_array t, double *part) {
    MT_SHARED(double, sm, 32);
    int64_t b = (int64_t)blockIdx.x * MT_SQ_CHUNK;
    int64_t e = b + MT_SQ_CHUNK < t.numel ? b + MT_SQ_CHUNK : t.numel;
    bool wide = t.dtype == MT_F64;
    float accf = 0;
    double accd = 0;
    for (int64_t i = b + (int)threadIdx.x; i < e; i += (int)blockDim.x) {
        int64_t off = 0, r = i;
        MT_UNROLL
        for (int d = MT_MAX_DIMS - 1; d >= 0; d--) {
            if (d >= t.ndim) continue;
            int64_t q = r / t.shape[d];
            off += (r - q * t.shape[d]) * t.strides[d];
            r = q;
        }
        if (wide) {
            double v = ((const double *)t.data)[off];
            accd += v * v;
        } else {
            float v = mt_load<float>(t.data, t.dtype, off);
            accf += v * v;
        }
    }
    double sum = mt_block_fold(wide ? accd : (double)accf, false, sm);
    if (threadIdx.x == 0) part[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(1024)
    mt_sq_finish(const double *part, int64_t n, char *out, mt_dtype odt) {
    MT_SHARED(double, sm, 32);
    double acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += (int)blockDim.x) acc += part[i];
    acc = mt_block_fold(acc, false, sm);
    if (threadIdx.x == 0) mt_store<double>(out, odt, 0, acc);
}

// Dense in any dim order (row-major, channels-last): a sum of squares reads it in memory order.
static bool mt_dense(const mt_cuda_array *t) {
    return mt_dims_dense(t->ndim, t->shape, t->strides);
}

static int64_t mt_sq_blocks(const mt_cuda_array *t) {
    return t->data && t->numel > 0 ? (t->numel + MT_SQ_CHUNK - 1) / MT_SQ_CHUNK : 0;
}

// Enqueues the dense tensors' blocks, MT_SQ_TABLE tensors per launch; returns the next free
// partial index.
static int64_t mt_sq_launch_dense(const mt_cuda_ctx *c, const mt_cuda_array *ts, int n,
                                  double *part) {
    mt_sq_table T;
    memset(&T, 0, sizeof T);
    int64_t next = 0;
    for (int i = 0; i <= n; i++) {
        bool flush = i == n || T.count == MT_SQ_TABLE ||
                     (mt_dense(&ts[i]) && T.blocks + mt_sq_blocks(&ts[i]) > INT32_MAX / 2);
        if (flush && T.count > 0) {
            MT_LAUNCH(mt_sq_dense, dim3((unsigned)T.blocks), dim3(256), 0, c->stream, T, part);
            next = T.part0 + T.blocks;
            T.count = T.blocks = 0;
            T.part0 = next;
        }
        if (i == n || !mt_dense(&ts[i]) || mt_sq_blocks(&ts[i]) == 0) continue;
        mt_sq_entry *E = &T.e[T.count++];
        E->p = ts[i].data;
        E->n = ts[i].numel;
        E->first = T.blocks;
        E->dt = ts[i].dtype;
        T.blocks += (int)mt_sq_blocks(&ts[i]);
    }
    return next;
}

extern "C" int mt_cuda_sq_norm(const mt_cuda_ctx *c, const mt_cuda_array *ts, int n,
                               const mt_cuda_array *out) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ts[i].data && !mt_is_floating(ts[i].dtype)) return (int)cudaErrorInvalidValue;
        total += mt_sq_blocks(&ts[i]);
    }
    size_t bytes = (size_t)total * sizeof(double);
    double *part = NULL;
    if (total > 0 && !(part = (double *)c->scratch_alloc(c->device, bytes)))
        return (int)cudaErrorMemoryAllocation;
    int64_t next = mt_sq_launch_dense(c, ts, n, part);
    for (int i = 0; i < n; i++) {
        int64_t nb = mt_sq_blocks(&ts[i]);
        if (nb == 0 || mt_dense(&ts[i])) continue;
        MT_LAUNCH(mt_sq_strided, dim3((unsigned)nb), dim3(256), 0, c->stream, ts[i], part + next);
        next += nb;
    }
    MT_LAUNCH(mt_sq_finish, dim3(1), dim3(1024), 0, c->stream, (const double *)part, total,
              out->data, out->dtype);
    if (part) c->scratch_free(c->device, part, bytes);
    return (int)cudaGetLastError();
}
