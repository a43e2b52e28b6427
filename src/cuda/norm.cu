// Layer norm, batch norm (with the fused residual + ReLU) and dropout on the device, the
// formulas of the CPU kernels (cpu_layer_norm_impl.h, cpu_batch_norm_impl.h, cpu_dropout.c)
// with the sums as block trees instead of loops:
// - layer norm: a block per row; the row is shifted by its first value k, so that neither
//   the variance nor x - mean cancels when |mean| >> std; the weight and bias gradients are
//   column sums over the rows, a thread per column in row order;
// - batch norm: per direction a pass of partial sums over (channel, split) blocks, a small
//   pass that finishes them per channel, and an elementwise pass, all walking memory order
//   in NCHW and channels-last alike (see the batch norm section); sums of the shifted values
//   in double as on the CPU;
// - dropout: a thread per Philox block of four elements, the mask a pure function of (seed,
//   offset, flat index) exactly as on the CPU, so both devices drop the same elements.
// Trees have a fixed shape for a launch: results are reproducible, with no float atomics.
#include "cuda_compat.h"
#include <math.h>
#include "element_access.cuh"
#include "../math/norm_math.h"
#include "../math/scalar_ops.h" // MT_RELU_GRAD
#include "../math/philox.h"

constexpr int NORM_THREADS = 256;

// Sum over the block (NORM_THREADS threads); every thread gets the same bits. sm: 32 slots.
template <typename A> MT_DEV A norm_block_sum(A v, A *sm) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MT_FULL, v, o);
    int t = (int)threadIdx.x, nw = (int)blockDim.x >> 5;
    if ((t & 31) == 0) sm[t >> 5] = v;
    __syncthreads();
    v = (t & 31) < nw ? sm[t & 31] : (A)0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MT_FULL, v, o);
    __syncthreads(); // sm may be reused
    return v;
}

MT_DEV float norm_sqrt(float v) {
    return sqrtf(v);
}
MT_DEV double norm_sqrt(double v) {
    return sqrt(v);
}

// ---------------------------------------------------------------- layer norm

template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) ln_forward(mt_cuda_layer_norm_args a) {
    MT_SHARED(A, sm, 32);
    int64_t r = blockIdx.x, D = a.D, base = r * D;
    const A *w = (const A *)a.weight, *b = (const A *)a.bias;
    A k = mt_load<A>(a.x, a.xdt, base), s = 0, v = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += mt_load<A>(a.x, a.xdt, base + j) - k;
    A md = norm_block_sum(s, sm) / (A)D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        A d = (mt_load<A>(a.x, a.xdt, base + j) - k) - md;
        v += d * d;
    }
    A rs = (A)1 / norm_sqrt(norm_block_sum(v, sm) / (A)D + (A)a.eps);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        A h = ((mt_load<A>(a.x, a.xdt, base + j) - k) - md) * rs;
        mt_store<A>(a.y, a.ydt, base + j, (w ? h * w[j] : h) + (b ? b[j] : (A)0));
    }
    if (threadIdx.x == 0) {
        ((A *)a.mean)[r] = k + md;
        ((A *)a.rstd)[r] = rs;
    }
}

// gx = rstd (g - mean(g) - xhat mean(g xhat)), g = gy w
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) ln_backward_x(mt_cuda_layer_norm_args a) {
    MT_SHARED(A, sm, 32);
    int64_t r = blockIdx.x, D = a.D, base = r * D;
    const A *w = (const A *)a.weight;
    A m = ((const A *)a.mean)[r], rs = ((const A *)a.rstd)[r], s = 0, sx = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        A g = mt_load<A>(a.gy, a.gydt, base + j);
        if (w) g *= w[j];
        s += g;
        sx += g * ((mt_load<A>(a.x, a.xdt, base + j) - m) * rs);
    }
    s = norm_block_sum(s, sm) / (A)D;
    sx = norm_block_sum(sx, sm) / (A)D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        A g = mt_load<A>(a.gy, a.gydt, base + j);
        if (w) g *= w[j];
        A xh = (mt_load<A>(a.x, a.xdt, base + j) - m) * rs;
        mt_store<A>(a.gx, a.gxdt, base + j, rs * (g - s - xh * sx));
    }
}

// gw[j] = sum over rows of gy xhat, gb[j] = sum of gy: a thread per column, rows in order
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) ln_backward_params(mt_cuda_layer_norm_args a) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < a.D;
         j += (int64_t)gridDim.x * blockDim.x) {
        A pw = 0, pb = 0;
        for (int64_t r = 0; r < a.rows; r++) {
            A g = mt_load<A>(a.gy, a.gydt, r * a.D + j);
            A m = ((const A *)a.mean)[r], rs = ((const A *)a.rstd)[r];
            pw += g * ((mt_load<A>(a.x, a.xdt, r * a.D + j) - m) * rs);
            pb += g;
        }
        if (a.gw) ((A *)a.gw)[j] = pw;
        if (a.gb) ((A *)a.gb)[j] = pb;
    }
}

static unsigned norm_col_blocks(int64_t cols) {
    int64_t b = (cols + NORM_THREADS - 1) / NORM_THREADS;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

extern "C" int mt_cuda_layer_norm(const mt_cuda_ctx *c, const mt_cuda_layer_norm_args *a) {
    if (a->rows == 0 || a->D == 0) return 0;
    if (a->rows > 0x7fffffff) return (int)cudaErrorInvalidValue;
    if (a->wide)
        MT_LAUNCH(ln_forward<double>, (unsigned)a->rows, NORM_THREADS, 0, c->stream, *a);
    else
        MT_LAUNCH(ln_forward<float>, (unsigned)a->rows, NORM_THREADS, 0, c->stream, *a);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_layer_norm_backward(const mt_cuda_ctx *c, const mt_cuda_layer_norm_args *a) {
    if (a->rows == 0 || a->D == 0) return 0;
    if (a->rows > 0x7fffffff) return (int)cudaErrorInvalidValue;
    if (a->gx) {
        if (a->wide)
            MT_LAUNCH(ln_backward_x<double>, (unsigned)a->rows, NORM_THREADS, 0, c->stream, *a);
        else
            MT_LAUNCH(ln_backward_x<float>, (unsigned)a->rows, NORM_THREADS, 0, c->stream, *a);
        int e = (int)cudaGetLastError();
        if (e) return e;
    }
    if (a->gw || a->gb) {
        if (a->wide)
            MT_LAUNCH(ln_backward_params<double>, norm_col_blocks(a->D), NORM_THREADS, 0, c->stream,
                      *a);
        else
            MT_LAUNCH(ln_backward_params<float>, norm_col_blocks(a->D), NORM_THREADS, 0, c->stream,
                      *a);
    }
    return (int)cudaGetLastError();
}

// ---------------------------------------------------------------- batch norm

// Each direction is three launches that walk memory in order:
// 1. sums: a block per (channel group, split); split sp of a channel is a contiguous range of
//    its M = N * S values; each block writes its channels' two partial sums (double) to a
//    scratch, part[(q * splits + sp) * C + ch] for quantity q;
// 2. finish: a thread column per channel adds its splits' partials (a fixed tree), then the
//    statistics (saved mean and rstd, running update) or gradients of the weights, and the
//    per-channel constants of pass 3 into the scratch;
// 3. apply: pass 1's grid; each thread keeps its channel's constants in registers.
// Two layouts:
// - channels-last (dense [N * S, C], and every [N, C] input, where S = 1): block (cw, rw), cw
//   the channels of a block (a power of two, C's up to 32), rw = 256 / cw rows; a warp reads
//   cw consecutive channels of 32 / cw consecutive rows, so every 32-byte sector it touches
//   is used whole. (One block per channel, stepping C elements from thread to thread, used a
//   sector per value: 16 times the traffic on F16/BF16, and a single block per channel.)
// - NCHW ([N, C, S]): a block of 1 x 256 per (channel, split); a channel is N runs of S
//   contiguous values, walked in steps of 256 with (n, s) advanced without division:
//   consecutive threads read consecutive addresses but where a run ends.
// Splits: about 8 blocks per SM in all, each thread at least 16 values, at most 1024 splits.
// The loops issue four loads before using them, so that a thread keeps several in flight.
// Statistics are sums of the values shifted by the channel's first one, in double, as on the
// CPU; the partials only change the order of the double additions. The plan depends on the
// shape and the SM count alone: a device gives the same bits every run.

struct bn_plan {
    int64_t C, S, M;       // M = N * S values per channel
    bool nhwc;             // channel stride 1 (S = 1 or dense NHWC)
    int cw, rw, lg_rw;     // block shape (NCHW: 1 x NORM_THREADS), log2(rw)
    int64_t gx;            // channel groups (NHWC) or channels (NCHW)
    int64_t splits, chunk; // and the splits of each, rows (NHWC) or values (NCHW) per split
    int64_t q, rem;        // NCHW: a step of rw values is q whole runs of S and rem values
    double inv_s;          // NCHW: 1 / S, for a division-free first (n, s)
};

constexpr int BN_MAX_SPLITS = 1024, BN_UNROLL = 4;

static bn_plan bn_make_plan(const mt_cuda_ctx *c, int64_t N, int64_t C, int64_t S, bool nhwc) {
    bn_plan p;
    p.C = C;
    p.S = S;
    p.M = N * S;
    p.nhwc = nhwc || S == 1;
    if (p.nhwc) {
        p.cw = 1;
        while (p.cw < C && p.cw < 32) p.cw <<= 1;
        p.rw = NORM_THREADS / p.cw;
        p.gx = (C + p.cw - 1) / p.cw;
    } else { // a block's threads all on one channel
        p.cw = 1;
        p.rw = NORM_THREADS;
        p.gx = C;
    }
    int64_t lanes = p.rw; // threads of a block on one channel
    for (p.lg_rw = 0; (1 << p.lg_rw) < p.rw; p.lg_rw++) {
    }
    p.q = lanes / S;
    p.rem = lanes - p.q * S;
    p.inv_s = 1.0 / (double)S;
    int64_t target = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 8;
    int64_t sp = (target + p.gx - 1) / p.gx, most = p.M / (lanes * 16);
    if (sp > most) sp = most;
    if (sp > BN_MAX_SPLITS) sp = BN_MAX_SPLITS;
    if (sp < 1) sp = 1;
    p.chunk = (p.M + sp - 1) / sp;
    p.splits = p.chunk > 0 ? (p.M + p.chunk - 1) / p.chunk : 1;
    return p;
}

static dim3 bn_block(const bn_plan &p) {
    return dim3((unsigned)p.cw, (unsigned)p.rw);
}
// One block per (channel group, split), group fastest: blocks running together read the same
// rows. At most max(gx, about twice the 8 per SM) blocks: within grid.x's 2^31 - 1.
static dim3 bn_grid(const bn_plan &p) {
    return dim3((unsigned)(p.gx * p.splits));
}
// The finish pass: 32 channels by 8 lanes over the splits.
constexpr int BN_FIN_CW = 32, BN_FIN_RW = NORM_THREADS / BN_FIN_CW;
static dim3 bn_fin_grid(const bn_plan &p) {
    return dim3((unsigned)((p.C + BN_FIN_CW - 1) / BN_FIN_CW));
}

// This thread's channel, its lane among the block's threads on that channel, and the split.
// (Device code divides 32-bit numbers only: a 64-bit division is a subroutine call in SASS,
// whose saved registers made ptxas spill.)
MT_DEV int64_t bn_channel(const bn_plan &p, int *lane, int64_t *sp) {
    int64_t b = blockIdx.x;
    *sp = (unsigned)b / (unsigned)p.gx; // both below 2^31
    *lane = (int)threadIdx.y;
    return (b - *sp * p.gx) * p.cw + threadIdx.x;
}

// Where channel ch's value 0 lies (the shift of the sums).
MT_DEV int64_t bn_first(const bn_plan &p, int64_t ch) {
    return p.nhwc ? ch : ch * p.S;
}

// The values of one thread in split sp: left of them remain, the next at element e.
struct bn_cursor {
    int64_t e, left;
    int64_t step;   // NHWC: rows per step * C; NCHW: the jump within or across runs
    int64_t s, rem; // NCHW: position in the run, values advanced beyond whole runs
};

MT_DEV bn_cursor bn_cursor_at(const bn_plan &p, int64_t ch, int64_t sp, int lane) {
    bn_cursor c;
    int64_t lanes = p.rw;
    int64_t b = sp * p.chunk, end = b + p.chunk < p.M ? b + p.chunk : p.M, i = b + lane;
    c.left = i < end ? (end - i + lanes - 1) >> p.lg_rw : 0;
    if (p.nhwc) {
        c.e = i * p.C + ch;
        c.step = lanes * p.C;
        c.s = c.rem = 0;
    } else { // i = n S + s: n through 1 / S, off by at most one below 2^52 values
        int64_t n = (int64_t)((double)i * p.inv_s), s = i - n * p.S;
        if (s < 0) {
            s += p.S;
            n--;
        } else if (s >= p.S) {
            s -= p.S;
            n++;
        }
        c.s = s;
        c.rem = p.rem;
        c.e = (n * p.C + ch) * p.S + s;
        c.step = p.q * p.C * p.S + p.rem;
    }
    return c;
}

MT_DEV void bn_next(const bn_plan &p, bn_cursor &c) {
    c.left--;
    c.e += c.step;
    if (!p.nhwc) {
        c.s += c.rem;
        if (c.s >= p.S) { // into the next run: over the other channels' runs
            c.s -= p.S;
            c.e += (p.C - 1) * p.S;
        }
    }
}

// use(e, ld(e)) for the cursor's elements, U loads issued before their uses.
template <int U, typename Ld, typename Use>
MT_DEV void bn_walk(const bn_plan &p, bn_cursor c, Ld ld, Use use) {
    typedef decltype(ld((int64_t)0)) V;
    while (c.left >= U) {
        int64_t e[U];
        V v[U];
        MT_UNROLL
        for (int u = 0; u < U; u++) {
            e[u] = c.e;
            bn_next(p, c);
        }
        MT_UNROLL
        for (int u = 0; u < U; u++) v[u] = ld(e[u]);
        MT_UNROLL
        for (int u = 0; u < U; u++) use(e[u], v[u]);
    }
    while (c.left > 0) {
        int64_t e = c.e;
        bn_next(p, c);
        use(e, ld(e));
    }
}

// Element access for the sums and apply kernels: D the activations' dtype, fixed at compile
// time (the switch of mt_load folds away), or -1 where the call mixes dtypes (read at run time;
// one load in flight per thread, which keeps the code small enough for ptxas).
constexpr int BN_MIXED = -1;
template <typename A, int D> MT_DEV A bn_ld(const char *p, mt_dtype dt, int64_t i) {
    return mt_load<A>(p, D < 0 ? dt : (mt_dtype)D, i);
}
template <typename A, int D> MT_DEV void bn_st(char *p, mt_dtype dt, int64_t i, A v) {
    mt_store<A>(p, D < 0 ? dt : (mt_dtype)D, i, v);
}
template <int D> struct bn_unroll { static constexpr int value = D < 0 ? 1 : BN_UNROLL; };

// Sums a and b over threadIdx.y of a 2-d block (a fixed tree in shared memory); the result
// lands in every thread of row 0. sa, sb: blockDim.x * blockDim.y slots.
MT_DEV void bn_tree_y(double &a, double &b, double *sa, double *sb) {
    int cw = (int)blockDim.x, i = (int)threadIdx.y * cw + (int)threadIdx.x;
    sa[i] = a;
    sb[i] = b;
    __syncthreads();
    for (int h = (int)blockDim.y >> 1; h > 0; h >>= 1) {
        if ((int)threadIdx.y < h) {
            sa[i] += sa[i + h * cw];
            sb[i] += sb[i + h * cw];
        }
        __syncthreads();
    }
    a = sa[threadIdx.x];
    b = sb[threadIdx.x];
}

MT_DEV void bn_put_partials(const bn_plan &p, double *part, int64_t ch, int64_t sp, double a,
                            double b) {
    part[sp * p.C + ch] = a;
    part[(p.splits + sp) * p.C + ch] = b;
}

// The finish pass's sums of channel ch's partials (every thread takes part in the tree).
MT_DEV void bn_split_sums(const bn_plan &p, const double *part, int64_t ch, double *a, double *b,
                          double *sa, double *sb) {
    double u = 0, v = 0;
    if (ch < p.C)
        for (int64_t sp = threadIdx.y; sp < p.splits; sp += blockDim.y) {
            u += part[sp * p.C + ch];
            v += part[(p.splits + sp) * p.C + ch];
        }
    bn_tree_y(u, v, sa, sb);
    *a = u;
    *b = v;
}

// Pass 1 forward: sum(x - k), sum((x - k)^2), k the channel's first value.
template <typename A, int D>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_fwd_sums(mt_cuda_batch_norm_args a, bn_plan p, double *part) {
    MT_SHARED(double, sa, NORM_THREADS);
    MT_SHARED(double, sb, NORM_THREADS);
    int lane;
    int64_t sp, ch = bn_channel(p, &lane, &sp);
    bool active = ch < p.C;
    double s1 = 0, s2 = 0;
    if (active) {
        A k = bn_ld<A, D>(a.x, a.xdt, bn_first(p, ch));
        bn_walk<bn_unroll<D>::value>(
            p, bn_cursor_at(p, ch, sp, lane), [&](int64_t e) { return bn_ld<A, D>(a.x, a.xdt, e); },
            [&](int64_t, A v) {
                A d = v - k;
                s1 += (double)d;
                s2 += (double)(d * d);
            });
    }
    bn_tree_y(s1, s2, sa, sb);
    if (active && lane == 0) bn_put_partials(p, part, ch, sp, s1, s2);
}

// Pass 2 forward: the statistics (training: from the sums; eval: the running ones), saved
// mean and rstd, the running update, and the constants k, md, scale, shift of pass 3 in
// cst[q * C + ch] (A values, exact in double).
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_fwd_finish(mt_cuda_batch_norm_args a, bn_plan p, const double *part, double *cst) {
    MT_SHARED(double, sa, NORM_THREADS);
    MT_SHARED(double, sb, NORM_THREADS);
    int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, C = p.C;
    double s1 = 0, s2 = 0;
    if (a.training) bn_split_sums(p, part, ch, &s1, &s2, sa, sb);
    if (ch >= C || threadIdx.y != 0) return;
    const A *w = (const A *)a.weight, *b = (const A *)a.bias;
    A *rm = (A *)a.running_mean, *rv = (A *)a.running_var;
    A k, md = 0, mean, var;
    if (a.training) {
        k = mt_load<A>(a.x, a.xdt, bn_first(p, ch));
        mt_bn_moments m = mt_bn_moments_from_sums(s1, s2, (double)k, p.M);
        md = (A)m.shifted_mean;
        mean = (A)m.mean;
        var = (A)m.var;
        if (rm) {
            rm[ch] = (A)mt_bn_running_mean((double)rm[ch], (double)mean, a.momentum);
            rv[ch] = (A)mt_bn_running_var((double)rv[ch], (double)var, p.M, a.momentum);
        }
    } else {
        mean = k = rm[ch];
        var = rv[ch];
    }
    A rs = mt_bn_rstd_is_zero(a.training, (double)var, a.eps) ? (A)0
                                                              : (A)1 / norm_sqrt(var + (A)a.eps);
    ((A *)a.save_mean)[ch] = mean;
    ((A *)a.save_rstd)[ch] = rs;
    cst[ch] = (double)k;
    cst[C + ch] = (double)md;
    cst[2 * C + ch] = (double)(w ? w[ch] * rs : rs);
    cst[3 * C + ch] = (double)(b ? b[ch] : (A)0);
}

template <typename A> struct bn_xr { A x, r; };

// Pass 3 forward: y = act(((x - k) - md) scale + shift [+ residual]).
template <typename A, int D>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_fwd_apply(mt_cuda_batch_norm_args a, bn_plan p, const double *cst) {
    int lane;
    int64_t sp, ch = bn_channel(p, &lane, &sp), C = p.C;
    if (ch >= C) return;
    A k = (A)cst[ch], md = (A)cst[C + ch], scale = (A)cst[2 * C + ch], shift = (A)cst[3 * C + ch];
    bn_walk<bn_unroll<D>::value>(
        p, bn_cursor_at(p, ch, sp, lane),
        [&](int64_t e) {
            return bn_xr<A>{bn_ld<A, D>(a.x, a.xdt, e),
                            a.residual ? bn_ld<A, D>(a.residual, a.xdt, e) : (A)0};
        },
        [&](int64_t e, bn_xr<A> v) {
            A y = ((v.x - k) - md) * scale + shift;
            if (a.residual) y += v.r;
            if (a.relu) y = y < 0 ? (A)0 : y; // NaN propagates, as torch's relu
            bn_st<A, D>(a.y, a.xdt, e, y);
        });
}

// gz = gy, through ReLU's backward under relu
template <typename A, int D> MT_DEV A bn_gz(const mt_cuda_batch_norm_backward_args &a, int64_t e) {
    A g = bn_ld<A, D>(a.gy, a.gydt, e);
    if (!a.y) return g;
    A y = bn_ld<A, D>(a.y, a.xdt, e);
    return (A)MT_RELU_GRAD(g, y);
}

template <typename A> struct bn_gx { A g, x; };

// Pass 1 backward: sum(gz), sum(gz xhat).
template <typename A, int D>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_bwd_sums(mt_cuda_batch_norm_backward_args a, bn_plan p, double *part) {
    MT_SHARED(double, sa, NORM_THREADS);
    MT_SHARED(double, sb, NORM_THREADS);
    int lane;
    int64_t sp, ch = bn_channel(p, &lane, &sp);
    bool active = ch < p.C;
    double sg = 0, sgx = 0;
    if (active) {
        A mean = ((const A *)a.save_mean)[ch], rs = ((const A *)a.save_rstd)[ch];
        bn_walk<bn_unroll<D>::value>(
            p, bn_cursor_at(p, ch, sp, lane),
            [&](int64_t e) {
                return bn_gx<A>{bn_gz<A, D>(a, e), bn_ld<A, D>(a.x, a.xdt, e)};
            },
            [&](int64_t, bn_gx<A> v) {
                sg += (double)v.g;
                sgx += (double)(v.g * ((v.x - mean) * rs));
            });
    }
    bn_tree_y(sg, sgx, sa, sb);
    if (active && lane == 0) bn_put_partials(p, part, ch, sp, sg, sgx);
}

// Pass 2 backward: gw = sum(gz xhat), gb = sum(gz), and the constants of pass 3 in
// cst[q * C + ch]: w rstd, mean(gz) and mean(gz xhat) (0 in eval).
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_bwd_finish(mt_cuda_batch_norm_backward_args a, bn_plan p, bool sums, const double *part,
                  double *cst) {
    MT_SHARED(double, sa, NORM_THREADS);
    MT_SHARED(double, sb, NORM_THREADS);
    int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, C = p.C;
    double sg = 0, sgx = 0;
    if (sums) bn_split_sums(p, part, ch, &sg, &sgx, sa, sb);
    if (ch >= C || threadIdx.y != 0) return;
    if (a.gw) ((A *)a.gw)[ch] = (A)sgx;
    if (a.gb) ((A *)a.gb)[ch] = (A)sg;
    const A *w = (const A *)a.weight;
    A rs = ((const A *)a.save_rstd)[ch];
    cst[ch] = (double)((w ? w[ch] : (A)1) * rs);
    cst[C + ch] = (double)(a.training ? (A)(sg / (double)p.M) : (A)0);
    cst[2 * C + ch] = (double)(a.training ? (A)(sgx / (double)p.M) : (A)0);
}

// Pass 3 backward: gres = gz, gx = w rstd (gz - mean(gz) - xhat mean(gz xhat)).
template <typename A, int D>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_bwd_apply(mt_cuda_batch_norm_backward_args a, bn_plan p, const double *cst) {
    int lane;
    int64_t sp, ch = bn_channel(p, &lane, &sp), C = p.C;
    if (ch >= C) return;
    A mean = ((const A *)a.save_mean)[ch], rs = ((const A *)a.save_rstd)[ch];
    A k = (A)cst[ch], mg = (A)cst[C + ch], mgx = (A)cst[2 * C + ch];
    bn_walk<bn_unroll<D>::value>(
        p, bn_cursor_at(p, ch, sp, lane),
        [&](int64_t e) {
            return bn_gx<A>{bn_gz<A, D>(a, e), a.gx ? bn_ld<A, D>(a.x, a.xdt, e) : (A)0};
        },
        [&](int64_t e, bn_gx<A> v) {
            if (a.gres) bn_st<A, D>(a.gres, a.gresdt, e, v.g);
            if (a.gx) bn_st<A, D>(a.gx, a.gxdt, e, k * (v.g - mg - (v.x - mean) * rs * mgx));
        });
}

// The scratch of one call: the partial sums (when pass 1 runs), then ncst constants per
// channel; freed right after enqueuing (the allocator reuses blocks in stream order).
struct bn_scratch {
    double *part, *cst;
    size_t bytes;
};

static bool bn_scratch_get(const mt_cuda_ctx *c, const bn_plan &p, bool sums, int ncst,
                           bn_scratch *s) {
    size_t np = sums ? (size_t)(2 * p.splits * p.C) : 0;
    s->bytes = (np + (size_t)ncst * (size_t)p.C) * sizeof(double);
    double *d = (double *)c->scratch_alloc(c->device, s->bytes);
    s->part = d;
    s->cst = d ? d + np : NULL;
    return d != NULL;
}

template <typename A, int D>
static void bn_forward_launch(const mt_cuda_ctx *c, const mt_cuda_batch_norm_args &a,
                              const bn_plan &p, const bn_scratch &s) {
    if (a.training)
        MT_LAUNCH((bn_fwd_sums<A, D>), bn_grid(p), bn_block(p), 0, c->stream, a, p, s.part);
    MT_LAUNCH(bn_fwd_finish<A>, bn_fin_grid(p), dim3(BN_FIN_CW, BN_FIN_RW), 0, c->stream, a, p,
              (const double *)s.part, s.cst);
    MT_LAUNCH((bn_fwd_apply<A, D>), bn_grid(p), bn_block(p), 0, c->stream, a, p,
              (const double *)s.cst);
}

extern "C" int mt_cuda_batch_norm(const mt_cuda_ctx *c, const mt_cuda_batch_norm_args *a) {
    if (a->C == 0 || a->N * a->S == 0) return 0;
    if (a->C > 0x7fffffff) return (int)cudaErrorInvalidValue;
    bn_plan p = bn_make_plan(c, a->N, a->C, a->S, a->nhwc);
    bn_scratch s;
    if (!bn_scratch_get(c, p, a->training, 4, &s)) return (int)cudaErrorMemoryAllocation;
    // x, residual and y share xdt; the statistics are F64 for F64 x, else F32
    if (a->wide)
        bn_forward_launch<double, MT_F64>(c, *a, p, s);
    else if (a->xdt == MT_F16)
        bn_forward_launch<float, MT_F16>(c, *a, p, s);
    else if (a->xdt == MT_BF16)
        bn_forward_launch<float, MT_BF16>(c, *a, p, s);
    else
        bn_forward_launch<float, MT_F32>(c, *a, p, s);
    c->scratch_free(c->device, s.part, s.bytes);
    return (int)cudaGetLastError();
}

template <typename A, int D>
static void bn_backward_launch(const mt_cuda_ctx *c, const mt_cuda_batch_norm_backward_args &a,
                               const bn_plan &p, bool sums, const bn_scratch &s) {
    if (sums) MT_LAUNCH((bn_bwd_sums<A, D>), bn_grid(p), bn_block(p), 0, c->stream, a, p, s.part);
    MT_LAUNCH(bn_bwd_finish<A>, bn_fin_grid(p), dim3(BN_FIN_CW, BN_FIN_RW), 0, c->stream, a, p,
              sums, (const double *)s.part, s.cst);
    if (a.gx || a.gres)
        MT_LAUNCH((bn_bwd_apply<A, D>), bn_grid(p), bn_block(p), 0, c->stream, a, p,
                  (const double *)s.cst);
}

// The backward's activations in one dtype (the usual case: gy comes in x's), or mixed.
template <typename A>
static void bn_backward_dispatch(const mt_cuda_ctx *c, const mt_cuda_batch_norm_backward_args &a,
                                 const bn_plan &p, bool sums, const bn_scratch &s) {
    mt_dtype d = a.xdt;
    bool one = a.gydt == d && (!a.gx || a.gxdt == d) && (!a.gres || a.gresdt == d);
    if (!one)
        bn_backward_launch<A, BN_MIXED>(c, a, p, sums, s);
    else if (d == MT_F64)
        bn_backward_launch<A, MT_F64>(c, a, p, sums, s);
    else if (d == MT_F16)
        bn_backward_launch<A, MT_F16>(c, a, p, sums, s);
    else if (d == MT_BF16)
        bn_backward_launch<A, MT_BF16>(c, a, p, sums, s);
    else
        bn_backward_launch<A, MT_F32>(c, a, p, sums, s);
}

extern "C" int mt_cuda_batch_norm_backward(const mt_cuda_ctx *c,
                                           const mt_cuda_batch_norm_backward_args *a) {
    if (a->C == 0 || a->N * a->S == 0) return 0;
    if (a->C > 0x7fffffff) return (int)cudaErrorInvalidValue;
    bn_plan p = bn_make_plan(c, a->N, a->C, a->S, a->nhwc);
    bool sums = a->gw || a->gb || (a->gx && a->training);
    bn_scratch s;
    if (!bn_scratch_get(c, p, sums, 3, &s)) return (int)cudaErrorMemoryAllocation;
    if (a->wide)
        bn_backward_dispatch<double>(c, *a, p, sums, s);
    else
        bn_backward_dispatch<float>(c, *a, p, sums, s);
    c->scratch_free(c->device, s.part, s.bytes);
    return (int)cudaGetLastError();
}

// Eval mode's saved statistics: the running mean and 1/sqrt(running var + eps).
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS)
    bn_eval_stats(int64_t C, const void *rm, const void *rv, double eps, void *sm, void *srs) {
    for (int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; ch < C;
         ch += (int64_t)gridDim.x * blockDim.x) {
        ((A *)sm)[ch] = ((const A *)rm)[ch];
        ((A *)srs)[ch] = (A)1 / norm_sqrt(((const A *)rv)[ch] + (A)eps);
    }
}

extern "C" int mt_cuda_bn_eval_stats(const mt_cuda_ctx *c, bool wide, int64_t C, const void *rm,
                                     const void *rv, double eps, void *save_mean, void *save_rstd) {
    if (C == 0) return 0;
    int64_t blocks = (C + NORM_THREADS - 1) / NORM_THREADS;
    unsigned grid = (unsigned)(blocks < 1024 ? blocks : 1024);
    if (wide)
        MT_LAUNCH(bn_eval_stats<double>, grid, NORM_THREADS, 0, c->stream, C, rm, rv, eps,
                  save_mean, save_rstd);
    else
        MT_LAUNCH(bn_eval_stats<float>, grid, NORM_THREADS, 0, c->stream, C, rm, rv, eps, save_mean,
                  save_rstd);
    return (int)cudaGetLastError();
}

// ---------------------------------------------------------------- dropout

// Element i keeps or drops by lane i % 4 of Philox draw i / 4 (the CPU's stream). A warp takes
// 128 consecutive elements per step: lane L makes draw 32 w + L and puts its four lanes in
// shared memory, then handles elements 128 w + 32 k + L (k = 0..3), reading draw lane
// 32 k + L back. Consecutive lanes touch consecutive elements, so every load and store is
// coalesced in any dtype (one thread per draw walking its four elements made each access of a
// warp span four times the sectors), and each draw is made once.
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS)
    dropout_kernel(char *out, const char *x, mt_dtype dt, int64_t n, float p, A scale,
                   uint64_t seed, uint64_t offset) {
    MT_SHARED(uint32_t, draws, NORM_THREADS * 4);
    unsigned lane = threadIdx.x % 32, warps = blockDim.x / 32;
    uint32_t *mine = draws + threadIdx.x / 32 * 128;
    int64_t chunks = (n + 127) / 128;
    for (int64_t w = blockIdx.x * (int64_t)warps + threadIdx.x / 32; w < chunks;
         w += (int64_t)gridDim.x * warps) { // the same trip count for every lane of a warp
        mt_philox_block blk = mt_philox4x32(offset + (uint64_t)(32 * w + lane), seed);
        mine[4 * lane] = blk.v[0];
        mine[4 * lane + 1] = blk.v[1];
        mine[4 * lane + 2] = blk.v[2];
        mine[4 * lane + 3] = blk.v[3];
        __syncwarp();
        MT_UNROLL
        for (int k = 0; k < 4; k++) {
            int64_t i = 128 * w + 32 * k + lane;
            if (i >= n) break;
            bool keep = mt_uint_to_unit_float(mine[32 * k + lane]) >= p;
            A v = mt_load<A>(x, dt, i);
            mt_store<A>(out, dt, i, v * (keep ? scale : (A)0)); // a dropped NaN/inf: NaN
        }
        __syncwarp(); // every lane has read its draws before the next step writes
    }
}

extern "C" int mt_cuda_dropout(const mt_cuda_ctx *c, char *out, const char *x, mt_dtype dt,
                               int64_t n, double p, uint64_t seed, uint64_t offset) {
    if (n == 0) return 0;
    int64_t work = (n + 3) / 4, cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
    int64_t blocks = (work + NORM_THREADS - 1) / NORM_THREADS; // a draw per thread
    unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    if (dt == MT_F64)
        MT_LAUNCH(dropout_kernel<double>, grid, NORM_THREADS, 0, c->stream, out, x, dt, n, (float)p,
                  scale, seed, offset);
    else
        MT_LAUNCH(dropout_kernel<float>, grid, NORM_THREADS, 0, c->stream, out, x, dt, n, (float)p,
                  (float)scale, seed, offset);
    return (int)cudaGetLastError();
}
