/* FP32 run kernels shared by the reductions and softmax, written so that GCC vectorises
   them: a sum in MT_CPU_LANES FP32 lanes over blocks of MT_CPU_SUM_BLOCK elements with the
   block totals added in double (long runs stay accurate), a dot product blocked the same
   way, and a max whose select propagates NaN. Include this after the file's
   `#pragma GCC optimize("no-trapping-math")`: under trapping math GCC does not if-convert
   the max select, and the max loop stays scalar. */
#ifndef MT_CPU_VEC_H
#define MT_CPU_VEC_H
#include <stdint.h>
#include "cpu.h" /* MT_CPU_CLONES */

#define MT_CPU_LANES     16
#define MT_CPU_SUM_BLOCK 4096 /* elements per FP32 lane block before the total goes to double */
#define MT_CPU_MAX_LANES 64

/* Plain static functions, not inline: GCC then inlines or calls them as it did when each
   file had its own copy (inlining the sum and max into the reduction's run loop measured
   5-10% slower). Unused in some files. Compiled for each x86-64 level (MT_CPU_CLONES, from
   cpu.h): their fixed lane order gives every clone the same bits, and a baseline-only copy
   would run SSE2 loops on every CPU. */
#define MT_CPU_VEC_FN MT_CPU_CLONES static __attribute__((unused))

/* max(m, x), NaN propagates */
static inline float mt_cpu_maxf(float m, float x) {
    return (x > m || x != x) ? x : m;
}

/* Sum of a contiguous float run. */
MT_CPU_VEC_FN double mt_cpu_sum_f32(const float *restrict x, int64_t n) {
    double total = 0;
    for (int64_t b = 0; b < n; b += MT_CPU_SUM_BLOCK) {
        int64_t m = n - b < MT_CPU_SUM_BLOCK ? n - b : MT_CPU_SUM_BLOCK;
        const float *restrict p = x + b;
        float acc[MT_CPU_LANES] = {0};
        int64_t i = 0;
        for (; i + MT_CPU_LANES <= m; i += MT_CPU_LANES)
            for (int j = 0; j < MT_CPU_LANES; j++) acc[j] += p[i + j];
        float tail = 0;
        for (; i < m; i++) tail += p[i];
        for (int w = MT_CPU_LANES / 2; w > 0; w /= 2) /* pairwise over the lanes */
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        total += (double)acc[0] + (double)tail;
    }
    return total;
}

/* Sum of x[i] * y[i] over contiguous float runs, blocked like mt_cpu_sum_f32. */
MT_CPU_VEC_FN double mt_cpu_dot_f32(const float *restrict x, const float *restrict y, int64_t n) {
    double total = 0;
    for (int64_t b = 0; b < n; b += MT_CPU_SUM_BLOCK) {
        int64_t m = n - b < MT_CPU_SUM_BLOCK ? n - b : MT_CPU_SUM_BLOCK;
        float acc[MT_CPU_LANES] = {0};
        int64_t i = 0;
        for (; i + MT_CPU_LANES <= m; i += MT_CPU_LANES)
            for (int j = 0; j < MT_CPU_LANES; j++) acc[j] += x[b + i + j] * y[b + i + j];
        float tail = 0;
        for (; i < m; i++) tail += x[b + i] * y[b + i];
        for (int w = MT_CPU_LANES / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        total += (double)acc[0] + (double)tail;
    }
    return total;
}

/* max(m0, x[0..n)) with the NaN test in every lane's select: the exact definition, used
   when a NaN is present. The lanes are held in an array so that the loop vectoriser (not
   SLP) takes the select with its NaN test. */
MT_CPU_VEC_FN float mt_cpu_max_f32_nan(const float *restrict x, int64_t n, float m0) {
    float acc[MT_CPU_MAX_LANES];
    for (int j = 0; j < MT_CPU_MAX_LANES; j++) acc[j] = m0;
    int64_t i = 0;
    for (; i + MT_CPU_MAX_LANES <= n; i += MT_CPU_MAX_LANES)
        for (int j = 0; j < MT_CPU_MAX_LANES; j++) acc[j] = mt_cpu_maxf(acc[j], x[i + j]);
    /* the lanes folded pairwise, in vectors: a chain of 64 dependent maxes took as long as
       the loop over a row of a thousand */
    for (int w = MT_CPU_MAX_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] = mt_cpu_maxf(acc[j], acc[j + w]);
    float m = acc[0];
    for (; i < n; i++) m = mt_cpu_maxf(m, x[i]);
    return m;
}

/* max(m0, x[0..n)), NaN propagating. The lanes take a plain `x > m ? x : m` (one max
   instruction; the lane's NaN test cost a compare, a mask or and a masked move on its
   dependency chain), and NaNs are looked for beside it, four lanes' sums per test: a sum
   is NaN when an addend is (or for inf + -inf, which only costs the slow path). Found, the
   row is done again by mt_cpu_max_f32_nan. Without NaN both give the same bits (same lanes,
   same ties kept, same fold). On a Zen 4 VM (2026-11-25), rows of 1024: 1.2-1.4x faster
   in the AVX-512 clone, 1.2x in the AVX2 one; rows of 128 as fast as before. */
MT_CPU_VEC_FN float mt_cpu_max_f32(const float *restrict x, int64_t n, float m0) {
    enum { L = MT_CPU_MAX_LANES, Q = MT_CPU_MAX_LANES / 4 };
    float acc[L], nan[Q];
    for (int j = 0; j < L; j++) acc[j] = m0;
    for (int j = 0; j < Q; j++) nan[j] = 0;
    int64_t i = 0;
    for (; i + L <= n; i += L) {
        for (int j = 0; j < L; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
        for (int j = 0; j < Q; j++) {
            float a = x[i + j] + x[i + j + Q], b = x[i + j + 2 * Q] + x[i + j + 3 * Q];
            nan[j] = __builtin_isunordered(a, b) ? 1.0f : nan[j];
        }
    }
    int any = 0;
    for (int j = 0; j < Q; j++) any |= nan[j] != 0;
    if (any) return mt_cpu_max_f32_nan(x, n, m0);
    for (int w = L / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] = acc[j + w] > acc[j] ? acc[j + w] : acc[j];
    float m = acc[0];
    for (; i < n; i++) m = mt_cpu_maxf(m, x[i]);
    return m;
}
#endif
