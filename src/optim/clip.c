/* Global gradient-norm clipping (torch.nn.utils.clip_grad_norm_ with the L2 norm): one fused
   sum-of-squares pass over every gradient, then, only when clipping is needed, one fused
   in-place scaling pass (the backend's multi-tensor unscale kernel, which is exactly
   "g *= s for every g"). */
#include <math.h>
#include <stdlib.h>
#include "../autograd/node.h"
#include "optimizer_impl.h"

#define CLIP_EPS 1e-6 /* as torch: coef = max_norm / (norm + 1e-6) */

/* Gradients that share memory between elements (expanded views) are replaced by a
   contiguous copy, so scaling them in place scales each element once. */
static int own_grad(const char *op, mt_tensor *p) {
    mt_tensor *g = p->grad;
    if (!mt_optim_overlaps(g)) return 0;
    mt_tensor *c = mt_tensor_new(op, g->ndim, g->shape, g->dtype, g->device);
    if (!c) return mt_last_status();
    int rc = mt_backend_get(g->device)->copy(c, g);
    if (rc < 0) {
        mt_tensor_unref(c);
        return rc;
    }
    mt_tensor_unref(p->grad);
    p->grad = c;
    return 0;
}

/* g *= coef for every gradient, in place, in one fused pass. */
static int scale_grads(const char *op, mt_optimizer *o, double coef) {
    const mt_backend *be = mt_backend_get(o->device);
    int rc = 0, k = 0;
    for (int i = 0; i < o->n && rc == 0; i++) {
        mt_tensor *p = o->params[i];
        if (!p->grad) continue;
        rc = own_grad(op, p);
        o->grad_buf[k++] = p->grad;
    }
    if (rc < 0) return rc;
    mt_tensor *s = mt_tensor_new(op, 0, NULL, MT_F32, o->device);
    mt_tensor *flag = s ? mt_tensor_new(op, 0, NULL, MT_F32, o->device) : NULL;
    if (!flag) rc = mt_last_status();
    if (rc == 0) rc = be->fill(s, coef);
    if (rc == 0) rc = be->fill(flag, 0.0);
    if (rc == 0) rc = be->unscale(o->grad_buf, k, s, flag);
    mt_tensor_unref(s);
    mt_tensor_unref(flag);
    for (int i = 0; rc == 0 && i < k; i++) mt_tensor_bump_version(o->grad_buf[i]);
    return rc;
}

double mt_clip_grad_norm(mt_optimizer *o, double max_norm) {
    return mt_clip_grad_norm_ex(o, max_norm, false);
}

double mt_clip_grad_norm_ex(mt_optimizer *o, double max_norm, bool error_if_nonfinite) {
    static const char op[] = "mt_clip_grad_norm";
    if (!o) {
        mt_error_set(MT_ERR_NULL, "%s: arg 1: optimizer is NULL", op);
        return NAN;
    }
    if (isnan(max_norm) || max_norm < 0) {
        mt_error_set(MT_ERR_INVALID, "%s: arg 2: max_norm %g is invalid: expected a value >= 0", op,
                     max_norm);
        return NAN;
    }
    const mt_backend *be = mt_backend_get(o->device);
    int k = 0;
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad) o->grad_buf[k++] = o->params[i]->grad;
    if (k == 0) return 0.0;

    double norm = NAN;
    mt_tensor *sq = mt_tensor_new(op, 0, NULL, MT_F32, o->device);
    float sq_host = NAN;
    int rc = sq ? be->sq_norm(o->grad_buf, k, sq) : mt_last_status();
    if (rc == 0) rc = be->download(sq, &sq_host);
    mt_tensor_unref(sq);
    if (rc == 0) {
        norm = sqrt((double)sq_host);
        if (!isfinite(norm) && error_if_nonfinite)
            rc = mt_error_set(MT_ERR_INVALID,
                              "%s: the total norm of the gradients is %g (error_if_nonfinite); "
                              "the gradients were left as they are",
                              op, norm);
        /* as torch, a non-finite norm scales too: by 0 for inf (inf elements become nan), by
           nan for nan; a GradScaler that saw the inf/nan skips the step anyway */
        else if (!(norm <= max_norm))
            rc = scale_grads(op, o, max_norm / (norm + CLIP_EPS));
    }
    for (int i = 0; i < o->n; i++) o->grad_buf[i] = NULL;
    if (rc < 0) {
        if (mt_last_status() == MT_OK)
            mt_error_set(MT_ERR_INTERNAL, "%s: a backend kernel failed", op);
        return NAN;
    }
    return norm;
}
