// Softmax / log_softmax along a dim, their backward, and fused cross entropy (log-softmax +
// NLL) forward and backward.
//
// Every kernel works on rows: the runs along the softmax dim (the class dim), one per
// position of the other dims. Two shapes of work:
// - rows kernels: a group of lanes per row (a sub-warp or warp for rows up to 1024, a block
//   above), lanes on consecutive elements of the row;
// - the columns kernel, when the dim is not the innermost one (softmax over dim 1 of
//   [N, C, H, W]): threadIdx.x runs across neighbouring rows, which are contiguous in
//   memory, and threadIdx.y splits the row; a shared-memory tree combines the ys.
// Statistics in FP32 (F64 when an operand is F64): the forward keeps an online (max, sum of
// exp(x - max)) pair, so the input is read twice (statistics, output). Trees have a fixed
// shape for a given launch: results are bitwise reproducible, with no float atomics.
#include "cuda_compat.h"
#include <math.h>
#include <string.h>
#include "element_access.cuh"
#include "../math/scalar_ops.h"

// src/math's exp and log for FP32 (the CPU backend's formulas), libm's for F64
MT_DEV float mt_exp(float x) {
    return mt_expv_f(x);
}
MT_DEV double mt_exp(double x) {
    return exp(x);
}
MT_DEV float mt_log(float x) {
    return mt_logv_f(x);
}
MT_DEV double mt_log(double x) {
    return log(x);
}

// ---------------------------------------------------------------- row statistics

// Forward: m the running max, s the sum of exp(x - m). Backward: s a plain sum, m unused.
template <typename A> struct mt_stat { A m, s; };

template <typename A> MT_DEV mt_stat<A> mt_stat_identity() {
    mt_stat<A> t = {(A)-INFINITY, (A)0};
    return t;
}

// One element into (m, s). The max never becomes NaN (NaN fails every compare), a NaN
// element makes s NaN instead, and so the whole row, as the CPU's two passes give. While m
// is -inf every element so far is -inf: they add exp(-inf - 0) = 0.
template <typename A> MT_DEV void mt_lse_push(mt_stat<A> &t, A x) {
    if (x > t.m) {
        // x - x + 1 is 1, or NaN for x = +inf: the exp(inf - inf) of the two-pass form
        t.s = t.s * mt_exp(t.m - x) + (x - x + (A)1);
        t.m = x;
    } else {
        t.s += mt_exp(x - (t.m == -INFINITY ? (A)0 : t.m));
    }
}

template <typename A> MT_DEV mt_stat<A> mt_stat_merge(mt_stat<A> a, mt_stat<A> b, bool lse) {
    if (!lse) {
        a.s += b.s;
        return a;
    }
    A M = b.m > a.m ? b.m : a.m, Ms = M == -INFINITY ? (A)0 : M;
    a.s = a.s * mt_exp(a.m - Ms) + b.s * mt_exp(b.m - Ms);
    a.m = M;
    return a;
}

// Butterfly over groups of `width` lanes (a power of two <= 32, 1-D blocks); all 32 lanes
// must call it. FMA contraction makes the merge not bitwise commutative, so lanes may end
// with different roundings: every lane takes its group leader's value, and a row's elements
// are all scaled by the same numbers.
template <typename A> MT_DEV mt_stat<A> mt_warp_stat(mt_stat<A> v, bool lse, int width) {
    for (int o = width >> 1; o > 0; o >>= 1) {
        mt_stat<A> w;
        w.m = __shfl_xor_sync(MT_FULL, v.m, o);
        w.s = __shfl_xor_sync(MT_FULL, v.s, o);
        v = mt_stat_merge(v, w, lse);
    }
    int leader = (int)(threadIdx.x & 31) & ~(width - 1);
    v.m = __shfl_sync(MT_FULL, v.m, leader);
    v.s = __shfl_sync(MT_FULL, v.s, leader);
    return v;
}

// Whole-block version (blockDim.x a multiple of 32); every warp repeats the final fold on
// the same data in the same order, so all threads get identical bits. sm: 32 entries.
template <typename A> MT_DEV mt_stat<A> mt_block_stat(mt_stat<A> v, bool lse, mt_stat<A> *sm) {
    int t = (int)threadIdx.x, nw = (int)blockDim.x >> 5;
    v = mt_warp_stat(v, lse, 32);
    if ((t & 31) == 0) sm[t >> 5] = v;
    __syncthreads();
    v = (t & 31) < nw ? sm[t & 31] : mt_stat_identity<A>();
    v = mt_warp_stat(v, lse, 32);
    __syncthreads(); // sm may be reused
    return v;
}

template <typename A>
MT_DEV mt_stat<A> mt_group_stat(mt_stat<A> v, bool lse, int width, mt_stat<A> *sm) {
    return width <= 32 ? mt_warp_stat(v, lse, width) : mt_block_stat(v, lse, sm);
}

// Lanes per row: a power of two up to a warp for rows up to 1024, else a block.
static int mt_row_width(int64_t L) {
    return L > 1024 ? (L > 8192 ? 512 : 256) : mt_pow2_at_least(L, 32);
}
static int mt_row_threads(int width) {
    return width > 32 ? width : 256;
}

// ---------------------------------------------------------------- softmax

// Operands: forward {input, (none), output}, backward {y, grad_out, grad_in}. Element
// strides; ls[k] along the dim, rs[k] over the other dims (coalesced where all operands
// allow, size-1 dims dropped).
typedef struct {
    const char *p[3];
    mt_dtype dt[3];
    bool log, bwd;
    int nd;
    int64_t L, rows;
    int64_t ls[3];
    int64_t shape[MT_MAX_DIMS], rs[3][MT_MAX_DIMS];
} mt_smplan;

typedef struct {
    int64_t v[3];
} mt_off3;

// Row r's first element in each operand; the unrolled loop keeps the plan in the
// parameter bank (constant indices).
MT_DEV mt_off3 mt_row_offsets(const mt_smplan &P, int64_t r) {
    mt_off3 o = {{0, 0, 0}};
    MT_UNROLL
    for (int d = MT_MAX_DIMS - 1; d >= 0; d--) {
        if (d >= P.nd) continue;
        int64_t q = r / P.shape[d], i = r - q * P.shape[d];
        o.v[0] += i * P.rs[0][d];
        o.v[1] += i * P.rs[1][d];
        o.v[2] += i * P.rs[2][d];
        r = q;
    }
    return o;
}

template <typename A> MT_DEV A mt_sm_in(const mt_smplan &P, int k, const mt_off3 &o, int64_t i) {
    return mt_load<A>(P.p[k], P.dt[k], o.v[k] + i * P.ls[k]);
}

// Element i into the row's statistics.
template <typename A>
MT_DEV void mt_sm_push(const mt_smplan &P, const mt_off3 &o, int64_t i, mt_stat<A> &t) {
    if (!P.bwd) {
        mt_lse_push(t, mt_sm_in<A>(P, 0, o, i));
        return;
    }
    A g = mt_sm_in<A>(P, 1, o, i);
    t.s += P.log ? g : g * mt_sm_in<A>(P, 0, o, i);
}

// The row's constants for the second pass: forward (max, 1 / sum or log(sum)); a row of
// -inf uses max 0, so its sum is 0 and its outputs NaN, as on the CPU. Backward: the sum.
template <typename A> MT_DEV mt_stat<A> mt_sm_final(const mt_smplan &P, mt_stat<A> t) {
    if (P.bwd) return t;
    t.m = t.m == -INFINITY ? (A)0 : t.m;
    t.s = P.log ? mt_log(t.s) : (A)1 / t.s;
    return t;
}

// softmax exp(x - m) / s; log_softmax (x - m) - log(s);
// backward y * (g - sum(g * y)); log: g - exp(y) * sum(g)
template <typename A>
MT_DEV void mt_sm_write(const mt_smplan &P, const mt_off3 &o, int64_t i, mt_stat<A> t) {
    A x = mt_sm_in<A>(P, 0, o, i), r;
    if (!P.bwd) {
        r = P.log ? (x - t.m) - t.s : mt_exp(x - t.m) * t.s;
    } else {
        A g = mt_sm_in<A>(P, 1, o, i);
        r = P.log ? g - mt_exp(x) * t.s : x * (g - t.s);
    }
    mt_store<A>((char *)P.p[2], P.dt[2], o.v[2] + i * P.ls[2], r);
}

template <typename A>
__global__ void __launch_bounds__(512, 2) mt_softmax_rows(mt_smplan P, int width) {
    MT_SHARED(mt_stat<A>, sm, 32);
    int lane = (int)threadIdx.x & (width - 1);
    int64_t r = (int64_t)blockIdx.x * ((int)blockDim.x / width) + (int)threadIdx.x / width;
    bool active = r < P.rows; // idle lanes still take part in the shuffles
    mt_off3 o = {{0, 0, 0}};
    mt_stat<A> t = mt_stat_identity<A>();
    if (active) {
        o = mt_row_offsets(P, r);
        for (int64_t i = lane; i < P.L; i += width) mt_sm_push(P, o, i, t);
    }
    t = mt_sm_final(P, mt_group_stat(t, !P.bwd, width, sm));
    if (!active) return;
    for (int64_t i = lane; i < P.L; i += width) mt_sm_write(P, o, i, t);
}

template <typename A> __global__ void __launch_bounds__(512, 2) mt_softmax_cols(mt_smplan P) {
    MT_SHARED(mt_stat<A>, sm, 512);
    int tx = (int)threadIdx.x, ty = (int)threadIdx.y, cx = (int)blockDim.x;
    int64_t r = (int64_t)blockIdx.x * cx + tx;
    bool active = r < P.rows;
    mt_off3 o = {{0, 0, 0}};
    mt_stat<A> t = mt_stat_identity<A>();
    if (active) {
        o = mt_row_offsets(P, r);
        for (int64_t i = ty; i < P.L; i += (int)blockDim.y) mt_sm_push(P, o, i, t);
    }
    sm[ty * cx + tx] = t;
    __syncthreads();
    for (int h = (int)blockDim.y >> 1; h > 0; h >>= 1) {
        if (ty < h)
            sm[ty * cx + tx] = mt_stat_merge(sm[ty * cx + tx], sm[(ty + h) * cx + tx], !P.bwd);
        __syncthreads();
    }
    t = mt_sm_final(P, sm[tx]);
    if (!active) return;
    for (int64_t i = ty; i < P.L; i += (int)blockDim.y) mt_sm_write(P, o, i, t);
}

// ops[2] (the output) gives the shape; ops[1] may be NULL (forward).
static void mt_smplan_make(mt_smplan *P, const mt_cuda_array *const *ops, int dim) {
    const mt_cuda_array *t = ops[2];
    memset(P, 0, sizeof *P);
    P->L = t->ndim ? t->shape[dim] : 1;
    P->rows = P->L ? t->numel / P->L : 0;
    for (int k = 0; k < 3; k++) {
        if (!ops[k]) continue;
        P->p[k] = ops[k]->data;
        P->dt[k] = ops[k]->dtype;
        P->ls[k] = t->ndim ? ops[k]->strides[dim] : 1;
    }
    for (int d = 0; d < t->ndim; d++) {
        int64_t n = t->shape[d];
        if (d == dim || n == 1) continue;
        bool merge = P->nd > 0;
        for (int k = 0; k < 3 && merge; k++)
            merge = !ops[k] || P->rs[k][P->nd - 1] == ops[k]->strides[d] * n;
        int at = merge ? P->nd - 1 : P->nd++;
        P->shape[at] = merge ? P->shape[at] * n : n;
        for (int k = 0; k < 3; k++) P->rs[k][at] = ops[k] ? ops[k]->strides[d] : 0;
    }
}

// Columns when the row's first operand is strided along the dim and contiguous across rows
// (reads coalesce across threadIdx.x); rows kernels otherwise.
template <typename A>
static cudaError_t mt_softmax_launch(const mt_cuda_ctx *c, const mt_smplan *P) {
    if (P->rows == 0 || P->L == 0) return cudaSuccess;
    if (P->nd > 0 && P->ls[0] != 1 && P->rs[0][P->nd - 1] == 1) {
        int cx = mt_pow2_at_least(P->rows, 32), cy = mt_pow2_at_least(P->L, 256 / cx);
        int64_t blocks = (P->rows + cx - 1) / cx;
        // few rows: taller blocks. A fixed threshold (2 x 132 SMs), not the device's SM
        // count, since the tree's shape sets the rounding: the same bits on every GPU.
        if (blocks < 264) cy = mt_pow2_at_least(P->L, 512 / cx);
        MT_LAUNCH(mt_softmax_cols<A>, dim3((unsigned)blocks), dim3((unsigned)cx, (unsigned)cy), 0,
                  c->stream, *P);
    } else {
        int width = mt_row_width(P->L), threads = mt_row_threads(width);
        int64_t per = threads / width, blocks = (P->rows + per - 1) / per;
        MT_LAUNCH(mt_softmax_rows<A>, dim3((unsigned)blocks), dim3((unsigned)threads), 0, c->stream,
                  *P, width);
    }
    return cudaGetLastError();
}

static int mt_softmax_run(const mt_cuda_ctx *c, const mt_cuda_array *const *ops, int dim, bool log,
                          bool bwd) {
    bool wide = false;
    for (int k = 0; k < 3; k++) {
        if (!ops[k]) continue;
        if (!mt_is_floating(ops[k]->dtype) || ops[k]->ndim != ops[2]->ndim ||
            (ops[k]->ndim > 0 && (dim < 0 || dim >= ops[k]->ndim)))
            return (int)cudaErrorInvalidValue;
        wide = wide || ops[k]->dtype == MT_F64;
    }
    mt_smplan P;
    mt_smplan_make(&P, ops, dim);
    P.log = log;
    P.bwd = bwd;
    return (int)(wide ? mt_softmax_launch<double>(c, &P) : mt_softmax_launch<float>(c, &P));
}

extern "C" int mt_cuda_softmax(const mt_cuda_ctx *c, const mt_cuda_array *out,
                               const mt_cuda_array *a, int dim, bool log) {
    const mt_cuda_array *ops[3] = {a, NULL, out};
    return mt_softmax_run(c, ops, dim, log, false);
}

extern "C" int mt_cuda_softmax_backward(const mt_cuda_ctx *c, const mt_cuda_array *grad_in,
                                        const mt_cuda_array *grad_out, const mt_cuda_array *y,
                                        int dim, bool log) {
    const mt_cuda_array *ops[3] = {y, grad_out, grad_in};
    return mt_softmax_run(c, ops, dim, log, true);
}

// ---------------------------------------------------------------- cross entropy

// logits [N, C] (any strides), labels I64 [N]; loss [N]; lse [N, 2]: the row's max and the
// log of its sum of exp(x - max), kept apart (their sum, rounded at the scale of a large max,
// loses the log's digits); grad [N, C]. valid is
// used as an integer counter (u32 for F32, u64 for F64) while the forward runs, then
// converted in place: integer atomics are exact in any order, so the count is deterministic
// without a scratch buffer.
typedef struct {
    const char *x, *scale, *lse_in;
    const int64_t *lab;
    char *loss, *lse, *grad, *valid;
    mt_dtype xdt, loss_dt, lse_dt, gdt, scale_dt, valid_dt;
    mt_cuda_fault *fault;
    int64_t N, C, ignore, xs0, xs1, labs, loss_s, lse_s, lse_c, gs0, gs1;
} mt_ceplan;

// First writer wins: the host reports this one at the next synchronisation.
MT_DEV void mt_fault_label(mt_cuda_fault *f, int64_t row, int64_t label, int64_t C) {
    if (f && atomicCAS(&f->code, 0, (int)MT_CUDA_FAULT_LABEL_RANGE) == 0) {
        f->op = (int)MT_OP_CROSS_ENTROPY;
        f->a = row;
        f->b = label;
        f->c = C;
    }
}

// One row of the forward for the group of `width` lanes (every lane calls it: the
// statistics are a collective); returns 1 on the group's lane 0 when the row counts.
template <typename A>
MT_DEV unsigned mt_ce_row(const mt_ceplan &P, int64_t r, int lane, int width, mt_stat<A> *sm) {
    bool active = r < P.N;
    int64_t lab = active ? P.lab[r * P.labs] : P.ignore;
    bool used = lab != P.ignore; // ignored rows skip the logits
    int64_t xo = r * P.xs0;
    mt_stat<A> t = mt_stat_identity<A>();
    if (used)
        for (int64_t i = lane; i < P.C; i += width)
            mt_lse_push(t, mt_load<A>(P.x, P.xdt, xo + i * P.xs1));
    t = mt_group_stat(t, true, width, sm);
    if (!active || lane != 0) return 0;
    A loss = 0, m = 0, log_sum = 0;
    if (used) {
        m = t.m == -INFINITY ? (A)0 : t.m;
        log_sum = mt_log(t.s);
        if (lab < 0 || lab >= P.C) {
            mt_fault_label(P.fault, r, lab, P.C);
            loss = (A)NAN;
        } else {
            loss = (m - mt_load<A>(P.x, P.xdt, xo + lab * P.xs1)) + log_sum;
        }
    }
    mt_store<A>(P.loss, P.loss_dt, r * P.loss_s, loss);
    mt_store<A>(P.lse, P.lse_dt, r * P.lse_s, m);
    mt_store<A>(P.lse, P.lse_dt, r * P.lse_s + P.lse_c, log_sum);
    return used ? 1u : 0u;
}

// Grid-stride over rows so that the valid count costs one atomic per block, not per row.
template <typename A>
__global__ void __launch_bounds__(512, 2) mt_ce_forward(mt_ceplan P, int width) {
    MT_SHARED(mt_stat<A>, sm, 32);
    MT_SHARED(unsigned, cnt, 32);
    int lane = (int)threadIdx.x & (width - 1), per = (int)blockDim.x / width;
    unsigned mine = 0;
    for (int64_t base = (int64_t)blockIdx.x * per; base < P.N; base += (int64_t)gridDim.x * per)
        mine += mt_ce_row<A>(P, base + (int)threadIdx.x / width, lane, width, sm);
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(MT_FULL, mine, o);
    if ((threadIdx.x & 31) == 0) cnt[threadIdx.x >> 5] = mine;
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned n = 0;
    for (int w = 0; w < (int)blockDim.x >> 5; w++) n += cnt[w];
    if (n == 0) return;
    if (P.valid_dt == MT_F64)
        atomicAdd((unsigned long long *)P.valid, (unsigned long long)n);
    else
        atomicAdd((unsigned *)P.valid, n);
}

__global__ void mt_ce_valid_finish(char *valid, mt_dtype dt) {
    if (dt == MT_F64)
        *(double *)valid = (double)*(const unsigned long long *)valid;
    else
        *(float *)valid = (float)*(const unsigned *)valid;
}

// grad = (exp((x - max) - log_sum) - onehot(label)) * scale[0]; ignored rows 0; a bad label faults
// and gives a NaN row. No collectives: groups only shape the memory access.
template <typename A>
__global__ void __launch_bounds__(512, 2) mt_ce_backward(mt_ceplan P, int width) {
    int lane = (int)threadIdx.x & (width - 1);
    int64_t r = (int64_t)blockIdx.x * ((int)blockDim.x / width) + (int)threadIdx.x / width;
    if (r >= P.N) return;
    int64_t lab = P.lab[r * P.labs], go = r * P.gs0, xo = r * P.xs0;
    if (lab == P.ignore) {
        for (int64_t i = lane; i < P.C; i += width) mt_store<A>(P.grad, P.gdt, go + i * P.gs1, 0);
        return;
    }
    bool bad = lab < 0 || lab >= P.C;
    if (bad && lane == 0) mt_fault_label(P.fault, r, lab, P.C);
    A k = mt_load<A>(P.scale, P.scale_dt, 0), m = mt_load<A>(P.lse_in, P.lse_dt, r * P.lse_s);
    A log_sum = mt_load<A>(P.lse_in, P.lse_dt, r * P.lse_s + P.lse_c);
    for (int64_t i = lane; i < P.C; i += width) {
        A v = mt_exp((mt_load<A>(P.x, P.xdt, xo + i * P.xs1) - m) - log_sum) * k;
        if (i == lab) v -= k;
        mt_store<A>(P.grad, P.gdt, go + i * P.gs1, bad ? (A)NAN : v);
    }
}

static void mt_ceplan_make(mt_ceplan *P, const mt_cuda_ctx *c, const mt_cuda_array *logits,
                           const mt_cuda_array *labels, const mt_cuda_array *lse, int64_t ignore) {
    memset(P, 0, sizeof *P);
    P->x = logits->data;
    P->xdt = logits->dtype;
    P->N = logits->shape[0];
    P->C = logits->shape[1];
    P->xs0 = logits->strides[0];
    P->xs1 = logits->strides[1];
    P->lab = (const int64_t *)labels->data;
    P->labs = labels->ndim ? labels->strides[0] : 0;
    P->lse_dt = lse->dtype;
    P->lse_s = lse->strides[0];
    P->lse_c = lse->strides[1];
    P->ignore = ignore;
    P->fault = c->fault;
}

static bool mt_ce_args_ok(const mt_cuda_array *logits, const mt_cuda_array *labels,
                          const mt_cuda_array *lse) {
    return lse->ndim == 2 && lse->shape[0] == logits->shape[0] && lse->shape[1] == 2 &&
           logits->ndim == 2 && mt_is_floating(logits->dtype) && labels->dtype == MT_I64 &&
           labels->ndim <= 1 && (labels->ndim == 0 || labels->shape[0] == logits->shape[0]);
}

extern "C" int mt_cuda_cross_entropy(const mt_cuda_ctx *c, const mt_cuda_array *loss,
                                     const mt_cuda_array *lse, const mt_cuda_array *valid,
                                     const mt_cuda_array *logits, const mt_cuda_array *labels,
                                     int64_t ignore_index) {
    if (!mt_ce_args_ok(logits, labels, lse) || !mt_is_floating(loss->dtype) ||
        !mt_is_floating(lse->dtype) || (valid->dtype != MT_F32 && valid->dtype != MT_F64))
        return (int)cudaErrorInvalidValue;
    mt_ceplan P;
    mt_ceplan_make(&P, c, logits, labels, lse, ignore_index);
    P.loss = loss->data;
    P.loss_dt = loss->dtype;
    P.loss_s = loss->ndim ? loss->strides[0] : 0;
    P.lse = lse->data;
    P.valid = valid->data;
    P.valid_dt = valid->dtype;
    cudaError_t e = cudaMemsetAsync(valid->data, 0, valid->dtype == MT_F64 ? 8 : 4, c->stream);
    if (e != cudaSuccess) return (int)e;
    if (P.N > 0) {
        int width = mt_row_width(P.C), threads = mt_row_threads(width);
        int64_t per = threads / width, blocks = (P.N + per - 1) / per;
        int64_t most = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * (2048 / threads);
        if (blocks > most) blocks = most;
        if (logits->dtype == MT_F64)
            MT_LAUNCH(mt_ce_forward<double>, dim3((unsigned)blocks), dim3((unsigned)threads), 0,
                      c->stream, P, width);
        else
            MT_LAUNCH(mt_ce_forward<float>, dim3((unsigned)blocks), dim3((unsigned)threads), 0,
                      c->stream, P, width);
    }
    MT_LAUNCH(mt_ce_valid_finish, dim3(1), dim3(1), 0, c->stream, valid->data, valid->dtype);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_cross_entropy_backward(const mt_cuda_ctx *c, const mt_cuda_array *grad,
                                              const mt_cuda_array *logits,
                                              const mt_cuda_array *labels, const mt_cuda_array *lse,
                                              const mt_cuda_array *scale, int64_t ignore_index) {
    if (!mt_ce_args_ok(logits, labels, lse) || grad->ndim != 2 || !mt_is_floating(grad->dtype) ||
        !mt_is_floating(lse->dtype) || !mt_is_floating(scale->dtype))
        return (int)cudaErrorInvalidValue;
    mt_ceplan P;
    mt_ceplan_make(&P, c, logits, labels, lse, ignore_index);
    P.lse_in = lse->data;
    P.grad = grad->data;
    P.gdt = grad->dtype;
    P.gs0 = grad->strides[0];
    P.gs1 = grad->strides[1];
    P.scale = scale->data;
    P.scale_dt = scale->dtype;
    if (P.N == 0 || P.C == 0) return 0;
    int width = mt_row_width(P.C), threads = mt_row_threads(width);
    int64_t per = threads / width, blocks = (P.N + per - 1) / per;
    if (logits->dtype == MT_F64 || grad->dtype == MT_F64)
        MT_LAUNCH(mt_ce_backward<double>, dim3((unsigned)blocks), dim3((unsigned)threads), 0,
                  c->stream, P, width);
    else
        MT_LAUNCH(mt_ce_backward<float>, dim3((unsigned)blocks), dim3((unsigned)threads), 0,
                  c->stream, P, width);
    return (int)cudaGetLastError();
}
