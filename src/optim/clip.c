/* Global gradient-norm clipping (torch.nn.utils.clip_grad_norm_ with the L2 norm): one fused
   sum-of-squares pass over every gradient, then one fused in-place scaling pass (the
   backend's multi-tensor unscale kernel, which is exactly "g *= s for every g" and does
   nothing when s is 1). mt_clip_grad_norm reads the norm on the host and scales only when
   clipping is needed; mt_clip_grad_norm_async computes the coefficient on the device, as
   torch does, and never waits. */
#include <math.h>
#include <stdlib.h>
#include "../amp/autocast.h"
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

/* The dtype of the norm and the factor: F64 when a gradient is F64, else F32. */
static mt_dtype norm_dtype(const mt_optimizer *o) {
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad && o->params[i]->grad->dtype == MT_F64) return MT_F64;
    return MT_F32;
}

/* g *= coef[0] for every gradient, in place; coef 0-d (F32, or F64 for F64 gradients) on the
   device. One fused pass over the F32/F16/BF16 gradients (whose kernel takes an F32 factor),
   and a multiply per F64 gradient, by the factor in F64: an F32 one would round it, and
   underflow (a max_norm of 1e-50) or overflow (a norm of 1e30). */
static int scale_grads_by(const char *op, mt_optimizer *o, mt_tensor *coef) {
    const mt_backend *be = mt_backend_get(o->device);
    int rc = 0, k = 0;
    bool any_f64 = norm_dtype(o) == MT_F64;
    for (int i = 0; i < o->n && rc == 0; i++) {
        mt_tensor *p = o->params[i];
        if (!p->grad) continue;
        rc = own_grad(op, p);
        if (p->grad->dtype != MT_F64) o->grad_buf[k++] = p->grad;
    }
    if (rc < 0) return rc;
    mt_tensor *c32 = coef->dtype == MT_F32 ? mt_tensor_ref(coef) : mt_cast(coef, MT_F32);
    mt_tensor *c64 = !any_f64                ? NULL
                     : coef->dtype == MT_F64 ? mt_tensor_ref(coef)
                                             : mt_cast(coef, MT_F64);
    mt_tensor *flag = mt_tensor_new(op, 0, NULL, MT_F32, o->device);
    /* the factor seen in each F64 gradient's shape, all made before the first gradient
       changes: a failure then leaves them all as they were */
    mt_tensor **wide = any_f64 ? mt_heap_calloc((size_t)o->n, sizeof *wide) : NULL;
    if (!c32 || (any_f64 && (!c64 || !wide)) || !flag)
        rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    for (int i = 0; rc == 0 && any_f64 && i < o->n; i++) {
        mt_tensor *g = o->params[i]->grad;
        if (g && g->dtype == MT_F64 && !(wide[i] = mt_tensor_expand_to(c64, g->ndim, g->shape)))
            rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    }
    if (rc == 0) rc = be->fill(flag, 0.0);
    if (rc == 0 && k) rc = be->unscale(o->grad_buf, k, c32, flag);
    for (int i = 0; rc == 0 && i < k; i++) mt_tensor_bump_version(o->grad_buf[i]);
    for (int i = 0; rc == 0 && any_f64 && i < o->n; i++) {
        mt_tensor *g = o->params[i]->grad;
        if (!wide[i]) continue;
        rc = be->binary(MT_OP_MUL, g, g, wide[i]);
        if (rc == 0) mt_tensor_bump_version(g);
    }
    for (int i = 0; wide && i < o->n; i++) mt_tensor_unref(wide[i]);
    free(wide);
    mt_tensor_unref(flag);
    mt_tensor_unref(c64);
    mt_tensor_unref(c32);
    return rc;
}

static int scale_grads(const char *op, mt_optimizer *o, double coef) {
    mt_tensor *s = mt_tensor_new(op, 0, NULL, norm_dtype(o), o->device);
    int rc = s ? mt_backend_get(o->device)->fill(s, coef) : mt_last_status();
    if (rc == 0) rc = scale_grads_by(op, o, s);
    mt_tensor_unref(s);
    return rc;
}

static int check_args(const char *op, const mt_optimizer *o, double max_norm) {
    if (!o) return mt_error_set(MT_ERR_NULL, "%s: arg 1: optimizer is NULL", op);
    if (isnan(max_norm) || max_norm < 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 2: max_norm %g is invalid: expected a value >= 0", op,
                            max_norm);
    return 0;
}

/* The gradients present, into o->grad_buf; returns their count. */
static int collect_grads(mt_optimizer *o) {
    int k = 0;
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad) o->grad_buf[k++] = o->params[i]->grad;
    return k;
}

/* sum(g^2) over every collected gradient as a 0-d tensor on the device (F64 when a gradient
   is F64, else F32; the kernels add up in double); NULL on error. */
static mt_tensor *grads_sq_norm(const char *op, mt_optimizer *o, int k) {
    mt_tensor *sq = mt_tensor_new(op, 0, NULL, norm_dtype(o), o->device);
    if (sq && mt_backend_get(o->device)->sq_norm(o->grad_buf, k, sq) < 0) {
        mt_tensor_unref(sq);
        sq = NULL;
    }
    return sq;
}

/* Lets go of the collected gradients; a failure without a message gets one. Returns rc. */
static int clip_finish(const char *op, mt_optimizer *o, int rc) {
    for (int i = 0; i < o->n; i++) o->grad_buf[i] = NULL;
    if (rc < 0 && mt_last_status() == MT_OK)
        mt_error_set(MT_ERR_INTERNAL, "%s: a backend kernel failed", op);
    return rc;
}

double mt_clip_grad_norm(mt_optimizer *o, double max_norm) {
    return mt_clip_grad_norm_ex(o, max_norm, false);
}

double mt_clip_grad_norm_ex(mt_optimizer *o, double max_norm, bool error_if_nonfinite) {
    static const char op[] = "mt_clip_grad_norm";
    if (check_args(op, o, max_norm) < 0) return NAN;
    int k = collect_grads(o);
    if (k == 0) return 0.0;
    mt_api_enter_at(op); /* errors inside read "mt_clip_grad_norm: ..." */

    double norm = NAN;
    mt_tensor *sq = grads_sq_norm(op, o, k);
    union {
        float f;
        double d;
    } sq_host;
    int rc = sq ? mt_backend_get(o->device)->download(sq, &sq_host) : mt_last_status();
    bool wide = sq && sq->dtype == MT_F64;
    mt_tensor_unref(sq);
    if (rc == 0) {
        norm = sqrt(wide ? sq_host.d : (double)sq_host.f);
        if (!isfinite(norm) && error_if_nonfinite)
            rc = mt_error_set(MT_ERR_INVALID,
                              "%s: the total norm of the gradients is %g (error_if_nonfinite); "
                              "the gradients were left as they are",
                              op, norm);
        /* as torch, a non-finite norm scales too: by 0 for inf (inf elements become nan), by
           nan for nan, and by nan for an inf norm under an inf max_norm (inf / inf); a
           GradScaler that saw the inf/nan skips the step anyway */
        else if (!(norm <= max_norm) || isinf(norm))
            rc = scale_grads(op, o, max_norm / (norm + CLIP_EPS));
    }
    rc = mt_api_exit_status(clip_finish(op, o, rc));
    return rc < 0 ? NAN : norm;
}

/* The norm on the device: sqrt of the fused sum of squares (0-d, in norm_dtype); NULL on
   error. */
static mt_tensor *device_norm(const char *op, mt_optimizer *o, int k) {
    mt_tensor *sq = grads_sq_norm(op, o, k);
    mt_tensor *norm = sq ? mt_sqrt(sq) : NULL;
    mt_tensor_unref(sq);
    return norm;
}

/* coef = min(max_norm / (norm + 1e-6), 1) on the device (torch's clip_coef_clamped): NaN for
   a NaN norm, 0 for an inf one. */
static mt_tensor *clip_coef(mt_tensor *norm, double max_norm) {
    mt_tensor *denom = mt_add_scalar(norm, CLIP_EPS);
    /* filled, not mt_scalar: a max_norm past F32 (DBL_MAX for "no clipping") is inf there,
       and the ratio's minimum with 1 is still 1 */
    mt_tensor *top =
        denom ? mt_tensor_new("mt_clip_grad_norm", 0, NULL, norm->dtype, norm->device) : NULL;
    if (top && mt_backend_get(norm->device)->fill(top, max_norm) < 0) {
        mt_tensor_unref(top);
        top = NULL;
    }
    mt_tensor *ratio = top ? mt_div(top, denom) : NULL;
    mt_tensor *one = ratio ? mt_scalar(1.0, MT_F32, norm->device) : NULL;
    mt_tensor *coef = one ? mt_minimum(ratio, one) : NULL;
    mt_tensor_unref(denom);
    mt_tensor_unref(top);
    mt_tensor_unref(ratio);
    mt_tensor_unref(one);
    return coef;
}

mt_tensor *mt_clip_grad_norm_async(mt_optimizer *o, double max_norm) {
    static const char op[] = "mt_clip_grad_norm_async";
    if (check_args(op, o, max_norm) < 0) return NULL;
    mt_api_enter();
    int k = collect_grads(o);
    if (k == 0) return mt_api_exit(mt_scalar(0.0, MT_F32, o->device));
    /* F32 throughout, whatever autocast region the caller is in (as the GradScaler does) */
    mt_autocast_token autocast = mt_autocast_suspend();
    mt_tensor *norm = device_norm(op, o, k);
    mt_tensor *coef = norm ? clip_coef(norm, max_norm) : NULL;
    mt_autocast_resume(autocast);
    int rc = coef ? scale_grads_by(op, o, coef) : mt_last_status();
    mt_tensor_unref(coef);
    if (clip_finish(op, o, rc) < 0) {
        mt_tensor_unref(norm);
        norm = NULL;
    }
    return mt_api_exit(norm);
}
