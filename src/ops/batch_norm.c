/* mt_batch_norm and mt_batch_norm_act: batch normalisation over N and the spatial dims of an
   [N, C, ...] input, as torch.nn.functional.batch_norm (biased variance to normalise, the
   unbiased one for the running update; eval mode normalises with the running statistics),
   and its fused form act(bn(x) + residual). One kernel pass forward (after the statistics)
   and one fused backward, which also gives the residual its gradient. MIXED autocast rule:
   x and the residual keep their dtype, weight and bias are FP32 (F64 for F64 x); the
   running buffers must already be in that dtype, since they are updated in place. */
#include <math.h>
#include "dispatch.h"

/* Channels-last: where the backend has NHWC kernels (batch_norm_nhwc), a channels-last input
   is normalised as it lies, the activations (x, residual, y and their gradients) all dense
   NHWC, and the output keeps the input's memory format; elsewhere everything is made
   contiguous NCHW. */

/* t dense in channels-last (a new reference; a recorded conversion when it is not) */
static mt_tensor *dense_cl(mt_tensor *t, mt_dtype dt) {
    mt_tensor *c = mt_cast(t, dt);
    if (!c || mt_is_channels_last(c)) return c;
    mt_tensor *d = mt_to_channels_last(c);
    mt_tensor_unref(c);
    return d;
}

/* the saved x is dense NCHW or dense NHWC: NHWC when it is not contiguous */
static bool saved_cl(const mt_tensor *x) {
    return x->ndim == 4 && !mt_is_contiguous(x);
}

/* saved: 0 x, 1 weight or NULL, 2 save_mean, 3 save_rstd, 4 y (relu only), 5 bias (with a
   backend state only) or NULL;
   ints: 0 training; state: the backend's (mt_bn_args.state), or none */
static int bn_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *x = n->saved[0];
    bool cl = saved_cl(x);
    mt_tensor *gy = cl ? dense_cl(g, x->dtype) : mt_dispatch_dense(g, x->dtype), *grads[4] = {0};
    int rc = gy ? 0 : mt_backward_failed();
    for (int i = 0; i < 4 && rc == 0; i++) {
        if (!mt_node_needs(n, i)) continue;
        const mt_input_meta *m = &n->inputs[i];
        const char *name = mt_op_fullname(n->op);
        grads[i] = cl && (i == 0 || i == 3) /* the activations' gradients: NHWC */
                       ? mt_tensor_new_format(name, m->shape, m->dtype, x->device, true)
                       : mt_tensor_new(name, m->ndim, m->shape, m->dtype, x->device);
        if (!grads[i]) rc = MT_ERR_OOM;
    }
    mt_bn_backward_args a = {.gx = grads[0],
                             .gw = grads[1],
                             .gb = grads[2],
                             .gres = grads[3],
                             .gy = gy,
                             .x = x,
                             .y = n->saved[4],
                             .weight = n->saved[1],
                             .bias = n->saved[5],
                             .state = n->state,
                             .save_mean = n->saved[2],
                             .save_rstd = n->saved[3],
                             .training = n->ints[0] != 0};
    const mt_backend *be = mt_backend_get(x->device);
    if (rc == 0 && x->numel == 0) /* no element: weight and bias get zeros, as torch */
        for (int i = 0; i < 4 && rc == 0; i++) rc = grads[i] ? be->fill(grads[i], 0.0) : 0;
    else if (rc == 0)
        rc = be->batch_norm_backward(&a);
    mt_tensor_unref(gy);
    for (int i = 0; i < 4; i++) {
        if (rc == 0)
            gi[i] = grads[i];
        else
            mt_tensor_unref(grads[i]);
    }
    return rc;
}

typedef struct {
    mt_op_id op;
    mt_tensor *x, *rm, *rv, *w, *b, *res;
    bool training;
    double momentum, eps;
    mt_activation act;
} bn_call;

static int check_channel_vec(const char *name, int arg, const char *what, const mt_tensor *p,
                             const mt_tensor *x) {
    if (!p) return 0;
    if (mt_check_floating(name, arg, p) < 0 || mt_check_same_device(name, x, p) < 0) return -1;
    if (p->ndim == 1 && p->shape[0] == x->shape[1]) return 0;
    char a[MT_SHAPE_BUF], b[MT_SHAPE_BUF];
    return mt_error_set(MT_ERR_SHAPE, "%s: arg %d: %s shape %s must be [C] = [%lld] for input %s",
                        name, arg, what, mt_shape_str(p, a, sizeof a), (long long)x->shape[1],
                        mt_shape_str(x, b, sizeof b));
}

/* The running buffers are written in place: they must already have the accumulation dtype
   (a cast would update a copy) and be contiguous, and take no part in autograd. */
static int check_running(const bn_call *k, int arg, const char *what, const mt_tensor *r) {
    const char *name = mt_op_fullname(k->op);
    const mt_tensor *x = k->x;
    if (check_channel_vec(name, arg, what, r, x) < 0) return -1;
    mt_dtype acc = mt_norm_acc_dtype(mt_autocast_decide(k->op, x->dtype));
    if (r->dtype != acc)
        return mt_error_set(MT_ERR_DTYPE,
                            "%s: arg %d: %s must be %s (the accumulation dtype for a %s input), "
                            "got %s",
                            name, arg, what, mt_dtype_name(acc), mt_dtype_name(x->dtype),
                            mt_dtype_name(r->dtype));
    if (!mt_is_contiguous(r))
        return mt_error_set(MT_ERR_INVALID, "%s: arg %d: %s must be contiguous (updated in place)",
                            name, arg, what);
    if (r->requires_grad)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg %d: %s requires grad; running statistics are buffers", name,
                            arg, what);
    return 0;
}

static int validate(const bn_call *k) {
    const char *name = mt_op_fullname(k->op);
    mt_tensor *x = k->x;
    char s[MT_SHAPE_BUF];
    if (mt_check_floating(name, 1, x) < 0) return -1;
    if (x->ndim < 2)
        return mt_error_set(MT_ERR_SHAPE, "%s: arg 1: input must be [N, C, ...], got shape %s",
                            name, mt_shape_str(x, s, sizeof s));
    if (!k->rm != !k->rv)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg %d: running_mean and running_var must be given together", name,
                            k->rm ? 3 : 2);
    if (!k->training && !k->rm)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 2: eval mode (training false) needs running statistics", name);
    if ((k->rm && check_running(k, 2, "running_mean", k->rm) < 0) ||
        (k->rv && check_running(k, 3, "running_var", k->rv) < 0) ||
        check_channel_vec(name, 4, "weight", k->w, x) < 0 ||
        check_channel_vec(name, 5, "bias", k->b, x) < 0)
        return -1;
    if (k->res) {
        if (mt_check_floating(name, 6, k->res) < 0 || mt_check_same_device(name, x, k->res) < 0)
            return -1;
        /* the add is fused in x's dtype; an unfused add would promote (f16 + f32 is f32) */
        if (k->res->dtype != x->dtype)
            return mt_error_set(MT_ERR_DTYPE,
                                "%s: arg 6: residual is %s, the input %s: the fused add runs in "
                                "the input's dtype (cast the residual, or use mt_batch_norm and "
                                "mt_add)",
                                name, mt_dtype_name(k->res->dtype), mt_dtype_name(x->dtype));
        if (!mt_same_shape(k->res, x)) {
            char r[MT_SHAPE_BUF];
            return mt_error_set(MT_ERR_SHAPE, "%s: arg 6: residual shape %s differs from input %s",
                                name, mt_shape_str(k->res, r, sizeof r),
                                mt_shape_str(x, s, sizeof s));
        }
    }
    int64_t per_channel = x->shape[1] ? x->numel / x->shape[1] : 0;
    if (k->training && per_channel == 1) /* none is an empty batch: an empty result */
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 1: training needs more than 1 value per channel, input %s",
                            name, mt_shape_str(x, s, sizeof s));
    if (!isfinite(k->momentum))
        return mt_error_set(MT_ERR_INVALID, "%s: momentum %g is not finite", name, k->momentum);
    if (!(k->eps >= 0) || !isfinite(k->eps))
        return mt_error_set(MT_ERR_INVALID, "%s: eps %g must be finite and >= 0", name, k->eps);
    if (k->act != MT_ACT_NONE && k->act != MT_ACT_RELU)
        return mt_error_set(MT_ERR_INVALID, "%s: activation %d is not MT_ACT_NONE or MT_ACT_RELU",
                            name, (int)k->act);
    return 0;
}

/* The tape node, made with its saved tensors before the kernel runs: the kernel updates the
   running statistics in place, so nothing that can fail may come after it. NULL (rc 0) when
   no gradient is wanted; NULL with *rc MT_ERR_OOM when it cannot be made. */
static mt_node *prepare_node(mt_op_id op, mt_tensor *const *in, const mt_bn_args *a, int *rc) {
    *rc = 0;
    if (!mt_autograd_wanted(in, 4)) return NULL;
    mt_node *node = mt_node_new(op, bn_backward, in, 4);
    if (!node) {
        *rc = MT_ERR_OOM;
        return NULL;
    }
    node->ints[0] = a->training;
    node->n_ints = 1;
    int r = mt_node_save(node, 0, a->x);
    if (!r && a->weight) r = mt_node_save(node, 1, a->weight);
    if (!r) r = mt_node_save(node, 2, a->save_mean);
    if (!r) r = mt_node_save(node, 3, a->save_rstd);
    if (!r && a->relu) r = mt_node_save(node, 4, a->y);
    /* the bias in case the backend's backward reads it (cuDNN's fused backward does); dropped
       below when the kernel leaves no backend state */
    if (!r && a->bias) r = mt_node_save(node, 5, a->bias);
    if (r) {
        mt_node_release(node);
        *rc = mt_error_set(MT_ERR_OOM, "%s: out of memory recording the autograd tape",
                           mt_op_fullname(op));
        return NULL;
    }
    return node;
}

/* After the kernel: the node takes the backend's state and becomes y's grad_fn (or, when the
   kernel failed, is released with the state). */
static void finish_node(mt_node *node, const mt_bn_args *a, int rc) {
    mt_bn_state *st = a->state;
    if (rc || !node) {
        if (st->state) st->free_fn(st->state);
        st->state = NULL;
        if (node) mt_node_release(node);
        return;
    }
    if (st->state) {
        mt_node_set_state(node, st->state, st->free_fn);
    } else {
        mt_tensor_unref(node->saved[5]);
        node->saved[5] = NULL;
    }
    st->state = NULL;
    mt_node_attach(node, a->y);
}

static mt_tensor *batch_norm(const bn_call *k) {
    mt_op_id op = k->op;
    const char *name = mt_op_fullname(op);
    if (validate(k) < 0) return NULL;
    mt_tensor *x = k->x, *in[4] = {x, k->w, k->b, k->res}, *c[4], *d[4] = {0};
    int compute = mt_dispatch_mixed(op, in, 4, 1u << 3, c);
    if (compute < 0) return NULL;
    mt_dtype acc = mt_norm_acc_dtype((mt_dtype)compute);
    int rc = 0;
    const mt_backend *be = mt_backend_get(x->device);
    bool cl = be->batch_norm_nhwc && mt_prefers_channels_last(x);
    for (int i = 0; i < 4 && rc == 0; i++) {
        if (!c[i]) continue;
        d[i] = cl && (i == 0 || i == 3) ? dense_cl(c[i], c[i]->dtype)
                                        : mt_dispatch_dense(c[i], c[i]->dtype);
        if (!d[i]) rc = mt_backward_failed();
    }
    int64_t C = x->shape[1];
    mt_bn_state state = {0};
    mt_bn_args a = {.x = d[0],
                    .weight = d[1],
                    .bias = d[2],
                    .residual = d[3],
                    .running_mean = k->rm,
                    .running_var = k->rv,
                    .training = k->training,
                    .relu = k->act == MT_ACT_RELU,
                    .momentum = k->momentum,
                    .eps = k->eps,
                    .state = &state};
    if (rc == 0) {
        a.save_mean = mt_tensor_new(name, 1, &C, acc, x->device);
        a.save_rstd = a.save_mean ? mt_tensor_new(name, 1, &C, acc, x->device) : NULL;
        a.y = !a.save_rstd ? NULL
              : cl ? mt_tensor_new_format(name, x->shape, (mt_dtype)compute, x->device, true)
                   : mt_tensor_new(name, x->ndim, x->shape, (mt_dtype)compute, x->device);
        if (!a.y) rc = MT_ERR_OOM;
    }
    mt_node *node = NULL;
    if (rc == 0) node = prepare_node(op, d, &a, &rc);
    if (rc == 0) rc = mt_scope_reserve(); /* the running statistics change next */
    if (rc == 0 && x->numel == 0) {       /* no statistics: the running buffers stay (torch) */
        rc = be->fill(a.save_mean, 0.0);
        if (rc == 0) rc = be->fill(a.save_rstd, 0.0);
    } else if (rc == 0) {
        rc = be->batch_norm(&a);
        if (rc == 0 && k->training && k->rm) {
            mt_tensor_bump_version(k->rm);
            mt_tensor_bump_version(k->rv);
        }
    }
    finish_node(node, &a, rc);
    mt_tensor_unref(a.save_mean);
    mt_tensor_unref(a.save_rstd);
    mt_tensor *y = a.y;
    if (rc) {
        mt_tensor_unref(y);
        y = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, y, in, 4);
    mt_dispatch_release(d, 4);
    mt_dispatch_release(c, 4);
    return y;
}

mt_tensor *mt_batch_norm(mt_tensor *x, mt_tensor *running_mean, mt_tensor *running_var,
                         mt_tensor *weight, mt_tensor *bias, bool training, double momentum,
                         double eps) {
    if (!x) return NULL;
    bn_call k = {MT_OP_BATCH_NORM, x,        running_mean, running_var, weight, bias, NULL,
                 training,         momentum, eps,          MT_ACT_NONE};
    mt_api_enter();
    return mt_api_exit(batch_norm(&k));
}

mt_tensor *mt_batch_norm_act(mt_tensor *x, mt_tensor *running_mean, mt_tensor *running_var,
                             mt_tensor *weight, mt_tensor *bias, mt_tensor *residual, bool training,
                             double momentum, double eps, mt_activation act) {
    if (!x) return NULL;
    bn_call k = {MT_OP_BATCH_NORM_ACT,
                 x,
                 running_mean,
                 running_var,
                 weight,
                 bias,
                 residual,
                 training,
                 momentum,
                 eps,
                 act};
    mt_api_enter();
    return mt_api_exit(batch_norm(&k));
}
