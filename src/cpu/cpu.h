/* Internal interface of the CPU backend: the strided iterator, dtype load/store and the
   kernel entry points that cpu_backend.c puts in the table. */
#ifndef MT_CPU_H
#define MT_CPU_H
#include "../tensor/backend.h"

/* The elementwise row loops are compiled for several x86-64 levels and the one for this CPU
   is picked when the library loads (GCC's target_clones, an ifunc): a portable build
   (-Dnative=false) runs AVX2 or AVX-512 vector code where the CPU has it. Not in native
   builds (already compiled for the build machine), with other compilers, or under the
   sanitizers (their runtime is not set up when ifunc resolvers run). The clones compute the
   same bits: a * b + c is not contracted in ISO C mode, and src/math's explicit FMAs are
   fmaf, correctly rounded (an instruction in the v3/v4 clones, a libm call in the default
   one). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__) &&       \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_UNDEFINED__)
#define MT_CPU_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define MT_CPU_CLONES
#endif
/* A helper that a cloned function calls: inlined into each clone, so that every clone has
   its own vector code (called, it would be compiled once, for baseline x86-64, and the
   AVX2/AVX-512 clones would run its loops as SSE2). */
#define MT_CPU_INLINE static inline __attribute__((always_inline))

/* Work below this many elements runs on the calling thread: an OpenMP region costs more
   than the work. */
#define MT_CPU_PARALLEL_MIN 32768

/* ---- strided iteration over up to 4 same-shape operands (cpu_iter.c) */
#define MT_CPU_ITER_MAX 4
typedef struct {
    int nops, ndim;
    int64_t numel;
    int64_t shape[MT_MAX_DIMS];
    int64_t strides[MT_CPU_ITER_MAX][MT_MAX_DIMS]; /* bytes */
    char *data[MT_CPU_ITER_MAX];
} mt_cpu_iter;
/* Processes n elements of a row; ptrs[k] is operand k's first element, strides[k] its
   stride in bytes along the row. */
typedef void (*mt_cpu_row_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
/* Operands must have the same shape (broadcast inputs are expanded views). Dims are
   coalesced where every operand allows. */
void mt_cpu_iter_init(mt_cpu_iter *it, int nops, const mt_tensor *const *ts);
/* Runs fn over every element, in parallel when the work is large. cost_per_elem scales the
   parallel threshold (1 for a simple add). */
void mt_cpu_iter_run(const mt_cpu_iter *it, mt_cpu_row_fn fn, void *ctx, int cost_per_elem);

/* Runs fn(ctx, b, e, part) over [0, n) split into at most mt_cpu_num_threads() static
   ranges (part numbers them from 0, in order, so per-part partial results can be combined
   in a fixed order: deterministic for a given thread count), in parallel when work is at
   least MT_CPU_PARALLEL_MIN, else as one range on the calling thread. Returns nonzero when
   some fn did (it could not get its scratch). */
typedef int (*mt_cpu_part_fn)(void *ctx, int64_t b, int64_t e, int part);
int mt_cpu_for_parts(mt_cpu_part_fn fn, void *ctx, int64_t n, int64_t work);

/* The offsets along strides s0 and s1 of the element with row-major flat index k over
   shape[0..nd) (the batch entries of a GEMM, the outputs of a reduction). */
static inline void mt_cpu_offsets2(int nd, const int64_t *shape, const int64_t *s0,
                                   const int64_t *s1, int64_t k, int64_t *o0, int64_t *o1) {
    int64_t a = 0, b = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t i = k % shape[d];
        k /= shape[d];
        a += i * s0[d];
        b += i * s1[d];
    }
    *o0 = a;
    *o1 = b;
}

/* ---- dtype conversion of strided runs (cpu_convert.c). stride in bytes. */
void mt_cpu_load_f32(const char *src, int64_t stride, mt_dtype dt, int64_t n, float *dst);
void mt_cpu_store_f32(char *dst, int64_t stride, mt_dtype dt, int64_t n, const float *src);
void mt_cpu_load_f64(const char *src, int64_t stride, mt_dtype dt, int64_t n, double *dst);
void mt_cpu_store_f64(char *dst, int64_t stride, mt_dtype dt, int64_t n, const double *src);
/* Contiguous F16/BF16 <-> F32 (F16C/AVX2 vectorised where the CPU has them, chosen at run
   time; MT_CPU_ISA=generic in the environment forces the scalar code). */
bool mt_cpu_has_avx2(void);
void mt_cpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void mt_cpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n);
void mt_cpu_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);
void mt_cpu_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);
/* Elements of a tensor as F32 in a new contiguous host buffer (mt_host_alloc'd, freed with
   mt_host_free(p, numel * 4)); returns NULL with MT_ERR_OOM. Used by low-precision GEMM. */
float *mt_cpu_to_f32_buffer(const char *op, const mt_tensor *t);

/* ---- kernels (one file each) */
int mt_cpu_copy(mt_tensor *dst, const mt_tensor *src);
int mt_cpu_unary(mt_op_id op, mt_tensor *out, const mt_tensor *a, double p);
int mt_cpu_binary(mt_op_id op, mt_tensor *out, const mt_tensor *a, const mt_tensor *b);
int mt_cpu_where(mt_tensor *out, const mt_tensor *cond, const mt_tensor *a, const mt_tensor *b);
int mt_cpu_reduce(mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask);
int mt_cpu_softmax(mt_tensor *out, const mt_tensor *a, int dim, bool log);
int mt_cpu_softmax_backward(mt_tensor *grad_in, const mt_tensor *grad_out, const mt_tensor *y,
                            int dim, bool log);
int mt_cpu_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta);
/* The epilogue the FP32-panel GEMM applies to each FP32 tile before rounding: bias (FP32 [N]
   or NULL) added, pre (NULL, or a buffer laid out as c) given the sum, then act. */
typedef struct {
    const float *bias;
    char *pre;
    mt_activation act;
} mt_cpu_epilogue;
/* c = a @ b (beta 0) with ep applied when the GEMM runs in FP32 panels (F16/BF16 and F32
   operands BLAS cannot read): *ep_done tells; otherwise c holds a @ b and the caller applies
   ep (cpu_gemm_epilogue.c). */
int mt_cpu_gemm_fused(mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                      const mt_cpu_epilogue *ep, bool *ep_done);
/* v[i] = act(v[i]) in FP32 (the src/math formulas), vectorised per activation */
void mt_cpu_act_f32(mt_activation act, float *v, int64_t n);
int mt_cpu_gemm_epilogue(const mt_gemm_epilogue_args *e);
/* F32/BF16 c = alpha a b + beta c through oneDNN's matmul (cpu_gemm_dnnl.c), used by
   mt_cpu_gemm where mt_cpu_gemm_dnnl_wanted(): BF16 where the CPU has AVX512-BF16
   (MT_CPU_BF16_GEMM=convert: never), F32 products from 96^3 up where it has AVX-512
   (MT_CPU_F32_GEMM=openblas: never, =onednn: always). m, n, k: the whole product's (batch
   rows included). *unsupported: oneDNN has no kernel for these layouts (nothing done, no
   error). */
bool mt_cpu_gemm_dnnl_wanted(mt_dtype dt, int64_t m, int64_t n, int64_t k);
int mt_cpu_gemm_dnnl(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha,
                     double beta, bool *unsupported);
/* The same with the epilogue of e as the matmul's bias and an eltwise post-op (no pre) */
int mt_cpu_gemm_dnnl_epilogue(const mt_gemm_epilogue_args *e, bool *unsupported);
/* Row-major c = alpha op(a) op(b) + beta c on plain FP32 arrays through oneDNN's sgemm (the
   FP32 panels' tiles; single-threaded inside a parallel region); false: oneDNN failed (out
   of memory for its packing buffers), c undefined. */
bool mt_cpu_sgemm_dnnl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);
int mt_cpu_cross_entropy(mt_tensor *loss, mt_tensor *lse, mt_tensor *valid, const mt_tensor *logits,
                         const mt_tensor *labels, int64_t ignore_index);
int mt_cpu_cross_entropy_backward(mt_tensor *grad_logits, const mt_tensor *logits,
                                  const mt_tensor *labels, const mt_tensor *lse,
                                  const mt_tensor *scale, int64_t ignore_index);
/* convolution (cpu_conv.c: oneDNN; cpu_conv_ref.c: the F64 reference loops) */
int mt_cpu_conv2d(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                  const mt_conv2d_params *p);
int mt_cpu_conv2d_backward_data(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                const mt_conv2d_params *p);
int mt_cpu_conv2d_backward_weight(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                  const mt_conv2d_params *p);
int mt_cpu_conv2d_ref(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                      const mt_conv2d_params *p);
int mt_cpu_conv2d_backward_data_ref(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                    const mt_conv2d_params *p);
int mt_cpu_conv2d_backward_weight_ref(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                      const mt_conv2d_params *p);
/* pooling (cpu_pool.c, max pooling in cpu_pool_max.c); cpu_pool_dnnl.c runs the cases where oneDNN
   agrees with torch and sets *done, else returns 0 with *done false */
int mt_cpu_pool2d_dnnl(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p, bool *done);
int mt_cpu_pool2d_backward_dnnl(mt_tensor *gx, const mt_tensor *gy, const mt_pool2d_params *p,
                                bool *done);
int mt_cpu_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p);
int mt_cpu_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                           const mt_tensor *idx, const mt_pool2d_params *p);
int mt_cpu_unscale(mt_tensor *const *grads, int n, const mt_tensor *inv_scale,
                   mt_tensor *found_inf);
int mt_cpu_scale_update(const mt_scale_update_args *a);
int mt_cpu_optim_step(const mt_optim_step_args *a);
int mt_cpu_sq_norm(mt_tensor *const *ts, int n, mt_tensor *out);
int mt_cpu_layer_norm(mt_tensor *y, mt_tensor *mean, mt_tensor *rstd, const mt_tensor *x,
                      const mt_tensor *weight, const mt_tensor *bias, double eps);
int mt_cpu_layer_norm_backward(mt_tensor *gx, mt_tensor *gw, mt_tensor *gb, const mt_tensor *gy,
                               const mt_tensor *x, const mt_tensor *mean, const mt_tensor *rstd,
                               const mt_tensor *weight);
int mt_cpu_batch_norm(const mt_bn_args *a);
int mt_cpu_batch_norm_backward(const mt_bn_backward_args *a);
int mt_cpu_dropout(mt_tensor *out, const mt_tensor *x, double p, uint64_t seed, uint64_t offset);
int mt_cpu_index_select(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index,
                        mt_op_id op);
int mt_cpu_index_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src);
int mt_cpu_gather(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index);
int mt_cpu_scatter_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src);
int mt_cpu_argmax(mt_tensor *out, const mt_tensor *x, int dim);
#endif
