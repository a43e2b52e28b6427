/* The CPU kernel table, memory, fill, transfers, random draws and the thread setting. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "../math/half.h"
#include "../math/int_convert.h"
#include "../math/philox.h"
#include "../math/uniform_digits.h"
#include "cpu.h"

/* ---- threads: one setting for our OpenMP regions and OpenBLAS (the OpenMP build shares
   the same pool). */
/* 0: not set yet: OMP_NUM_THREADS where it is set (as torch does), else every core; both
   are what omp_get_max_threads() answers outside a parallel region. Atomic because ops on any
   thread read it while another may call mt_set_num_threads; relaxed loads are plain loads, so the
   hot path pays nothing. */
static atomic_int num_threads;

int mt_cpu_num_threads(void) {
    int n = atomic_load_explicit(&num_threads, memory_order_relaxed);
    if (n <= 0) {
        /* first use: every racing thread computes the same value; a concurrent
           mt_set_num_threads wins because the store below only replaces 0 */
        int zero = 0, initial = omp_get_max_threads();
        if (atomic_compare_exchange_strong_explicit(&num_threads, &zero, initial,
                                                    memory_order_relaxed, memory_order_relaxed))
            n = initial;
        else
            n = zero;
    }
    return n;
}

/* The most threads a team gets: libgomp ends the process when it cannot allocate a team's
   bookkeeping (2^30 threads asked for 240 GB). */
#define MAX_THREADS 1024

void mt_set_num_threads(int n) {
    if (n <= 0) n = omp_get_num_procs();
    int limit = omp_get_thread_limit();
    if (n > MAX_THREADS) n = MAX_THREADS;
    if (limit > 0 && n > limit) n = limit;
    atomic_store_explicit(&num_threads, n, memory_order_relaxed);
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int mt_get_num_threads(void) {
    return mt_cpu_num_threads();
}

static void *cpu_alloc(int index, size_t nbytes) {
    (void)index;
    return mt_host_alloc(nbytes);
}

static void cpu_free(int index, void *p, size_t nbytes) {
    (void)index;
    mt_host_free(p, nbytes);
}

static int cpu_memory_stats(int index, mt_memory_stats *out) {
    (void)index;
    mt_host_memory_stats(out);
    return 0;
}

static void cpu_memory_peak_reset(int index) {
    (void)index;
    mt_host_peak_reset();
}

static int cpu_empty_cache(int index) {
    (void)index;
    mt_empty_cache();
    return 0;
}

/* Transfers: the host buffer seen as a contiguous tensor, for the copy kernel. The buffer
   is used as it is when it is aligned to the element size (the strided kernels move typed
   elements) and apart from t's storage (a copy between overlapping memory would read what
   it already wrote); otherwise the bytes go through an aligned block of our own. */
static bool host_buffer_direct(const void *p, size_t n, const mt_tensor *t) {
    const char *b = p, *s = t->storage ? t->storage->data : NULL;
    if ((uintptr_t)p % mt_dtype_size(t->dtype)) return false;
    return !s || b + n <= s || b >= s + t->storage->nbytes;
}

static void host_view(mt_tensor *h, mt_storage *st, const mt_tensor *like, void *data) {
    *st = (mt_storage){
        .data = data, .device = MT_CPU, .nbytes = (size_t)like->numel * mt_dtype_size(like->dtype)};
    mt_tensor_header_init(h, st, like->dtype, like->ndim, like->shape, NULL, 0);
}

static int cpu_upload(mt_tensor *dst, const void *src) {
    size_t n = (size_t)dst->numel * mt_dtype_size(dst->dtype);
    bool direct = host_buffer_direct(src, n, dst);
    void *own = direct ? NULL : mt_heap_alloc(n ? n : 1);
    if (!direct && !own)
        return mt_error_set(MT_ERR_OOM, "upload: out of memory staging %zu bytes", n);
    if (own) memcpy(own, src, n);
    mt_storage st;
    mt_tensor h;
    host_view(&h, &st, dst, own ? own : (void *)src);
    int rc = mt_cpu_copy(dst, &h);
    free(own);
    return rc;
}

static int cpu_download(const mt_tensor *src, void *dst) {
    size_t n = (size_t)src->numel * mt_dtype_size(src->dtype);
    bool direct = host_buffer_direct(dst, n, src);
    void *own = direct ? NULL : mt_heap_alloc(n ? n : 1);
    if (!direct && !own)
        return mt_error_set(MT_ERR_OOM, "download: out of memory staging %zu bytes", n);
    mt_storage st;
    mt_tensor h;
    host_view(&h, &st, src, own ? own : dst);
    int rc = mt_cpu_copy(&h, src);
    if (rc == 0 && own) memcpy(dst, own, n);
    free(own);
    return rc;
}

static int cpu_fill(mt_tensor *dst, double value) {
    /* one element in the target dtype, then replicate it */
    unsigned char one[8];
    size_t es = mt_dtype_size(dst->dtype);
    switch (dst->dtype) {
    case MT_F32: {
        float v = (float)value;
        memcpy(one, &v, 4);
        break;
    }
    case MT_F64:
        memcpy(one, &value, 8);
        break;
    case MT_F16: {
        uint16_t v = mt_f32_to_f16((float)value);
        memcpy(one, &v, 2);
        break;
    }
    case MT_BF16: {
        uint16_t v = mt_f32_to_bf16((float)value);
        memcpy(one, &v, 2);
        break;
    }
    case MT_I64: {
        int64_t v = mt_f64_to_i64(value);
        memcpy(one, &v, 8);
        break;
    }
    case MT_I32: {
        int32_t v = mt_f64_to_i32(value);
        memcpy(one, &v, 4);
        break;
    }
    case MT_BOOL:
        one[0] = value != 0.0;
        break;
    default:
        return mt_error_set(MT_ERR_DTYPE, "fill: invalid dtype");
    }
    if (dst->dtype == MT_F32 && value == 0.0 && !signbit(value) && mt_is_contiguous(dst)) {
        memset(mt_tensor_data(dst), 0, (size_t)dst->numel * 4);
        return 0;
    }
    mt_storage st = {.data = one, .nbytes = es, .device = MT_CPU};
    mt_tensor src; /* the element broadcast (strides 0) to dst's shape */
    mt_tensor_header_init(&src, &st, dst->dtype, dst->ndim, dst->shape,
                          (const int64_t[MT_MAX_DIMS]){0}, 0);
    return mt_cpu_copy(dst, &src);
}

typedef struct {
    bool normal;
    uint64_t seed, offset;
    mt_dtype dt;
    char *base;
} rand_ctx;

/* Draws b .. b + m - 1 (b a multiple of 4) into buf (room for m + 1): the Philox blocks for
   the whole chunk first, then the per-element formulas of src/math/philox.h on their words,
   normal draws a Box-Muller pair (cos, sin) at a time; both loops vectorise in each x86-64
   level's clone. */
MT_CPU_CLONES static void random_chunk(float *buf, int64_t b, int64_t m, bool normal, int digits,
                                       uint64_t seed, uint64_t offset) {
    uint32_t w[256];
    mt_philox4x32_fill(offset + (uint64_t)b / 4, seed, (m + 3) / 4, w);
    if (normal) {
        for (int64_t i = 0; i < m; i += 2) { /* the pair of lanes (i % 4, i % 4 + 1) */
            float r = mt_box_muller_radius(w[i]), u2 = mt_uint_to_unit_float(w[i + 1]);
            buf[i] = r * mt_sincos_turns_f(u2, 0);
            buf[i + 1] = r * mt_sincos_turns_f(u2, 1);
        }
    } else {
        for (int64_t i = 0; i < m; i++) buf[i] = mt_uint_to_unit_digits(w[i], digits);
    }
}

static int cpu_random(mt_tensor *out, bool normal, uint64_t seed, uint64_t offset) {
    /* out is freshly allocated and contiguous; element i takes draw i */
    int64_t n = out->numel;
    char *base = mt_tensor_data(out);
    mt_dtype dt = out->dtype;
    size_t es = mt_dtype_size(dt);
#pragma omp parallel for if (n > MT_CPU_PARALLEL_MIN / 8) num_threads(mt_cpu_num_threads())
    for (int64_t b = 0; b < n; b += 256) {
        float buf[256];
        int64_t m = n - b < 256 ? n - b : 256;
        random_chunk(buf, b, m, normal, mt_uniform_digits(dt), seed, offset);
        mt_cpu_store_f32(base + b * (int64_t)es, (int64_t)es, dt, m, buf);
    }
    return 0;
}

typedef struct {
    mt_dtype dt;
    int found;
} finite_ctx;

static void finite_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    finite_ctx *c = vctx;
    float buf[256];
    for (int64_t i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        int bad = 0;
        if (c->dt == MT_F64) {
            for (int64_t j = 0; j < m; j++) bad |= !isfinite(*(double *)(p[0] + (i + j) * s[0]));
        } else {
            mt_cpu_load_f32(p[0] + i * s[0], s[0], c->dt, m, buf);
            for (int64_t j = 0; j < m; j++) bad |= !isfinite(buf[j]);
        }
        if (bad) {
#pragma omp atomic write
            c->found = 1;
            return;
        }
    }
}

static int cpu_has_nonfinite(const mt_tensor *t, bool *out) {
    *out = false;
    if (!mt_dtype_is_floating(t->dtype)) return 0;
    const mt_tensor *ops[1] = {t};
    mt_cpu_iter it;
    mt_cpu_iter_init(&it, 1, ops);
    finite_ctx c = {t->dtype, 0};
    mt_cpu_iter_run(&it, finite_row, &c, 1);
    *out = c.found != 0;
    return 0;
}

const mt_backend mt_cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memory_stats = cpu_memory_stats,
    .memory_peak_reset = cpu_memory_peak_reset,
    .empty_cache = cpu_empty_cache,
    .copy = mt_cpu_copy,
    .fill = cpu_fill,
    .upload = cpu_upload,
    .download = cpu_download,
    .unary = mt_cpu_unary,
    .binary = mt_cpu_binary,
    .where = mt_cpu_where,
    .reduce = mt_cpu_reduce,
    .softmax = mt_cpu_softmax,
    .softmax_backward = mt_cpu_softmax_backward,
    .gemm = mt_cpu_gemm,
    .cross_entropy = mt_cpu_cross_entropy,
    .cross_entropy_backward = mt_cpu_cross_entropy_backward,
    .conv2d = mt_cpu_conv2d,
    .conv2d_backward_data = mt_cpu_conv2d_backward_data,
    .conv2d_backward_weight = mt_cpu_conv2d_backward_weight,
    .pool2d = mt_cpu_pool2d,
    .pool2d_backward = mt_cpu_pool2d_backward,
    .random = cpu_random,
    .has_nonfinite = cpu_has_nonfinite,
    .unscale = mt_cpu_unscale,
    .scale_update = mt_cpu_scale_update,
    .optim_step = mt_cpu_optim_step,
    .sq_norm = mt_cpu_sq_norm,
    .layer_norm = mt_cpu_layer_norm,
    .layer_norm_backward = mt_cpu_layer_norm_backward,
    .batch_norm = mt_cpu_batch_norm,
    .batch_norm_backward = mt_cpu_batch_norm_backward,
    .dropout = mt_cpu_dropout,
    .index_select = mt_cpu_index_select,
    .index_add = mt_cpu_index_add,
    .gather = mt_cpu_gather,
    .scatter_add = mt_cpu_scatter_add,
    .argmax = mt_cpu_argmax,
    .gemm_epilogue = mt_cpu_gemm_epilogue,
    .batch_norm_nhwc = true,
    .max_pool_indices = true,
};
