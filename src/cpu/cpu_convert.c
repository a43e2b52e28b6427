/* Dtype conversion of strided runs, and the copy kernel built on it. Low-precision storage
   goes through FP32 registers; F16 uses the F16C instructions when the build targets them. */
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include "../math/half.h"
#include "cpu.h"

void mt_cpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = mt_f16_to_f32(src[i]);
}

void mt_cpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = mt_f32_to_f16(src[i]);
}

void mt_cpu_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(src[i]);
}

void mt_cpu_f32_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_f32_to_bf16(src[i]);
}

#define AT(T, p, i, s) (*(const T *)((p) + (i) * (s)))
#define AT_W(T, p, i, s) (*(T *)((p) + (i) * (s)))

void mt_cpu_load_f32(const char *src, int64_t s, mt_dtype dt, int64_t n, float *dst) {
    switch (dt) {
    case MT_F32:
        if (s == 4) memcpy(dst, src, (size_t)n * 4);
        else for (int64_t i = 0; i < n; i++) dst[i] = AT(float, src, i, s);
        break;
    case MT_F16:
        if (s == 2) mt_cpu_f16_to_f32((const uint16_t *)src, dst, n);
        else for (int64_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(AT(uint16_t, src, i, s));
        break;
    case MT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(AT(uint16_t, src, i, s));
        break;
    case MT_F64: for (int64_t i = 0; i < n; i++) dst[i] = (float)AT(double, src, i, s); break;
    case MT_I64: for (int64_t i = 0; i < n; i++) dst[i] = (float)AT(int64_t, src, i, s); break;
    case MT_I32: for (int64_t i = 0; i < n; i++) dst[i] = (float)AT(int32_t, src, i, s); break;
    case MT_BOOL: for (int64_t i = 0; i < n; i++) dst[i] = AT(uint8_t, src, i, s) ? 1.0f : 0.0f; break;
    default: break;
    }
}

void mt_cpu_store_f32(char *dst, int64_t s, mt_dtype dt, int64_t n, const float *src) {
    switch (dt) {
    case MT_F32:
        if (s == 4) memcpy(dst, src, (size_t)n * 4);
        else for (int64_t i = 0; i < n; i++) AT_W(float, dst, i, s) = src[i];
        break;
    case MT_F16:
        if (s == 2) mt_cpu_f32_to_f16(src, (uint16_t *)dst, n);
        else for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_f16(src[i]);
        break;
    case MT_BF16:
        for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_bf16(src[i]);
        break;
    case MT_F64: for (int64_t i = 0; i < n; i++) AT_W(double, dst, i, s) = src[i]; break;
    case MT_I64: for (int64_t i = 0; i < n; i++) AT_W(int64_t, dst, i, s) = (int64_t)src[i]; break;
    case MT_I32: for (int64_t i = 0; i < n; i++) AT_W(int32_t, dst, i, s) = (int32_t)src[i]; break;
    case MT_BOOL: for (int64_t i = 0; i < n; i++) AT_W(uint8_t, dst, i, s) = src[i] != 0.0f; break;
    default: break;
    }
}

void mt_cpu_load_f64(const char *src, int64_t s, mt_dtype dt, int64_t n, double *dst) {
    switch (dt) {
    case MT_F64:
        if (s == 8) memcpy(dst, src, (size_t)n * 8);
        else for (int64_t i = 0; i < n; i++) dst[i] = AT(double, src, i, s);
        break;
    case MT_F32: for (int64_t i = 0; i < n; i++) dst[i] = AT(float, src, i, s); break;
    case MT_F16: for (int64_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(AT(uint16_t, src, i, s)); break;
    case MT_BF16: for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(AT(uint16_t, src, i, s)); break;
    case MT_I64: for (int64_t i = 0; i < n; i++) dst[i] = (double)AT(int64_t, src, i, s); break;
    case MT_I32: for (int64_t i = 0; i < n; i++) dst[i] = AT(int32_t, src, i, s); break;
    case MT_BOOL: for (int64_t i = 0; i < n; i++) dst[i] = AT(uint8_t, src, i, s) ? 1.0 : 0.0; break;
    default: break;
    }
}

void mt_cpu_store_f64(char *dst, int64_t s, mt_dtype dt, int64_t n, const double *src) {
    switch (dt) {
    case MT_F64:
        if (s == 8) memcpy(dst, src, (size_t)n * 8);
        else for (int64_t i = 0; i < n; i++) AT_W(double, dst, i, s) = src[i];
        break;
    case MT_F32: for (int64_t i = 0; i < n; i++) AT_W(float, dst, i, s) = (float)src[i]; break;
    case MT_F16:
        /* double -> f16 through f32 can double-round; the f32 step is exact for |x| in f16
           range only up to a tie, which matches torch's behaviour for .half() on doubles */
        for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_f16((float)src[i]);
        break;
    case MT_BF16:
        for (int64_t i = 0; i < n; i++) AT_W(uint16_t, dst, i, s) = mt_f32_to_bf16((float)src[i]);
        break;
    case MT_I64: for (int64_t i = 0; i < n; i++) AT_W(int64_t, dst, i, s) = (int64_t)src[i]; break;
    case MT_I32: for (int64_t i = 0; i < n; i++) AT_W(int32_t, dst, i, s) = (int32_t)src[i]; break;
    case MT_BOOL: for (int64_t i = 0; i < n; i++) AT_W(uint8_t, dst, i, s) = src[i] != 0.0; break;
    default: break;
    }
}

/* ---- copy kernel */
typedef struct {
    mt_dtype dst, src;
} copy_ctx;

#define BLOCK 512

static void copy_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const copy_ctx *c = vctx;
    size_t es = mt_dtype_size(c->dst);
    if (c->dst == c->src) {
        if (s[0] == (int64_t)es && s[1] == (int64_t)es) {
            memcpy(p[0], p[1], (size_t)n * es);
            return;
        }
        for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], p[1] + i * s[1], es);
        return;
    }
    /* wide path when either side needs more than FP32 holds */
    bool wide = c->dst == MT_F64 || c->src == MT_F64 || c->src == MT_I64 || c->src == MT_I32;
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

int mt_cpu_copy(mt_tensor *dst, const mt_tensor *src) {
    const mt_tensor *ops[2] = {dst, src};
    mt_cpu_iter it;
    mt_cpu_iter_init(&it, 2, ops);
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
    mt_tensor view = *t; /* a header over the buffer, for the copy kernel */
    mt_storage st = {.data = buf, .nbytes = (size_t)t->numel * 4, .device = MT_CPU};
    view.storage = &st;
    view.dtype = MT_F32;
    view.offset = 0;
    mt_contiguous_strides(t->ndim, t->shape, view.strides);
    mt_cpu_copy(&view, t);
    return buf;
}
