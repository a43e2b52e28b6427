/* Device type -> kernel table, completed so that no op ever calls through a NULL family, and
   the host-sync counter. */
#include <stdio.h>
#include <threads.h>
#include "backend.h"

#ifdef MT_WITH_CUDA
extern const mt_backend mt_cuda_backend;
#endif

static atomic_int_fast64_t host_syncs;

void mt_host_sync_counted(void) {
    atomic_fetch_add_explicit(&host_syncs, 1, memory_order_relaxed);
}

int64_t mt_host_sync_count(void) {
    return atomic_load_explicit(&host_syncs, memory_order_relaxed);
}

const char *mt_device_str(mt_device dev, char *buf, size_t cap) {
    if (dev.type == MT_DEVICE_CPU)
        snprintf(buf, cap, "cpu");
    else if (dev.type == MT_DEVICE_CUDA)
        snprintf(buf, cap, "cuda:%d", dev.index);
    else
        snprintf(buf, cap, "device-type-%d", dev.type);
    return buf;
}

/* ---- families a backend left out: each answers MT_ERR_UNSUPPORTED naming itself and the
   device of its first tensor argument */
static int unsupported(const char *family, mt_device dev) {
    char d[32];
    return mt_error_set(MT_ERR_UNSUPPORTED, "%s: the %s backend has no %s kernel", family,
                        mt_device_str(dev, d, sizeof d), family);
}
static int no_synchronize(int index) {
    (void)index;
    return 0; /* a backend without queues has nothing to wait for */
}
static int no_memory_stats(int index, mt_memory_stats *out) {
    (void)index;
    *out = (mt_memory_stats){0};
    return 0;
}
static void no_memory_peak_reset(int index) {
    (void)index;
}
static int no_empty_cache(int index) {
    (void)index;
    return 0;
}
static int no_copy(mt_tensor *dst, const mt_tensor *src) {
    (void)src;
    return unsupported("copy", dst->device);
}
static int no_fill(mt_tensor *dst, double value) {
    (void)value;
    return unsupported("fill", dst->device);
}
static int no_upload(mt_tensor *dst, const void *src) {
    (void)src;
    return unsupported("upload", dst->device);
}
static int no_copy_peer(mt_tensor *dst, const mt_tensor *src) {
    (void)src;
    return unsupported("copy_peer", dst->device);
}
static int no_download(const mt_tensor *src, void *dst) {
    (void)dst;
    return unsupported("download", src->device);
}
static int no_unary(mt_op_id op, mt_tensor *out, const mt_tensor *a, double p) {
    (void)a, (void)p;
    return unsupported(mt_op_name(op), out->device);
}
static int no_binary(mt_op_id op, mt_tensor *out, const mt_tensor *a, const mt_tensor *b) {
    (void)a, (void)b;
    return unsupported(mt_op_name(op), out->device);
}
static int no_where(mt_tensor *out, const mt_tensor *c, const mt_tensor *a, const mt_tensor *b) {
    (void)c, (void)a, (void)b;
    return unsupported("where", out->device);
}
static int no_reduce(mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask) {
    (void)a, (void)mask;
    return unsupported(mt_op_name(op), out->device);
}
static int no_softmax(mt_tensor *out, const mt_tensor *a, int dim, bool log) {
    (void)a, (void)dim, (void)log;
    return unsupported("softmax", out->device);
}
static int no_softmax_backward(mt_tensor *gi, const mt_tensor *go, const mt_tensor *y, int dim,
                               bool log) {
    (void)go, (void)y, (void)dim, (void)log;
    return unsupported("softmax_backward", gi->device);
}
static int no_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha,
                   double beta) {
    (void)a, (void)b, (void)alpha, (void)beta;
    return unsupported("gemm", c->device);
}
static int no_cross_entropy(mt_tensor *loss, mt_tensor *lse, mt_tensor *valid,
                            const mt_tensor *logits, const mt_tensor *labels, int64_t ignore) {
    (void)lse, (void)valid, (void)logits, (void)labels, (void)ignore;
    return unsupported("cross_entropy", loss->device);
}
static int no_cross_entropy_backward(mt_tensor *g, const mt_tensor *x, const mt_tensor *labels,
                                     const mt_tensor *lse, const mt_tensor *scale, int64_t ignore) {
    (void)x, (void)labels, (void)lse, (void)scale, (void)ignore;
    return unsupported("cross_entropy_backward", g->device);
}
static int no_random(mt_tensor *out, bool normal, uint64_t seed, uint64_t offset) {
    (void)normal, (void)seed, (void)offset;
    return unsupported("random", out->device);
}
static int no_has_nonfinite(const mt_tensor *t, bool *out) {
    (void)out;
    return unsupported("has_nonfinite", t->device);
}
static int no_unscale(mt_tensor *const *g, int n, const mt_tensor *inv, mt_tensor *found) {
    (void)g, (void)n, (void)inv;
    return unsupported("unscale", found->device);
}
static int no_scale_update(const mt_scale_update_args *a) {
    return unsupported("scale_update", a->scale->device);
}
static int no_optim_step(const mt_optim_step_args *a) {
    return unsupported("optim_step", a->n > 0 ? a->params[0]->device : MT_CPU);
}
static int no_sq_norm(mt_tensor *const *ts, int n, mt_tensor *out) {
    (void)ts, (void)n;
    return unsupported("sq_norm", out->device);
}

static int no_layer_norm(mt_tensor *y, mt_tensor *mean, mt_tensor *rstd, const mt_tensor *x,
                         const mt_tensor *w, const mt_tensor *b, double eps) {
    (void)mean, (void)rstd, (void)x, (void)w, (void)b, (void)eps;
    return unsupported("layer_norm", y->device);
}
static int no_layer_norm_backward(mt_tensor *gx, mt_tensor *gw, mt_tensor *gb, const mt_tensor *gy,
                                  const mt_tensor *x, const mt_tensor *mean, const mt_tensor *rstd,
                                  const mt_tensor *w) {
    (void)gx, (void)gw, (void)gb, (void)mean, (void)rstd, (void)w, (void)gy;
    return unsupported("layer_norm_backward", x->device);
}
static int no_batch_norm(const mt_bn_args *a) {
    return unsupported("batch_norm", a->x->device);
}
static int no_batch_norm_backward(const mt_bn_backward_args *a) {
    return unsupported("batch_norm_backward", a->x->device);
}
static int no_dropout(mt_tensor *out, const mt_tensor *x, double p, uint64_t seed,
                      uint64_t offset) {
    (void)x, (void)p, (void)seed, (void)offset;
    return unsupported("dropout", out->device);
}
static int no_index_select(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index,
                           mt_op_id op) {
    (void)x, (void)dim, (void)index, (void)op;
    return unsupported("index_select", out->device);
}
static int no_index_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src) {
    (void)dim, (void)index, (void)src;
    return unsupported("index_add", dst->device);
}
static int no_gather(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index) {
    (void)x, (void)dim, (void)index;
    return unsupported("gather", out->device);
}
static int no_scatter_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src) {
    (void)dim, (void)index, (void)src;
    return unsupported("scatter_add", dst->device);
}
static int no_argmax(mt_tensor *out, const mt_tensor *x, int dim) {
    (void)x, (void)dim;
    return unsupported("argmax", out->device);
}
static int no_gemm_epilogue(const mt_gemm_epilogue_args *a) {
    return unsupported("gemm_epilogue", a->c->device);
}
/* For families named after ops: the message names the op the user called. */
static int unsupported_op(const char *op, const char *kernel, mt_device dev) {
    char d[32];
    return mt_error_set(MT_ERR_UNSUPPORTED, "%s: the %s backend has no %s kernel", op,
                        mt_device_str(dev, d, sizeof d), kernel);
}
/* the op's own name, so that the message names the op the user called */
static const char *pool_op(const mt_pool2d_params *p) {
    return p->kind == MT_POOL_MAX   ? "mt_max_pool2d"
           : p->kind == MT_POOL_AVG ? "mt_avg_pool2d"
                                    : "mt_adaptive_avg_pool2d";
}
static int no_conv2d(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                     const mt_conv2d_params *p) {
    (void)x, (void)w, (void)b, (void)p;
    return unsupported_op("mt_conv2d", "convolution forward", y->device);
}
static int no_conv2d_backward_data(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                   const mt_conv2d_params *p) {
    (void)gy, (void)w, (void)p;
    return unsupported_op("mt_conv2d", "convolution backward-data", gx->device);
}
static int no_conv2d_backward_weight(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                     const mt_conv2d_params *p) {
    (void)gy, (void)x, (void)p;
    return unsupported_op("mt_conv2d", "convolution backward-weight", gw->device);
}
static int no_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p) {
    (void)idx, (void)x;
    return unsupported_op(pool_op(p), "pooling forward", y->device);
}
static int no_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                              const mt_tensor *idx, const mt_pool2d_params *p) {
    (void)gy, (void)x, (void)idx;
    return unsupported_op(pool_op(p), "pooling backward", gx->device);
}

static void complete(mt_backend *b) {
#define FILL(family)                                                                               \
    if (!b->family) b->family = no_##family
    FILL(synchronize);
    FILL(memory_stats);
    FILL(memory_peak_reset);
    FILL(empty_cache);
    FILL(copy);
    FILL(fill);
    FILL(upload);
    FILL(download);
    FILL(copy_peer);
    FILL(unary);
    FILL(binary);
    FILL(where);
    FILL(reduce);
    FILL(softmax);
    FILL(softmax_backward);
    FILL(gemm);
    FILL(cross_entropy);
    FILL(cross_entropy_backward);
    FILL(conv2d);
    FILL(conv2d_backward_data);
    FILL(conv2d_backward_weight);
    FILL(pool2d);
    FILL(pool2d_backward);
    FILL(random);
    FILL(has_nonfinite);
    FILL(unscale);
    FILL(scale_update);
    FILL(optim_step);
    FILL(sq_norm);
    FILL(layer_norm);
    FILL(layer_norm_backward);
    FILL(batch_norm);
    FILL(batch_norm_backward);
    FILL(dropout);
    FILL(index_select);
    FILL(index_add);
    FILL(gather);
    FILL(scatter_add);
    FILL(argmax);
    FILL(gemm_epilogue);
#undef FILL
}

static mt_backend tables[MT_DEVICE_TYPE_COUNT];
static bool built[MT_DEVICE_TYPE_COUNT];
static once_flag tables_once = ONCE_FLAG_INIT;

static void build_tables(void) {
    tables[MT_DEVICE_CPU] = mt_cpu_backend;
    built[MT_DEVICE_CPU] = true;
#ifdef MT_WITH_CUDA
    tables[MT_DEVICE_CUDA] = mt_cuda_backend;
    built[MT_DEVICE_CUDA] = true;
#endif
    for (int i = 0; i < MT_DEVICE_TYPE_COUNT; i++)
        if (built[i]) complete(&tables[i]);
}

const mt_backend *mt_backend_get(mt_device dev) {
    call_once(&tables_once, build_tables);
    if (dev.type == MT_DEVICE_CPU && dev.index == 0) return &tables[MT_DEVICE_CPU];
    if (dev.type == MT_DEVICE_CUDA && built[MT_DEVICE_CUDA] && dev.index >= 0 &&
        dev.index < mt_cuda_device_count())
        return &tables[MT_DEVICE_CUDA];
    return NULL;
}

const mt_backend *mt_backend_for(const char *op, mt_device dev) {
    const mt_backend *be = mt_backend_get(dev);
    if (!be) {
        if (dev.type == MT_DEVICE_CUDA)
            mt_error_set(MT_ERR_DEVICE, "%s: device cuda:%d is not available (%s)", op, dev.index,
                         mt_cuda_available() ? "no such device index"
                                             : "no CUDA device or driver, or built without CUDA");
        else if (dev.type == MT_DEVICE_CPU) /* one host device: a cpu:3 tensor could never
                                               meet a cpu:0 one */
            mt_error_set(MT_ERR_DEVICE, "%s: device cpu:%d does not exist (the CPU is index 0)", op,
                         dev.index);
        else
            mt_error_set(MT_ERR_DEVICE, "%s: invalid device type %d", op, dev.type);
    }
    return be;
}

/* ---- public device calls */
static int synchronize(mt_device dev) {
    const mt_backend *be = mt_backend_for("mt_synchronize", dev);
    return be ? be->synchronize(dev.index) : MT_ERR_DEVICE;
}

int mt_synchronize(mt_device dev) {
    mt_api_enter(); /* errors inside read "mt_synchronize: ..." */
    return mt_api_exit_status(synchronize(dev));
}

static int memory_stats_get(mt_device dev, mt_memory_stats *out) {
    if (!out) return mt_error_set(MT_ERR_NULL, "mt_memory_stats_get: arg 2: out is NULL");
    const mt_backend *be = mt_backend_for("mt_memory_stats_get", dev);
    return be ? be->memory_stats(dev.index, out) : MT_ERR_DEVICE;
}

int mt_memory_stats_get(mt_device dev, mt_memory_stats *out) {
    mt_api_enter(); /* errors inside read "mt_memory_stats_get: ..." */
    return mt_api_exit_status(memory_stats_get(dev, out));
}

void mt_memory_peak_reset(mt_device dev) {
    const mt_backend *be = mt_backend_get(dev);
    if (be) be->memory_peak_reset(dev.index);
}

static int device_empty_cache(mt_device dev) {
    const mt_backend *be = mt_backend_for("mt_device_empty_cache", dev);
    return be ? be->empty_cache(dev.index) : MT_ERR_DEVICE;
}

int mt_device_empty_cache(mt_device dev) {
    mt_api_enter(); /* errors inside read "mt_device_empty_cache: ..." */
    return mt_api_exit_status(device_empty_cache(dev));
}
