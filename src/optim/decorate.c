/* In-place conversions of parameters: each keeps its identity (the same mt_tensor *, so
   layers and user code holding it see the change) and gets new storage.
   - O2 decorate (Paddle's paddle.amp.decorate(level='O2')): parameters are cast to the low
     dtype once, so every later forward reads them without a cast; norm-layer parameters stay
     FP32: those the caller flags in keep_fp32, and those marked as norm parameters on the
     tensor itself (mt_set_amp_keep_fp32, which the batch-norm and layer-norm layers call on
     their weight and bias). The layout is kept.
   - Channels-last parameters (torch's module.to(memory_format=torch.channels_last)): 4-d
     parameters and their gradients get NHWC strides, so convolutions under channels-last
     activations read and write their weights without layout copies.
   Every new storage is made and filled before the first swap, so running out of memory
   leaves every parameter as it was. */
#include <stdlib.h>
#include "../autograd/node.h"
#include "optimizer_impl.h"

/* p takes c's storage, dtype and layout; c takes p's old ones (and frees them on release,
   unless views of p still use them: those keep the old values). An in-place change: p's
   version moves on from the old storage's. */
static void swap_storage(mt_tensor *p, mt_tensor *c) {
    uint64_t version = mt_tensor_version(p);
    mt_storage *st = p->storage;
    p->storage = c->storage;
    c->storage = st;
    mt_dtype dt = p->dtype;
    p->dtype = c->dtype;
    c->dtype = dt;
    for (int d = 0; d < p->ndim; d++) {
        int64_t s = p->strides[d];
        p->strides[d] = c->strides[d];
        c->strides[d] = s;
    }
    int64_t offset = p->offset;
    p->offset = c->offset;
    c->offset = offset;
    atomic_store(&p->storage->version, version + 1);
}

/* A copy of t in dtype dt, channels-last when cl else in t's layout; NULL with an error. */
static mt_tensor *converted(const char *op, mt_tensor *t, mt_dtype dt, bool cl) {
    mt_tensor *c = cl ? mt_tensor_new_format(op, t->shape, dt, t->device, true)
                      : mt_tensor_new_layout_of(op, t, dt, t->device);
    if (c && mt_backend_get(t->device)->copy(c, t)) {
        mt_tensor_unref(c);
        return NULL;
    }
    return c;
}

static int check_list(const char *op, mt_tensor *const *params, int n, const char *leaf_why) {
    if (!params) return mt_error_set(MT_ERR_NULL, "%s: arg 1: params is NULL", op);
    if (n < 1)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: n is %d, expected at least one parameter",
                            op, n);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = mt_optim_check_param(op, params, i, leaf_why);
    return rc;
}

static int decorate(mt_tensor *const *params, int n, mt_dtype low, const bool *keep_fp32) {
    static const char op[] = "mt_amp_decorate";
    int rc = check_list(op, params, n, "only leaf parameters can be cast in place");
    if (rc) return rc;
    if (low != MT_F16 && low != MT_BF16)
        return mt_error_set(MT_ERR_DTYPE,
                            "%s: arg 3: low dtype %s is invalid: expected f16 or bf16", op,
                            mt_dtype_name(low));

    /* all conversions first, so running out of memory leaves every parameter as it was */
    mt_tensor **conv = mt_heap_calloc((size_t)n, sizeof *conv);
    if (!conv) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
    for (int i = 0; i < n && rc == 0; i++) {
        mt_tensor *p = params[i];
        if ((keep_fp32 && keep_fp32[i]) || p->amp_keep_fp32 || p->dtype == low) continue;
        conv[i] = converted(op, p, low, false);
        if (!conv[i]) rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        mt_tensor *p = params[i], *c = conv[i];
        if (!c || p->dtype == low) continue; /* kept, or a duplicate entry already done */
        swap_storage(p, c);
        mt_zero_grad(p); /* the gradient has the old dtype: drop it */
    }
    for (int i = 0; i < n; i++) mt_tensor_unref(conv[i]);
    free(conv);
    return rc;
}

int mt_amp_decorate(mt_tensor *const *params, int n, mt_dtype low, const bool *keep_fp32) {
    mt_api_enter(); /* errors inside read "mt_amp_decorate: ..." */
    return mt_api_exit_status(decorate(params, n, low, keep_fp32));
}

/* A 4-d tensor that is not yet dense channels-last (1x1 filters are both formats at once) */
static bool wants_channels_last(const mt_tensor *t) {
    return t && t->ndim == 4 && !mt_is_channels_last(t);
}

static int to_channels_last(mt_tensor *const *params, int n) {
    static const char op[] = "mt_params_to_channels_last";
    int rc = check_list(op, params, n, "only leaf parameters can change layout in place");
    if (rc) return rc;
    /* conv[2i] the parameter's copy, conv[2i + 1] its gradient's */
    mt_tensor **conv = mt_heap_calloc(2 * (size_t)n, sizeof *conv);
    if (!conv) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
    for (int i = 0; i < n && rc == 0; i++) {
        mt_tensor *p = params[i], *g = p->grad;
        if (wants_channels_last(p) && !(conv[2 * i] = converted(op, p, p->dtype, true)))
            rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
        if (rc == 0 && wants_channels_last(g) && !mt_optim_overlaps(g) &&
            !(conv[2 * i + 1] = converted(op, g, g->dtype, true)))
            rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        mt_tensor *p = params[i];
        /* a duplicate entry was done by its first occurrence */
        if (conv[2 * i] && wants_channels_last(p)) swap_storage(p, conv[2 * i]);
        if (conv[2 * i + 1] && wants_channels_last(p->grad)) swap_storage(p->grad, conv[2 * i + 1]);
    }
    for (int i = 0; i < 2 * n; i++) mt_tensor_unref(conv[i]);
    free(conv);
    return rc;
}

int mt_params_to_channels_last(mt_tensor *const *params, int n) {
    mt_api_enter();
    return mt_api_exit_status(to_channels_last(params, n));
}

void mt_set_amp_keep_fp32(mt_tensor *t, bool on) {
    if (t) t->amp_keep_fp32 = on;
}

bool mt_amp_keep_fp32(const mt_tensor *t) {
    return t && t->amp_keep_fp32;
}
