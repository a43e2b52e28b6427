// Layer norm, batch norm (with the fused residual + ReLU) and dropout on the device, the
// formulas of the CPU kernels (cpu_layer_norm_impl.h, cpu_batch_norm_impl.h, cpu_dropout.c)
// with the sums as block trees instead of loops:
// - layer norm: a block per row; the row is shifted by its first value k, so that neither
//   the variance nor x - mean cancels when |mean| >> std; the weight and bias gradients are
//   column sums over the rows, a thread per column in row order;
// - batch norm: a block per channel, sums of the shifted values in double as on the CPU;
//   running statistics updated by the block's thread 0;
// - dropout: a thread per Philox block of four elements, the mask a pure function of (seed,
//   offset, flat index) exactly as on the CPU, so both devices drop the same elements.
// Trees have a fixed shape for a launch: results are reproducible, with no float atomics.
#include "cuda_compat.h"
#include <math.h>
#include "element_access.cuh"
#include "../math/norm_math.h"
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

// Element (n, ch, s) of an [N, C, S] contiguous tensor, or of its dense NHWC form.
MT_DEV int64_t bn_index(int64_t C, int64_t S, bool nhwc, int64_t n, int64_t ch, int64_t s) {
    return nhwc ? (n * S + s) * C + ch : (n * C + ch) * S + s;
}
MT_DEV int64_t bn_index(const mt_cuda_batch_norm_args &a, int64_t n, int64_t ch, int64_t s) {
    return bn_index(a.C, a.S, a.nhwc, n, ch, s);
}

template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) bn_forward(mt_cuda_batch_norm_args a) {
    MT_SHARED(double, sm, 32);
    int64_t ch = blockIdx.x, M = a.N * a.S;
    const A *w = (const A *)a.weight, *b = (const A *)a.bias;
    A *rm = (A *)a.running_mean, *rv = (A *)a.running_var;
    A k, md = 0, mean, var;
    if (a.training) {
        k = mt_load<A>(a.x, a.xdt, bn_index(a, 0, ch, 0));
        double s1 = 0, s2 = 0;
        for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
            A d = mt_load<A>(a.x, a.xdt, bn_index(a, i / a.S, ch, i % a.S)) - k;
            s1 += (double)d;
            s2 += (double)(d * d);
        }
        s1 = norm_block_sum(s1, sm);
        s2 = norm_block_sum(s2, sm);
        mt_bn_moments m = mt_bn_moments_from_sums(s1, s2, (double)k, M);
        md = (A)m.shifted_mean;
        mean = (A)m.mean;
        var = (A)m.var;
        if (rm && threadIdx.x == 0) {
            rm[ch] = (A)mt_bn_running_mean((double)rm[ch], (double)mean, a.momentum);
            rv[ch] = (A)mt_bn_running_var((double)rv[ch], (double)var, M, a.momentum);
        }
    } else {
        mean = k = rm[ch];
        var = rv[ch];
    }
    A rs = (A)1 / norm_sqrt(var + (A)a.eps);
    if (threadIdx.x == 0) {
        ((A *)a.save_mean)[ch] = mean;
        ((A *)a.save_rstd)[ch] = rs;
    }
    A scale = w ? w[ch] * rs : rs, shift = b ? b[ch] : (A)0;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
        int64_t e = bn_index(a, i / a.S, ch, i % a.S);
        A y = ((mt_load<A>(a.x, a.xdt, e) - k) - md) * scale + shift;
        if (a.residual) y += mt_load<A>(a.residual, a.xdt, e);
        if (a.relu) y = y < 0 ? (A)0 : y; // NaN propagates, as torch's relu
        mt_store<A>(a.y, a.xdt, e, y);
    }
}

// gz = gy, masked by y > 0 under relu
template <typename A> MT_DEV A bn_gz(const mt_cuda_batch_norm_backward_args &a, int64_t e) {
    A g = mt_load<A>(a.gy, a.gydt, e);
    if (a.y && !(mt_load<A>(a.y, a.xdt, e) > 0)) g = 0;
    return g;
}

template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) bn_backward(mt_cuda_batch_norm_backward_args a) {
    MT_SHARED(double, sm, 32);
    int64_t ch = blockIdx.x, M = a.N * a.S;
    const A *w = (const A *)a.weight;
    A mean = ((const A *)a.save_mean)[ch], rs = ((const A *)a.save_rstd)[ch];
    double sg = 0, sgx = 0;
    if (a.gw || a.gb || (a.gx && a.training)) {
        for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
            int64_t e = bn_index(a.C, a.S, a.nhwc, i / a.S, ch, i % a.S);
            A g = bn_gz<A>(a, e);
            sg += (double)g;
            sgx += (double)(g * ((mt_load<A>(a.x, a.xdt, e) - mean) * rs));
        }
        sg = norm_block_sum(sg, sm);
        sgx = norm_block_sum(sgx, sm);
    }
    if (threadIdx.x == 0) {
        if (a.gw) ((A *)a.gw)[ch] = (A)sgx;
        if (a.gb) ((A *)a.gb)[ch] = (A)sg;
    }
    if (!a.gx && !a.gres) return;
    A k = (w ? w[ch] : (A)1) * rs;
    A mg = a.training ? (A)(sg / (double)M) : (A)0;
    A mgx = a.training ? (A)(sgx / (double)M) : (A)0;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
        int64_t e = bn_index(a.C, a.S, a.nhwc, i / a.S, ch, i % a.S);
        A g = bn_gz<A>(a, e);
        if (a.gres) mt_store<A>(a.gres, a.gresdt, e, g);
        if (a.gx)
            mt_store<A>(a.gx, a.gxdt, e,
                        k * (g - mg - (mt_load<A>(a.x, a.xdt, e) - mean) * rs * mgx));
    }
}

extern "C" int mt_cuda_batch_norm(const mt_cuda_ctx *c, const mt_cuda_batch_norm_args *a) {
    if (a->C == 0) return 0;
    if (a->C > 0x7fffffff) return (int)cudaErrorInvalidValue;
    if (a->wide)
        MT_LAUNCH(bn_forward<double>, (unsigned)a->C, NORM_THREADS, 0, c->stream, *a);
    else
        MT_LAUNCH(bn_forward<float>, (unsigned)a->C, NORM_THREADS, 0, c->stream, *a);
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

extern "C" int mt_cuda_batch_norm_backward(const mt_cuda_ctx *c,
                                           const mt_cuda_batch_norm_backward_args *a) {
    if (a->C == 0) return 0;
    if (a->C > 0x7fffffff) return (int)cudaErrorInvalidValue;
    if (a->wide)
        MT_LAUNCH(bn_backward<double>, (unsigned)a->C, NORM_THREADS, 0, c->stream, *a);
    else
        MT_LAUNCH(bn_backward<float>, (unsigned)a->C, NORM_THREADS, 0, c->stream, *a);
    return (int)cudaGetLastError();
}

// ---------------------------------------------------------------- dropout

// Thread per Philox block: elements 4q .. 4q + 3 use the four lanes of draw q.
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS)
    dropout_kernel(char *out, const char *x, mt_dtype dt, int64_t n, float p, A scale,
                   uint64_t seed, uint64_t offset) {
    int64_t blocks = (n + 3) / 4;
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < blocks;
         q += (int64_t)gridDim.x * blockDim.x) {
        mt_philox_block blk = mt_philox4x32(offset + (uint64_t)q, seed);
        // lanes by constant index (a variable one would put blk in local memory)
        uint32_t lanes[4] = {blk.v[0], blk.v[1], blk.v[2], blk.v[3]};
        MT_UNROLL
        for (int l = 0; l < 4; l++) {
            int64_t i = 4 * q + l;
            if (i >= n) break;
            bool keep = mt_uint_to_unit_float(lanes[l]) >= p;
            A v = mt_load<A>(x, dt, i);
            mt_store<A>(out, dt, i, keep ? v * scale : (A)0);
        }
    }
}

extern "C" int mt_cuda_dropout(const mt_cuda_ctx *c, char *out, const char *x, mt_dtype dt,
                               int64_t n, double p, uint64_t seed, uint64_t offset) {
    if (n == 0) return 0;
    int64_t work = (n + 3) / 4, cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
    int64_t blocks = (work + NORM_THREADS - 1) / NORM_THREADS;
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
