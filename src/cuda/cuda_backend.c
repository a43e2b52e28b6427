/* The CUDA kernel table: each family turns its tensors into the plain data of kernels.h,
   queues the launcher on the device's stream and maps the launch status. Only download,
   has_nonfinite and synchronize wait for the device (through mt_cuda_sync, which counts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_impl.h"
#include "cudnn_impl.h"

/* The context of t's device, or NULL with the error set. */
static mt_cuda_device_ctx *ctx_of(const char *op, const mt_tensor *t) {
    return mt_cuda_ctx_get(op, t->device.index);
}

static int launched(const char *op, int status) {
    return mt_cuda_check(op, (cudaError_t)status);
}

/* ---- memory */
static void *cuda_alloc(int index, size_t nbytes) {
    return mt_cuda_alloc(index, nbytes);
}
static void cuda_free(int index, void *p, size_t nbytes) {
    mt_cuda_free(index, p, nbytes);
}
static int cuda_synchronize(int index) {
    mt_cuda_device_ctx *c = mt_cuda_ctx_get("mt_synchronize", index);
    return c ? mt_cuda_sync("mt_synchronize", c) : MT_ERR_DEVICE;
}
static int cuda_empty_cache(int index) {
    int rc = cuda_synchronize(index);
    return rc ? rc : mt_cuda_empty_cache(index);
}

/* ---- copies and transfers */
static int cuda_copy(mt_tensor *dst, const mt_tensor *src) {
    if (dst->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("copy", dst);
    if (!c) return MT_ERR_DEVICE;
    const mt_tensor *ops[2] = {dst, src};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 2, ops);
    return launched("copy", mt_cuda_copy(&c->kctx, &it));
}

static int cuda_fill(mt_tensor *dst, double value) {
    if (dst->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("fill", dst);
    if (!c) return MT_ERR_DEVICE;
    const mt_tensor *ops[1] = {dst};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 1, ops);
    return launched("fill", mt_cuda_fill(&c->kctx, &it, value));
}

/* A contiguous device tensor like t (for transfers to or from a strided tensor). */
static mt_tensor *dense_like(const char *op, const mt_tensor *t) {
    return mt_tensor_new(op, t->ndim, t->shape, t->dtype, t->device);
}

static size_t nbytes_of(const mt_tensor *t) {
    return (size_t)t->numel * mt_dtype_size(t->dtype);
}

/* The source is copied to a pinned staging block before this returns, so the caller may
   reuse it at once; the DMA is queued in stream order, with no host wait (cuda_staging.c). */
static int cuda_upload(mt_tensor *dst, const void *src) {
    if (dst->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("upload", dst);
    if (!c) return MT_ERR_DEVICE;
    if (mt_is_contiguous(dst))
        return mt_cuda_upload_bytes("upload", c, mt_tensor_data(dst), src, nbytes_of(dst));
    mt_tensor *tmp = dense_like("upload", dst);
    if (!tmp) return MT_ERR_OOM;
    int rc = mt_cuda_upload_bytes("upload", c, mt_tensor_data(tmp), src, nbytes_of(tmp));
    if (!rc) rc = cuda_copy(dst, tmp);
    mt_tensor_unref(tmp); /* stream order keeps it alive for the queued copy */
    return rc;
}

static int cuda_download(const mt_tensor *src, void *dst) {
    if (src->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("download", src);
    if (!c) return MT_ERR_DEVICE;
    mt_tensor *tmp = NULL;
    const mt_tensor *from = src;
    if (!mt_is_contiguous(src)) {
        tmp = dense_like("download", src);
        if (!tmp) return MT_ERR_OOM;
        int rc = cuda_copy(tmp, src);
        if (rc) {
            mt_tensor_unref(tmp);
            return rc;
        }
        from = tmp;
    }
    int rc = mt_cuda_check("download", cudaMemcpyAsync(dst, mt_tensor_data(from), nbytes_of(from),
                                                       cudaMemcpyDeviceToHost, c->stream));
    if (!rc) rc = mt_cuda_sync("download", c);
    mt_tensor_unref(tmp);
    return rc;
}

/* Device to device: the destination's stream waits for the source's work so far, copies
   (over NVLink or PCIe peer access, or staged by the driver where there is none), and the
   source's stream then waits for the copy, so that the caching allocator may hand the
   source's block (or the dense temporary) to later work on that stream. No host wait. */
static int cuda_copy_peer(mt_tensor *dst, const mt_tensor *src) {
    if (dst->numel == 0) return 0;
    if (!mt_is_contiguous(dst)) { /* the bytes travel in logical order (as an upload's): into a
                                     contiguous block on dst's device, then dst's layout */
        mt_tensor *tmp = dense_like("copy_peer", dst);
        if (!tmp) return MT_ERR_OOM;
        int rc = cuda_copy_peer(tmp, src);
        if (!rc) rc = cuda_copy(dst, tmp);
        mt_tensor_unref(tmp); /* stream order keeps it alive for the queued copy */
        return rc;
    }
    mt_cuda_device_ctx *s = ctx_of("copy_peer", src);
    if (!s) return MT_ERR_DEVICE;
    mt_tensor *tmp = NULL;
    const mt_tensor *from = src;
    int rc = 0;
    if (!mt_is_contiguous(src)) {
        tmp = dense_like("copy_peer", src);
        rc = tmp ? cuda_copy(tmp, src) : MT_ERR_OOM;
        from = tmp;
    }
    if (!rc) rc = mt_cuda_check("copy_peer", cudaEventRecord(s->peer_event, s->stream));
    mt_cuda_device_ctx *d = rc ? NULL : ctx_of("copy_peer", dst); /* now the current device */
    if (!rc && !d) rc = MT_ERR_DEVICE;
    if (!rc) rc = mt_cuda_check("copy_peer", cudaStreamWaitEvent(d->stream, s->peer_event, 0));
    if (!rc)
        rc = mt_cuda_check("copy_peer",
                           cudaMemcpyPeerAsync(mt_tensor_data(dst), d->device, mt_tensor_data(from),
                                               s->device, nbytes_of(dst), d->stream));
    if (!rc) rc = mt_cuda_check("copy_peer", cudaEventRecord(d->peer_event, d->stream));
    if (!rc) rc = mt_cuda_check("copy_peer", cudaStreamWaitEvent(s->stream, d->peer_event, 0));
    mt_tensor_unref(tmp);
    return rc;
}

/* ---- elementwise */
static int cuda_unary(mt_op_id op, mt_tensor *out, const mt_tensor *a, double p) {
    if (out->numel == 0) return 0;
    const char *name = mt_op_api_name(op);
    mt_cuda_device_ctx *c = ctx_of(name, out);
    if (!c) return MT_ERR_DEVICE;
    const mt_tensor *ops[2] = {out, a};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 2, ops);
    return launched(name, mt_cuda_unary(&c->kctx, op, &it, p));
}

static int cuda_binary(mt_op_id op, mt_tensor *out, const mt_tensor *a, const mt_tensor *b) {
    if (out->numel == 0) return 0;
    const char *name = mt_op_api_name(op);
    mt_cuda_device_ctx *c = ctx_of(name, out);
    if (!c) return MT_ERR_DEVICE;
    const mt_tensor *ops[3] = {out, a, b};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 3, ops);
    return launched(name, mt_cuda_binary(&c->kctx, op, &it));
}

static int cuda_where(mt_tensor *out, const mt_tensor *cond, const mt_tensor *a,
                      const mt_tensor *b) {
    if (out->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("mt_where", out);
    if (!c) return MT_ERR_DEVICE;
    const mt_tensor *ops[4] = {out, cond, a, b};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 4, ops);
    return launched("mt_where", mt_cuda_where(&c->kctx, &it));
}

static int cuda_random(mt_tensor *out, bool normal, uint64_t seed, uint64_t offset) {
    if (out->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("random", out);
    if (!c) return MT_ERR_DEVICE;
    return launched("random", mt_cuda_random(&c->kctx, mt_tensor_data(out), out->dtype, out->numel,
                                             normal, seed, offset));
}

/* A debug check (the numerics checker): waits for the device to read its flag. */
static int cuda_has_nonfinite(const mt_tensor *t, bool *out) {
    *out = false;
    if (t->numel == 0 || !mt_dtype_is_floating(t->dtype)) return 0;
    mt_cuda_device_ctx *c = ctx_of("has_nonfinite", t);
    if (!c) return MT_ERR_DEVICE;
    int *flag = mt_cuda_alloc(c->device, sizeof *flag);
    if (!flag) return mt_error_set(MT_ERR_OOM, "has_nonfinite: out of device memory");
    const mt_tensor *ops[1] = {t};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 1, ops);
    int host = 0;
    int rc = mt_cuda_check("has_nonfinite", cudaMemsetAsync(flag, 0, sizeof *flag, c->stream));
    if (!rc) rc = launched("has_nonfinite", mt_cuda_has_nonfinite(&c->kctx, &it, flag));
    if (!rc)
        rc = mt_cuda_check("has_nonfinite", cudaMemcpyAsync(&host, flag, sizeof host,
                                                            cudaMemcpyDeviceToHost, c->stream));
    if (!rc) rc = mt_cuda_sync("has_nonfinite", c);
    mt_cuda_free(c->device, flag, sizeof *flag);
    *out = host != 0;
    return rc;
}

/* ---- reductions, softmax, cross entropy */
static int cuda_reduce(mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask) {
    if (out->numel == 0) return 0;
    const char *name = mt_op_api_name(op);
    mt_cuda_device_ctx *c = ctx_of(name, out);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array o, x;
    mt_cuda_array_of(out, &o);
    mt_cuda_array_of(a, &x);
    return launched(name, mt_cuda_reduce(&c->kctx, op, &o, &x, mask));
}

static int cuda_softmax(mt_tensor *out, const mt_tensor *a, int dim, bool log) {
    if (out->numel == 0) return 0;
    const char *name = log ? "mt_log_softmax" : "mt_softmax";
    mt_cuda_device_ctx *c = ctx_of(name, out);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array o, x;
    mt_cuda_array_of(out, &o);
    mt_cuda_array_of(a, &x);
    return launched(name, mt_cuda_softmax(&c->kctx, &o, &x, dim, log));
}

static int cuda_softmax_backward(mt_tensor *grad_in, const mt_tensor *grad_out, const mt_tensor *y,
                                 int dim, bool log) {
    if (grad_in->numel == 0) return 0;
    const char *name = log ? "mt_log_softmax" : "mt_softmax";
    mt_cuda_device_ctx *c = ctx_of(name, grad_in);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array gi, go, ya;
    mt_cuda_array_of(grad_in, &gi);
    mt_cuda_array_of(grad_out, &go);
    mt_cuda_array_of(y, &ya);
    return launched(name, mt_cuda_softmax_backward(&c->kctx, &gi, &go, &ya, dim, log));
}

static int cuda_cross_entropy(mt_tensor *loss, mt_tensor *lse, mt_tensor *valid,
                              const mt_tensor *logits, const mt_tensor *labels, int64_t ignore) {
    mt_cuda_device_ctx *c = ctx_of("mt_cross_entropy", loss);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array l, s, v, x, y;
    mt_cuda_array_of(loss, &l);
    mt_cuda_array_of(lse, &s);
    mt_cuda_array_of(valid, &v);
    mt_cuda_array_of(logits, &x);
    mt_cuda_array_of(labels, &y);
    return launched("mt_cross_entropy",
                    mt_cuda_cross_entropy(&c->kctx, &l, &s, &v, &x, &y, ignore));
}

static int cuda_cross_entropy_backward(mt_tensor *grad, const mt_tensor *logits,
                                       const mt_tensor *labels, const mt_tensor *lse,
                                       const mt_tensor *scale, int64_t ignore) {
    if (grad->numel == 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("mt_cross_entropy", grad);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array g, x, y, s, k;
    mt_cuda_array_of(grad, &g);
    mt_cuda_array_of(logits, &x);
    mt_cuda_array_of(labels, &y);
    mt_cuda_array_of(lse, &s);
    mt_cuda_array_of(scale, &k);
    return launched("mt_cross_entropy",
                    mt_cuda_cross_entropy_backward(&c->kctx, &g, &x, &y, &s, &k, ignore));
}

/* ---- multi-tensor kernels */

/* n arrays (entries for NULL tensors stay absent), or NULL with the error set. */
static mt_cuda_array *arrays_of(const char *op, mt_tensor *const *ts, int n) {
    mt_cuda_array *a = mt_heap_calloc((size_t)(n > 0 ? n : 1), sizeof *a);
    if (!a) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory describing %d tensors", op, n);
        return NULL;
    }
    for (int i = 0; ts && i < n; i++) mt_cuda_array_of(ts[i], &a[i]);
    return a;
}

static const float *f32_ptr(const mt_tensor *t) {
    return t ? (const float *)mt_tensor_data(t) : NULL;
}

/* Allocates nothing: the GradScaler's step runs it after the optimizer has changed the
   parameters, where an out-of-memory failure could not be undone. The gradients go to the
   kernels in batches described on the stack. */
static int cuda_unscale(mt_tensor *const *grads, int n, const mt_tensor *inv_scale,
                        mt_tensor *found_inf) {
    mt_cuda_device_ctx *c = ctx_of("unscale", found_inf);
    if (!c) return MT_ERR_DEVICE;
    enum { BATCH = 64 };
    mt_cuda_array g[BATCH];
    int rc = 0;
    for (int off = 0; off < n && rc == 0; off += BATCH) {
        int m = n - off < BATCH ? n - off : BATCH;
        for (int i = 0; i < m; i++) mt_cuda_array_of(grads[off + i], &g[i]);
        rc = launched("unscale", mt_cuda_unscale(&c->kctx, g, m, f32_ptr(inv_scale),
                                                 (float *)mt_tensor_data(found_inf)));
    }
    return rc;
}

static int cuda_scale_update(const mt_scale_update_args *a) {
    mt_cuda_device_ctx *c = ctx_of("scale_update", a->scale);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_scale_update_args k = {
        .scale = mt_tensor_data(a->scale),
        .good_steps = mt_tensor_data(a->good_steps),
        .bad_steps = mt_tensor_data(a->bad_steps),
        .skipped_steps = mt_tensor_data(a->skipped_steps),
        .found_inf = f32_ptr(a->found_inf),
        .growth_factor = a->growth_factor,
        .backoff_factor = a->backoff_factor,
        .min_scale = a->min_scale,
        .max_scale = a->max_scale,
        .growth_interval = a->growth_interval,
        .backoff_after = a->backoff_after,
    };
    return launched("scale_update", mt_cuda_scale_update(&c->kctx, &k));
}

static int cuda_optim_step(const mt_optim_step_args *a) {
    if (a->n <= 0) return 0;
    mt_cuda_device_ctx *c = ctx_of("optim_step", a->params[0]);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array *p = arrays_of("optim_step", a->params, a->n);
    mt_cuda_array *g = p ? arrays_of("optim_step", a->grads, a->n) : NULL;
    mt_cuda_array *w = g ? arrays_of("optim_step", a->masters, a->n) : NULL;
    mt_cuda_array *m = w ? arrays_of("optim_step", a->moment1, a->n) : NULL;
    mt_cuda_array *v = m ? arrays_of("optim_step", a->moment2, a->n) : NULL;
    bool *stepped = v ? mt_heap_alloc((size_t)a->n * sizeof *stepped) : NULL;
    int rc = MT_ERR_OOM;
    if (v && !stepped) mt_error_set(MT_ERR_OOM, "optim_step: out of memory");
    if (stepped) {
        for (int i = 0; i < a->n; i++) stepped[i] = a->grads[i] != NULL;
        mt_cuda_optim_args k = {
            .kind = a->kind,
            .n = a->n,
            .params = p,
            .grads = g,
            .masters = w,
            .moment1 = m,
            .moment2 = v,
            .found_inf = f32_ptr(a->found_inf),
            .inv_scale = f32_ptr(a->inv_scale),
            .step_count = a->step_count ? (float *)mt_tensor_data(a->step_count) : NULL,
            .stepped = stepped,
            .lr = a->lr,
            .momentum = a->momentum,
            .beta1 = a->beta1,
            .beta2 = a->beta2,
            .eps = a->eps,
            .weight_decay = a->weight_decay,
            .nesterov = a->nesterov,
        };
        rc = launched("optim_step", mt_cuda_optim_step(&c->kctx, &k));
    }
    free(p);
    free(g);
    free(w);
    free(m);
    free(v);
    free(stepped);
    return rc;
}

static int cuda_sq_norm(mt_tensor *const *ts, int n, mt_tensor *out) {
    mt_cuda_device_ctx *c = ctx_of("sq_norm", out);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_array *a = arrays_of("sq_norm", ts, n);
    if (!a) return MT_ERR_OOM;
    mt_cuda_array o;
    mt_cuda_array_of(out, &o);
    int rc = launched("sq_norm", mt_cuda_sq_norm(&c->kctx, a, n, &o));
    free(a);
    return rc;
}

const mt_backend mt_cuda_backend = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .synchronize = cuda_synchronize,
    .memory_stats = mt_cuda_memory_stats,
    .memory_peak_reset = mt_cuda_memory_peak_reset,
    .empty_cache = cuda_empty_cache,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .upload = cuda_upload,
    .copy_peer = cuda_copy_peer,
    .download = cuda_download,
    .unary = cuda_unary,
    .binary = cuda_binary,
    .where = cuda_where,
    .reduce = cuda_reduce,
    .softmax = cuda_softmax,
    .softmax_backward = cuda_softmax_backward,
    .gemm = mt_cuda_gemm,
    .cross_entropy = cuda_cross_entropy,
    .cross_entropy_backward = cuda_cross_entropy_backward,
    .random = cuda_random,
    .has_nonfinite = cuda_has_nonfinite,
    .unscale = cuda_unscale,
    .scale_update = cuda_scale_update,
    .optim_step = cuda_optim_step,
    .sq_norm = cuda_sq_norm,
    .layer_norm = mt_cuda_be_layer_norm,
    .layer_norm_backward = mt_cuda_be_layer_norm_backward,
    .batch_norm = mt_cuda_be_batch_norm,
    .batch_norm_backward = mt_cuda_be_batch_norm_backward,
    .batch_norm_nhwc = true,
    .dropout = mt_cuda_be_dropout,
    .index_select = mt_cuda_be_index_select,
    .index_add = mt_cuda_be_index_add,
    .gather = mt_cuda_be_gather,
    .scatter_add = mt_cuda_be_scatter_add,
    .argmax = mt_cuda_be_argmax,
    .conv2d = mt_cuda_conv2d,
    .conv2d_backward_data = mt_cuda_conv2d_backward_data,
    .conv2d_backward_weight = mt_cuda_conv2d_backward_weight,
    .pool2d = mt_cuda_be_pool2d,
    .pool2d_backward = mt_cuda_be_pool2d_backward,
    .gemm_epilogue = mt_cuda_gemm_epilogue,
};
