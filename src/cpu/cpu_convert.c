/* Dtype conversion of strided runs, and the copy kernel built on it. Low-precision storage
   goes through FP32 registers. The contiguous F16/BF16 conversions have F16C/AVX2 and
   AVX-512 versions that are compiled in every x86-64 build (target attributes) and chosen at
   run time from the CPU's features, so a portable build (-Dnative=false) runs them where the
   CPU has them; every version gives the same bits (the vector code rounds as src/math). */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MT_X86_DISPATCH 1
#endif
#include "../math/half.h"
#include "../math/int_convert.h"
#include "cpu.h"

static void f16_to_f32_scalar(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(src[i]);
}
static void f32_to_f16_scalar(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_f32_to_f16(src[i]);
}
static void bf16_to_f32_scalar(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(src[i]);
}
static void f32_to_bf16_scalar(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_f32_to_bf16(src[i]);
}

#if defined(MT_X86_DISPATCH)
#define MT_TARGET_AVX2 __attribute__((target("avx2,f16c")))

MT_TARGET_AVX2 static void f16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    f16_to_f32_scalar(src + i, dst + i, n - i);
}

/* F16C keeps a NaN's payload where mt_f32_to_f16 (and torch) give sign | 0x7e00: a block
   with a NaN is redone by the scalar function, so every path gives the same bits. */
MT_TARGET_AVX2 static void f32_to_f16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            f32_to_f16_scalar(src + i, dst + i, 8);
    }
    f32_to_f16_scalar(src + i, dst + i, n - i);
}

/* BF16 is the top half of an FP32: widening is a shift; narrowing rounds to nearest even
   (and keeps NaN a NaN) exactly as mt_f32_to_bf16, eight lanes at a time. */
MT_TARGET_AVX2 static void bf16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    bf16_to_f32_scalar(src + i, dst + i, n - i);
}

MT_TARGET_AVX2 static void f32_to_bf16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), nan);
        r = _mm256_srli_epi32(r, 16); /* 8 x u32 holding 16-bit values */
        __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi32(lo, hi));
    }
    f32_to_bf16_scalar(src + i, dst + i, n - i);
}

/* The same four conversions sixteen lanes at a time, where the CPU has AVX-512 (the
   conversions of cached rows, in the norm kernels' passes, are bound by these instructions
   rather than by memory: batch norm's BF16 channels-last pass spends half its time here).
   Not vcvtneps2bf16: it flushes subnormal inputs to zero, which src/math does not. */
#define MT_TARGET_AVX512 __attribute__((target("avx512f,avx2,f16c")))

MT_TARGET_AVX512 static void f16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    f16_to_f32_avx2(src + i, dst + i, n - i);
}

MT_TARGET_AVX512 static void f32_to_f16_avx512(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(src + i);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) /* NaN payloads: as the AVX2 version */
            f32_to_f16_scalar(src + i, dst + i, 16);
    }
    f32_to_f16_avx2(src + i, dst + i, n - i);
}

MT_TARGET_AVX512 static void bf16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
    }
    bf16_to_f32_avx2(src + i, dst + i, n - i);
}

MT_TARGET_AVX512 static void f32_to_bf16_avx512(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x00400000);
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(u, quiet));
        /* the high halves, each below 2^16: narrowing by truncation is exact */
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    f32_to_bf16_avx2(src + i, dst + i, n - i);
}

/* The widest versions this CPU runs: 3 AVX-512, 2 AVX2/F16C, 1 scalar. MT_CPU_ISA=generic
   forces the scalar ones and MT_CPU_ISA=avx2 caps them at AVX2 (to test every version on a
   machine that has them all). Read once. */
static int conversion_level(void) {
    /* 0 unknown. Threads that race to fill it in compute the same answer; the atomic makes
       that race defined (relaxed: nothing else is published with it). */
    static atomic_int state;
    int known = atomic_load_explicit(&state, memory_order_relaxed);
    if (!known) {
        const char *isa = getenv("MT_CPU_ISA");
        int cap = isa && strcmp(isa, "generic") == 0 ? 1 : isa && strcmp(isa, "avx2") == 0 ? 2 : 3;
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? 2 : 1;
        if (known == 2 && __builtin_cpu_supports("avx512f")) known = 3;
        if (known > cap) known = cap;
        atomic_store_explicit(&state, known, memory_order_relaxed);
    }
    return known;
}
#define DISPATCH(name, ...)                                                                        \
    (conversion_level() == 3   ? name##_avx512(__VA_ARGS__)                                        \
     : conversion_level() == 2 ? name##_avx2(__VA_ARGS__)                                          \
                               : name##_scalar(__VA_ARGS__))
#else
#define DISPATCH(name, ...) name##_scalar(__VA_ARGS__)
#endif

bool mt_cpu_has_avx2(void) {
#if defined(MT_X86_DISPATCH)
    return conversion_level() >= 2;
#else
    return false;
#endif
}

void mt_cpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    DISPATCH(f16_to_f32, src, dst, n);
}
void mt_cpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    DISPATCH(f32_to_f16, src, dst, n);
}
void mt_cpu_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    DISPATCH(bf16_to_f32, src, dst, n);
}
void mt_cpu_f32_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    DISPATCH(f32_to_bf16, src, dst, n);
}

#define AT(T, p, i, s)   (*(const T *)((p) + (i) * (s)))
#define AT_W(T, p, i, s) (*(T *)((p) + (i) * (s)))

/* The integer and bool cases, the same for FP32 and FP64 registers (T): loads convert,
   stores truncate toward zero, bool is "not zero". */
#define LOAD_INT_CASES(T)                                                                          \
    case MT_I64:                                                                                   \
        for (int64_t i = 0; i < n; i++) dst[i] = (T)AT(int64_t, src, i, s);                        \
        break;                                                                                     \
    case MT_I32:                                                                                   \
        for (int64_t i = 0; i < n; i++) dst[i] = (T)AT(int32_t, src, i, s);                        \
        break;                                                                                     \
    case MT_BOOL:                                                                                  \
        for (int64_t i = 0; i < n; i++) dst[i] = AT(uint8_t, src, i, s) ? (T)1 : (T)0;             \
        break;
#define STORE_INT_CASES                                                                            \
    case MT_I64:                                                                                   \
        for (int64_t i = 0; i < n; i++) AT_W(int64_t, dst, i, s) = mt_f64_to_i64((double)src[i]);  \
        break;                                                                                     \
    case MT_I32:                                                                                   \
        for (int64_t i = 0; i < n; i++) AT_W(int32_t, dst, i, s) = mt_f64_to_i32((double)src[i]);  \
        break;                                                                                     \
    case MT_BOOL:                                                                                  \
        for (int64_t i = 0; i < n; i++) AT_W(uint8_t, dst, i, s) = src[i] != 0;                    \
        break;

void mt_cpu_load_f32(const char *src, int64_t s, mt_dtype dt, int64_t n, float *dst) {
    switch (dt) {
    case MT_F32:
        if (s == 4)
            memcpy(dst, src, (size_t)n * 4);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = AT(float, src, i, s);
        break;
    case MT_F16:
        if (s == 2)
            mt_cpu_f16_to_f32((const uint16_t *)src, dst, n);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(AT(uint16_t, src, i, s));
        break;
    case MT_BF16:
        if (s == 2)
            mt_cpu_bf16_to_f32((const uint16_t *)src, dst, n);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(AT(uint16_t, src, i, s));
        break;
    case MT_F64:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)AT(double, src, i, s);
        break;
        LOAD_INT_CASES(float)
    default:
        break;
    }
}

void mt_cpu_store_f32(char *dst, int64_t s, mt_dtype dt, int64_t n, const float *src) {
    switch (dt) {
    case MT_F32:
        if (s == 4)
            memcpy(dst, src, (size_t)n * 4);
        else
            for (int64_t i = 0; i < n; i++) AT_W(float, dst, i, s) = src[i];
        break;
    case MT_F16:
        if (s == 2)
            mt_cpu_f32_to_f16(src, (uint16_t *)dst, n);
        else
            for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_f16(src[i]);
        break;
    case MT_BF16:
        if (s == 2)
            mt_cpu_f32_to_bf16(src, (uint16_t *)dst, n);
        else
            for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_bf16(src[i]);
        break;
    case MT_F64:
        for (int64_t i = 0; i < n; i++) AT_W(double, dst, i, s) = src[i];
        break;
        STORE_INT_CASES
    default:
        break;
    }
}

void mt_cpu_load_f64(const char *src, int64_t s, mt_dtype dt, int64_t n, double *dst) {
    switch (dt) {
    case MT_F64:
        if (s == 8)
            memcpy(dst, src, (size_t)n * 8);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = AT(double, src, i, s);
        break;
    case MT_F32:
        for (int64_t i = 0; i < n; i++) dst[i] = AT(float, src, i, s);
        break;
    case MT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(AT(uint16_t, src, i, s));
        break;
    case MT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(AT(uint16_t, src, i, s));
        break;
        LOAD_INT_CASES(double)
    default:
        break;
    }
}

void mt_cpu_store_f64(char *dst, int64_t s, mt_dtype dt, int64_t n, const double *src) {
    switch (dt) {
    case MT_F64:
        if (s == 8)
            memcpy(dst, src, (size_t)n * 8);
        else
            for (int64_t i = 0; i < n; i++) AT_W(double, dst, i, s) = src[i];
        break;
    case MT_F32:
        for (int64_t i = 0; i < n; i++) AT_W(float, dst, i, s) = (float)src[i];
        break;
    case MT_F16:
        /* double -> f16 through f32 can double-round; the f32 step is exact for |x| in f16
           range only up to a tie, which matches torch's behaviour for .half() on doubles */
        for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_f16((float)src[i]);
        break;
    case MT_BF16:
        for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_bf16((float)src[i]);
        break;
        STORE_INT_CASES
    default:
        break;
    }
}

/* ---- copy kernel */
typedef struct {
    mt_dtype dst, src;
} copy_ctx;

#define BLOCK 512

/* Same-dtype strided run, with the element size known to the compiler. */
#define STRIDED_COPY(T)                                                                            \
    for (int64_t i = 0; i < n; i++) *(T *)(p[0] + i * s[0]) = *(const T *)(p[1] + i * s[1]);

/* Between integer dtypes (I64, I32, BOOL) in integers: a double would lose I64 values above
   2^53, and an I64 out of I32's range wraps as torch's cast does. */
static void int_copy_row(char **p, const int64_t *s, int64_t n, const copy_ctx *c) {
    for (int64_t i = 0; i < n; i++) {
        const char *from = p[1] + i * s[1];
        char *to = p[0] + i * s[0];
        int64_t v = c->src == MT_I64   ? *(const int64_t *)from
                    : c->src == MT_I32 ? *(const int32_t *)from
                                       : *(const uint8_t *)from != 0;
        if (c->dst == MT_I64)
            *(int64_t *)to = v;
        else if (c->dst == MT_I32)
            *(int32_t *)to = mt_i64_to_i32(v);
        else
            *(uint8_t *)to = v != 0;
    }
}

static void copy_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const copy_ctx *c = vctx;
    int64_t es = (int64_t)mt_dtype_size(c->dst), ss = (int64_t)mt_dtype_size(c->src);
    if (c->dst == c->src) {
        if (s[0] == es && s[1] == es) {
            memcpy(p[0], p[1], (size_t)(n * es));
            return;
        }
        switch (es) {
        case 1:
            STRIDED_COPY(uint8_t) break;
        case 2:
            STRIDED_COPY(uint16_t) break;
        case 4:
            STRIDED_COPY(uint32_t) break;
        default:
            STRIDED_COPY(uint64_t) break;
        }
        return;
    }
    if (s[0] == es && s[1] == ss) { /* contiguous FP32 <-> F16/BF16 straight into dst */
        if (c->src == MT_F32 && c->dst == MT_F16) {
            mt_cpu_f32_to_f16((const float *)p[1], (uint16_t *)p[0], n);
            return;
        }
        if (c->src == MT_F32 && c->dst == MT_BF16) {
            mt_cpu_f32_to_bf16((const float *)p[1], (uint16_t *)p[0], n);
            return;
        }
        if (c->src == MT_F16 && c->dst == MT_F32) {
            mt_cpu_f16_to_f32((const uint16_t *)p[1], (float *)p[0], n);
            return;
        }
        if (c->src == MT_BF16 && c->dst == MT_F32) {
            mt_cpu_bf16_to_f32((const uint16_t *)p[1], (float *)p[0], n);
            return;
        }
    }
    if (!mt_dtype_is_floating(c->src) && !mt_dtype_is_floating(c->dst)) {
        int_copy_row(p, s, n, c);
        return;
    }
    /* the wide path when either side is F64; an integer goes to F32 in one rounding (as C's
       and torch's (float)v: through a double, a large I64 was rounded twice), and on to
       F16/BF16 through that float, as torch's c10::Half(v) */
    bool wide = c->dst == MT_F64 || c->src == MT_F64;
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        if (wide) {
            double buf[BLOCK];
            mt_cpu_load_f64(p[1] + i * s[1], s[1], c->src, m, buf);
            mt_cpu_store_f64(p[0] + i * s[0], s[0], c->dst, m, buf);
        } else {
            float buf[BLOCK];
            mt_cpu_load_f32(p[1] + i * s[1], s[1], c->src, m, buf);
            mt_cpu_store_f32(p[0] + i * s[0], s[0], c->dst, m, buf);
        }
    }
}

/* A 2-D same-dtype copy whose source walks its inner dim with a large stride (a transpose):
   done in square tiles, so that both sides stay in cache; rows of tiles in parallel. */
#define TILE 32
#define TILED_COPY(T)                                                                              \
    for (int64_t i = i0; i < i1; i++) {                                                            \
        T *drow = (T *)(d + i * ds0);                                                              \
        const char *scol = sp + i * ss0;                                                           \
        for (int64_t j = j0; j < j1; j++) drow[j] = *(const T *)(scol + j * ss1);                  \
    }

static void copy_tiles(const mt_cpu_iter *it, int64_t es, int64_t ib_begin, int64_t ib_end) {
    int64_t rows = it->shape[0], cols = it->shape[1];
    char *d = it->data[0];
    const char *sp = it->data[1];
    int64_t ds0 = it->strides[0][0]; /* the destination's inner stride is the element size */
    int64_t ss0 = it->strides[1][0], ss1 = it->strides[1][1];
    for (int64_t ib = ib_begin; ib < ib_end; ib++) {
        int64_t i0 = ib * TILE, i1 = i0 + TILE < rows ? i0 + TILE : rows;
        for (int64_t j0 = 0; j0 < cols; j0 += TILE) {
            int64_t j1 = j0 + TILE < cols ? j0 + TILE : cols;
            switch (es) {
            case 1:
                TILED_COPY(uint8_t) break;
            case 2:
                TILED_COPY(uint16_t) break;
            case 4:
                TILED_COPY(uint32_t) break;
            default:
                TILED_COPY(uint64_t) break;
            }
        }
    }
}

static bool transposed_2d(const mt_cpu_iter *it, int64_t es) {
    if (it->ndim != 2 || it->shape[0] < TILE || it->shape[1] < TILE) return false;
    /* the destination's inner dim is dense, the source's is not but its outer dim is */
    return it->strides[0][1] == es && it->strides[1][1] != es && it->strides[1][0] == es;
}

int mt_cpu_copy(mt_tensor *dst, const mt_tensor *src) {
    const mt_tensor *ops[2] = {dst, src};
    mt_cpu_iter it;
    mt_cpu_iter_init(&it, 2, ops);
    int64_t es = (int64_t)mt_dtype_size(dst->dtype);
    if (dst->dtype == src->dtype && transposed_2d(&it, es)) {
        int64_t nb = (it.shape[0] + TILE - 1) / TILE;
        int threads = it.numel < MT_CPU_PARALLEL_MIN ? 1 : mt_cpu_num_threads();
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            int64_t per = (nb + nt - 1) / nt, b = per * id, e = b + per < nb ? b + per : nb;
            if (b < e) copy_tiles(&it, es, b, e);
        }
        return 0;
    }
    copy_ctx c = {dst->dtype, src->dtype};
    mt_cpu_iter_run(&it, copy_row, &c, 1);
    return 0;
}

float *mt_cpu_to_f32_buffer(const char *op, const mt_tensor *t) {
    float *buf = mt_host_alloc((size_t)t->numel * sizeof(float));
    if (!buf) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory converting %lld elements to f32", op,
                     (long long)t->numel);
        return NULL;
    }
    mt_storage st = {.data = buf, .nbytes = (size_t)t->numel * 4, .device = MT_CPU};
    mt_tensor view; /* the buffer as a contiguous F32 tensor, for the copy kernel */
    mt_tensor_header_init(&view, &st, MT_F32, t->ndim, t->shape, NULL, 0);
    mt_cpu_copy(&view, t);
    return buf;
}
