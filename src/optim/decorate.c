/* O2 decorate (Paddle's paddle.amp.decorate(level='O2')): parameters are cast to the low
   dtype once, in place, so every later forward reads them without a cast; norm-layer
   parameters stay FP32: those the caller flags in keep_fp32, and those marked as norm
   parameters on the tensor itself (mt_set_amp_keep_fp32, which the batch-norm and layer-norm
   layers call on their weight and bias). The parameter keeps its identity (the same mt_tensor *, so
   layers and user code holding it see the change) and gets new storage in the new dtype. */
#include <stdlib.h>
#include "../autograd/node.h"
#include "optimizer_impl.h"

static int decorate(mt_tensor *const *params, int n, mt_dtype low, const bool *keep_fp32) {
    static const char op[] = "mt_amp_decorate";
    if (!params) return mt_error_set(MT_ERR_NULL, "%s: arg 1: params is NULL", op);
    if (n < 1)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: n is %d, expected at least one parameter",
                            op, n);
    if (low != MT_F16 && low != MT_BF16)
        return mt_error_set(MT_ERR_DTYPE,
                            "%s: arg 3: low dtype %s is invalid: expected f16 or bf16", op,
                            mt_dtype_name(low));
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = mt_optim_check_param(op, params, i, "only leaf parameters can be cast in place");
    if (rc) return rc;

    /* all conversions first, so running out of memory leaves every parameter as it was */
    mt_tensor **conv = mt_heap_calloc((size_t)n, sizeof *conv);
    if (!conv) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
    for (int i = 0; i < n && rc == 0; i++) {
        mt_tensor *p = params[i];
        if ((keep_fp32 && keep_fp32[i]) || p->amp_keep_fp32 || p->dtype == low) continue;
        conv[i] = mt_tensor_new(op, p->ndim, p->shape, low, p->device);
        if (!conv[i])
            rc = mt_last_status();
        else
            rc = mt_backend_get(p->device)->copy(conv[i], p);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        mt_tensor *p = params[i], *c = conv[i];
        if (!c || p->dtype == low) continue; /* kept, or a duplicate entry already done */
        /* swap storage and layout: c now holds the old FP32 storage and frees it on release
           (unless views of the parameter still use it: they keep the old values) */
        uint64_t version = mt_tensor_version(p);
        mt_storage *st = p->storage;
        p->storage = c->storage;
        c->storage = st;
        c->dtype = p->dtype;
        p->dtype = low;
        for (int d = 0; d < p->ndim; d++) {
            int64_t s = p->strides[d];
            p->strides[d] = c->strides[d];
            c->strides[d] = s;
        }
        c->offset = p->offset;
        p->offset = 0;
        /* an in-place change: the version moves on from the old storage's */
        atomic_store(&p->storage->version, version + 1);
        /* the gradient has the old dtype: drop it */
        mt_zero_grad(p);
    }
    for (int i = 0; i < n; i++) mt_tensor_unref(conv[i]);
    free(conv);
    return rc;
}

int mt_amp_decorate(mt_tensor *const *params, int n, mt_dtype low, const bool *keep_fp32) {
    mt_api_enter(); /* errors inside read "mt_amp_decorate: ..." */
    return mt_api_exit_status(decorate(params, n, low, keep_fp32));
}

void mt_set_amp_keep_fp32(mt_tensor *t, bool on) {
    if (t) t->amp_keep_fp32 = on;
}

bool mt_amp_keep_fp32(const mt_tensor *t) {
    return t && t->amp_keep_fp32;
}
