/* What the two CPU pooling files share (cpu_pool.c: average and adaptive; cpu_pool_max.c:
   max with argmax indices): torch's window rules, (n, c) planes of any strides, and the NHWC
   rows of C channels that the channels-last loops stream. */
#ifndef MT_CPU_POOL_ROWS_H
#define MT_CPU_POOL_ROWS_H
#include "../math/pool_window.h"
#include "cpu.h"

/* the window rules are shared with the CUDA kernels (src/math/pool_window.h) */
typedef mt_pool_window mt_cpu_window;

static inline void mt_cpu_window_of(const mt_pool2d_params *p, int64_t oh, int64_t ow, int64_t H,
                                    int64_t W, int64_t OH, int64_t OW, mt_cpu_window *w) {
    mt_pool_window_of(p->kind == MT_POOL_ADAPTIVE_AVG, p->kernel, p->stride, p->padding,
                      p->count_include_pad, oh, ow, H, W, OH, OW, w);
}

static inline const char *mt_cpu_pool_op_name(const mt_pool2d_params *p) {
    return p->kind == MT_POOL_MAX   ? "mt_max_pool2d"
           : p->kind == MT_POOL_AVG ? "mt_avg_pool2d"
                                    : "mt_adaptive_avg_pool2d";
}

/* Runs the statements after the arguments for every task (n, m) of [0, N) x [0, M) (an
   (n, c) plane, an (n, oh) output row, ...), over the threads when work (elements touched)
   is worth it, with scratch the thread's own block of nbytes bytes (NULL for 0 bytes). ok
   becomes false when a thread could not have its block: its tasks are skipped and the caller
   reports out of memory. A macro, not a function taking a callback, so that the task's body
   stays inlined in the loop. (clang-format would run the two loops together.) */
/* clang-format off */
#define MT_CPU_POOL_TASKS(ok, work, nbytes, N, M, n, m, scratch, ...)                              \
    do {                                                                                           \
        int64_t mt_tn_ = (N), mt_tm_ = (M);                                                        \
        size_t mt_tbytes_ = (nbytes);                                                              \
        bool mt_tpar_ = (work) > MT_CPU_PARALLEL_MIN;                                              \
        int mt_tfailed_ = 0;                                                                       \
        _Pragma("omp parallel if (mt_tpar_) num_threads(mt_cpu_num_threads())")                    \
        {                                                                                          \
            void *scratch = mt_tbytes_ ? mt_host_alloc(mt_tbytes_) : NULL;                         \
            bool mt_tok_ = scratch || !mt_tbytes_;                                                 \
            if (!mt_tok_) {                                                                        \
                _Pragma("omp atomic write") mt_tfailed_ = 1;                                       \
            }                                                                                      \
            _Pragma("omp for collapse(2)")                                                         \
            for (int64_t n = 0; n < mt_tn_; n++)                                                   \
                for (int64_t m = 0; m < mt_tm_; m++) {                                             \
                    if (!mt_tok_) continue;                                                        \
                    __VA_ARGS__                                                                    \
                }                                                                                  \
            if (scratch) mt_host_free(scratch, mt_tbytes_);                                        \
        }                                                                                          \
        (ok) = !mt_tfailed_;                                                                       \
    } while (0)
/* clang-format on */

/* ---- one (n, c) plane */
typedef struct {
    const mt_tensor *t;
    char *base;
    int64_t sh, sw; /* bytes */
} mt_cpu_plane;

static inline mt_cpu_plane mt_cpu_plane_of(const mt_tensor *t, int64_t n, int64_t c) {
    int64_t es = (int64_t)mt_dtype_size(t->dtype);
    mt_cpu_plane p = {t, (char *)mt_tensor_data(t) + (n * t->strides[0] + c * t->strides[1]) * es,
                      t->strides[2] * es, t->strides[3] * es};
    return p;
}

static inline char *mt_cpu_pix(const mt_cpu_plane *p, int64_t h, int64_t w) {
    return p->base + h * p->sh + w * p->sw;
}

/* The plane as dense floats: its own data when it is a dense F32 plane, else widened into buf
   (H * W floats), a row at a time. Not for F64 (kept exact in the double loops). */
static inline const float *mt_cpu_plane_f32(const mt_cpu_plane *p, int64_t H, int64_t W,
                                            float *buf) {
    if (p->t->dtype == MT_F32 && p->sw == 4 && p->sh == 4 * W) return (const float *)p->base;
    for (int64_t h = 0; h < H; h++)
        mt_cpu_load_f32(p->base + h * p->sh, p->sw, p->t->dtype, W, buf + h * W);
    return buf;
}

/* ---- NHWC rows: the C channels at (n, h, w) lie together (channel stride 1) */
static inline bool mt_cpu_pool_row_dtype(mt_dtype dt) {
    return dt == MT_F32 || dt == MT_F16 || dt == MT_BF16;
}

/* t has channel stride 1 (NHWC rows), a row dtype, and positions that fit an int32 */
static inline bool mt_cpu_pool_nhwc(const mt_tensor *t) {
    return mt_cpu_pool_row_dtype(t->dtype) && t->strides[1] == 1 && t->shape[1] > 1 &&
           t->shape[2] * t->shape[3] < INT32_MAX;
}

static inline char *mt_cpu_row_at(const mt_tensor *t, int64_t n, int64_t h, int64_t w) {
    return (char *)mt_tensor_data(t) + (n * t->strides[0] + h * t->strides[2] + w * t->strides[3]) *
                                           (int64_t)mt_dtype_size(t->dtype);
}

/* n F16/BF16 values at r widened to floats in d, and back (rounded) */
static inline void mt_cpu_row_widen(const char *r, mt_dtype dt, int64_t n, float *d) {
    if (dt == MT_BF16)
        mt_cpu_bf16_to_f32((const uint16_t *)r, d, n);
    else
        mt_cpu_f16_to_f32((const uint16_t *)r, d, n);
}

static inline void mt_cpu_row_narrow(char *r, mt_dtype dt, int64_t n, const float *v) {
    if (dt == MT_BF16)
        mt_cpu_f32_to_bf16(v, (uint16_t *)r, n);
    else
        mt_cpu_f32_to_f16(v, (uint16_t *)r, n);
}

/* Channels [c0, c0 + cn) of the row (n, h, w) as floats: an F32 row in place, a low one
   widened into buf. */
static inline const float *mt_cpu_row_part_load(const mt_tensor *t, int64_t n, int64_t h, int64_t w,
                                                int64_t c0, int64_t cn, float *buf) {
    char *r = mt_cpu_row_at(t, n, h, w);
    if (t->dtype == MT_F32) return (const float *)r + c0;
    mt_cpu_row_widen(r + c0 * 2, t->dtype, cn, buf);
    return buf;
}

/* The C channels at (n, h, w) as floats (mt_cpu_row_part_load) */
static inline const float *mt_cpu_row_load(const mt_tensor *t, int64_t n, int64_t h, int64_t w,
                                           float *buf) {
    return mt_cpu_row_part_load(t, n, h, w, 0, t->shape[1], buf);
}

/* Where a row's F32 results go: the F32 row itself, or buf (then mt_cpu_row_store rounds). */
static inline float *mt_cpu_row_out(const mt_tensor *t, int64_t n, int64_t h, int64_t w,
                                    float *buf) {
    return t->dtype == MT_F32 ? (float *)mt_cpu_row_at(t, n, h, w) : buf;
}

/* v rounded into channels [c0, c0 + cn) of the row (n, h, w) of an F16/BF16 t */
static inline void mt_cpu_row_part_store(mt_tensor *t, int64_t n, int64_t h, int64_t w, int64_t c0,
                                         int64_t cn, const float *v) {
    mt_cpu_row_narrow(mt_cpu_row_at(t, n, h, w) + c0 * 2, t->dtype, cn, v);
}

/* ... into all C of them */
static inline void mt_cpu_row_store(mt_tensor *t, int64_t n, int64_t h, int64_t w, const float *v) {
    mt_cpu_row_part_store(t, n, h, w, 0, t->shape[1], v);
}

/* The gradient gy as NHWC rows for a backward into NHWC rows: gy itself, or (a gradient in
   another layout, such as the broadcast one of a sum) a dense channels-last copy in *copy, for
   the caller to release: one copy instead of the plane-by-plane loops. */
static inline int mt_cpu_pool_rows_like(const char *op, const mt_tensor *gy, const mt_tensor **rows,
                                        mt_tensor **copy) {
    *rows = gy;
    *copy = NULL;
    if (mt_cpu_pool_nhwc(gy)) return 0;
    *copy = mt_tensor_new_format(op, gy->shape, gy->dtype, gy->device, true);
    if (!*copy) return mt_last_status();
    *rows = *copy;
    return mt_cpu_copy(*copy, gy);
}

/* max pooling with argmax indices (cpu_pool_max.c); cpu_pool.c's entry points route to them */
int mt_cpu_max_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p);
int mt_cpu_max_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *idx,
                               const mt_pool2d_params *p);
#endif
