/* SGD, Momentum, Adam and AdamW over a fixed list of parameters. A step is one fused
   multi-tensor kernel call (the backend's optim_step) over every parameter that has a
   gradient; the optimizer only validates, allocates state and builds the argument block.
   State: FP32 masters of F16/BF16 parameters (multi_precision), FP32 moments (F64 for F64
   parameters) allocated at the first step that sees a gradient, and a device-side step
   count for Adam, so a step skipped through found_inf costs no host sync. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../amp/autocast.h"
#include "../autograd/node.h"
#include "optimizer_impl.h"

/* The options of any kind, after defaults. */
typedef struct {
    mt_optim_kind kind;
    double lr, momentum, beta1, beta2, eps, weight_decay;
    bool nesterov, multi_precision;
} optim_cfg;

static const char *dev_type_name(mt_device d) {
    return d.type == MT_DEVICE_CUDA ? "cuda" : "cpu";
}

static bool same_device(mt_device a, mt_device b) {
    return a.type == b.type && a.index == b.index;
}

static bool is_low(mt_dtype dt) {
    return dt == MT_F16 || dt == MT_BF16;
}

typedef struct {
    int64_t stride, size;
} dim_info;

static int cmp_dim(const void *a, const void *b) {
    int64_t x = ((const dim_info *)a)->stride, y = ((const dim_info *)b)->stride;
    return (x > y) - (x < y);
}

bool mt_optim_overlaps(const mt_tensor *t) {
    dim_info d[MT_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 1) continue;
        if (t->strides[i] == 0) return true;
        d[nd++] = (dim_info){t->strides[i] < 0 ? -t->strides[i] : t->strides[i], t->shape[i]};
    }
    qsort(d, (size_t)nd, sizeof *d, cmp_dim);
    /* sufficient for no overlap: each stride steps past everything the smaller ones span */
    int64_t extent = 0;
    for (int i = 0; i < nd; i++) {
        if (d[i].stride <= extent) return true;
        extent += (d[i].size - 1) * d[i].stride;
    }
    return false;
}

typedef struct {
    const mt_tensor *t;
    int index;
} param_ref;

static int cmp_param_ref(const void *a, const void *b) {
    const param_ref *x = a, *y = b;
    if (x->t != y->t) return (uintptr_t)x->t < (uintptr_t)y->t ? -1 : 1;
    return x->index - y->index;
}

int mt_optim_check_param(const char *op, mt_tensor *const *params, int i, const char *leaf_why) {
    const mt_tensor *p = params[i];
    if (!p) return mt_error_set(MT_ERR_NULL, "%s: arg 1: params[%d] is NULL", op, i);
    if (!mt_dtype_is_floating(p->dtype))
        return mt_error_set(MT_ERR_DTYPE,
                            "%s: arg 1: params[%d] has dtype %s; parameters must be floating "
                            "(f32, f64, f16, bf16)",
                            op, i, mt_dtype_name(p->dtype));
    if (p->grad_fn)
        return mt_error_set(MT_ERR_STATE, "%s: arg 1: params[%d] is not a leaf (made by mt_%s); %s",
                            op, i, mt_op_name(p->grad_fn->op), leaf_why);
    return 0;
}

static int check_params(const char *op, mt_tensor *const *params, int n) {
    if (!params) return mt_error_set(MT_ERR_NULL, "%s: arg 1: params is NULL", op);
    if (n < 1)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: n is %d, expected at least one parameter",
                            op, n);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const mt_tensor *p = params[i];
        if ((rc = mt_optim_check_param(op, params, i, "optimizers update leaf tensors")) < 0)
            return rc;
        if (!p->requires_grad)
            return mt_error_set(MT_ERR_STATE,
                                "%s: arg 1: params[%d] does not require grad (call "
                                "mt_set_requires_grad first)",
                                op, i);
        const mt_tensor *p0 = params[0];
        if (!same_device(p->device, p0->device))
            return mt_error_set(MT_ERR_DEVICE,
                                "%s: arg 1: params[%d] is on %s:%d but params[0] is on %s:%d; "
                                "one optimizer holds parameters of one device",
                                op, i, dev_type_name(p->device), p->device.index,
                                dev_type_name(p0->device), p0->device.index);
        if (mt_optim_overlaps(p))
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg 1: params[%d] has overlapping memory (an expanded view) "
                                "and cannot be updated in place",
                                op, i);
    }
    /* the same tensor twice would be updated twice per step */
    param_ref small[16];
    param_ref *refs = n <= 16 ? small : mt_heap_alloc((size_t)n * sizeof *refs);
    if (!refs) return mt_error_set(MT_ERR_OOM, "%s: out of memory checking %d parameters", op, n);
    for (int i = 0; i < n; i++) refs[i] = (param_ref){params[i], i};
    qsort(refs, (size_t)n, sizeof *refs, cmp_param_ref);
    for (int i = 1; i < n && !rc; i++)
        if (refs[i].t == refs[i - 1].t)
            rc = mt_error_set(MT_ERR_INVALID,
                              "%s: arg 1: params[%d] and params[%d] are the same tensor; list each "
                              "parameter once",
                              op, refs[i - 1].index, refs[i].index);
    if (refs != small) free(refs);
    if (rc) return rc;
    return mt_backend_for(op, params[0]->device) ? 0 : MT_ERR_DEVICE;
}

/* value 0 selects def; otherwise it must be finite, >= 0 and < hi. */
/* A non-negative finite option below hi. */
static int option_value(const char *op, const char *name, double value, double hi, double *out) {
    if (!isfinite(value) || value < 0 || value >= hi) {
        if (isinf(hi))
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg 3: %s %g is invalid: expected a finite value >= 0", op,
                                name, value);
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 3: %s %g is invalid: expected a value in [0, %g)", op, name,
                            value, hi);
    }
    *out = value;
    return 0;
}

/* An mt_opt_real option: its value when set (0 included), else the default. A value without
   the set flag is a plain number written where MT_SET(x) belongs (brace elision fills
   .value; -Wall warns): refused rather than silently replaced by the default. */
static int option(const char *op, const char *name, mt_opt_real v, double def, double hi,
                  double *out) {
    if (!v.set && v.value != 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 3: %s is %g without MT_SET: write .%s = MT_SET(%g) (a "
                            "field left out takes the default %g)",
                            op, name, v.value, name, v.value, def);
    return option_value(op, name, v.set ? v.value : def, hi, out);
}

static void optimizer_free_state(mt_optimizer *o) {
    for (int i = 0; i < o->n; i++) {
        if (o->params) mt_tensor_unref(o->params[i]);
        if (o->masters) mt_tensor_unref(o->masters[i]);
        if (o->moment1) mt_tensor_unref(o->moment1[i]);
        if (o->moment2) mt_tensor_unref(o->moment2[i]);
    }
    mt_tensor_unref(o->step_count);
    free(o->params);
    free(o->masters);
    free(o->master_versions);
    free(o->moment1);
    free(o->moment2);
    free(o->grad_buf);
    free(o);
}

/* A zero-filled tensor in the layout of like (a parameter), or of shape [n] when like is
   NULL, outside any scope. */
static mt_tensor *state_zeros(const char *op, const mt_tensor *like, int64_t n, mt_dtype dt,
                              mt_device dev) {
    mt_tensor *t =
        like ? mt_tensor_new_layout_of(op, like, dt, dev) : mt_tensor_new(op, 1, &n, dt, dev);
    if (t && mt_backend_get(dev)->fill(t, 0.0) < 0) {
        mt_tensor_unref(t);
        return NULL;
    }
    return t;
}

void mt_optim_masters_synced(mt_optimizer *o) {
    for (int i = 0; o->masters && i < o->n; i++)
        if (o->masters[i]) o->master_versions[i] = mt_tensor_version(o->params[i]);
}

/* master := where(master rounds to p, master, p): the elements written since keep their
   new value, the others their master's precision (a rewrite of the same values, such as
   mt_params_to_channels_last, changes no master). */
static int master_follow(mt_tensor *master, mt_tensor *p) {
    mt_tensor *low = mt_cast(master, p->dtype);
    mt_tensor *same = low ? mt_eq(low, p) : NULL;
    mt_tensor *wide = same ? mt_cast(p, MT_F32) : NULL;
    mt_tensor *next = wide ? mt_where(same, master, wide) : NULL;
    int rc = next ? mt_backend_get(master->device)->copy(master, next)
                  : (mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM);
    mt_tensor_unref(next);
    mt_tensor_unref(wide);
    mt_tensor_unref(same);
    mt_tensor_unref(low);
    return rc;
}

int mt_optim_masters_follow(mt_optimizer *o) {
    int rc = 0;
    bool prev = mt_set_grad_enabled(false);
    mt_autocast_token autocast = mt_autocast_suspend();
    for (int i = 0; o->masters && i < o->n && rc == 0; i++) {
        if (!o->masters[i] || mt_tensor_version(o->params[i]) == o->master_versions[i]) continue;
        rc = master_follow(o->masters[i], o->params[i]);
        if (rc == 0) {
            mt_tensor_bump_version(o->masters[i]);
            o->master_versions[i] = mt_tensor_version(o->params[i]);
        }
    }
    mt_autocast_resume(autocast);
    mt_set_grad_enabled(prev);
    return rc;
}

static mt_optimizer *optimizer_new(const char *op, mt_tensor *const *params, int n,
                                   const optim_cfg *c) {
    if (check_params(op, params, n) < 0) return NULL;
    mt_device dev = params[0]->device;
    const mt_backend *be = mt_backend_get(dev);
    bool need_masters = false;
    for (int i = 0; i < n && c->multi_precision; i++) need_masters |= is_low(params[i]->dtype);
    bool m1 = c->kind != MT_OPTIM_SGD;
    bool m2 = c->kind == MT_OPTIM_ADAM || c->kind == MT_OPTIM_ADAMW;

    mt_optimizer *o = mt_heap_calloc(1, sizeof *o);
    if (!o) goto oom;
    o->n = n;
    o->kind = c->kind;
    o->device = dev;
    o->lr = c->lr;
    o->momentum = c->momentum;
    o->beta1 = c->beta1;
    o->beta2 = c->beta2;
    o->eps = c->eps;
    o->weight_decay = c->weight_decay;
    o->nesterov = c->nesterov;
    o->multi_precision = c->multi_precision;
    o->params = mt_heap_calloc((size_t)n, sizeof *o->params);
    o->grad_buf = mt_heap_calloc((size_t)n, sizeof *o->grad_buf);
    if (need_masters) o->masters = mt_heap_calloc((size_t)n, sizeof *o->masters);
    if (need_masters) o->master_versions = mt_heap_calloc((size_t)n, sizeof *o->master_versions);
    if (m1) o->moment1 = mt_heap_calloc((size_t)n, sizeof *o->moment1);
    if (m2) o->moment2 = mt_heap_calloc((size_t)n, sizeof *o->moment2);
    if (!o->params || !o->grad_buf || (need_masters && (!o->masters || !o->master_versions)) ||
        (m1 && !o->moment1) || (m2 && !o->moment2))
        goto oom;
    for (int i = 0; i < n; i++) o->params[i] = mt_tensor_ref(params[i]);
    if (need_masters) {
        for (int i = 0; i < n; i++) {
            mt_tensor *p = params[i];
            if (!is_low(p->dtype)) continue;
            /* a plain copy through the backend: the master has no autograd history */
            o->masters[i] = mt_tensor_new_layout_of(op, p, MT_F32, dev);
            if (!o->masters[i] || be->copy(o->masters[i], p) < 0) goto fail;
        }
        mt_optim_masters_synced(o);
    }
    if (m2) {
        o->step_count = state_zeros(op, NULL, n, MT_F32, dev); /* one per parameter */
        if (!o->step_count) goto fail;
    }
    return o;
oom:
    mt_error_set(MT_ERR_OOM, "%s: out of memory creating the optimizer", op);
fail:
    if (o) optimizer_free_state(o);
    return NULL;
}

mt_optimizer *mt_sgd_new(mt_tensor *const *params, int n, const mt_sgd_opts *opts) {
    static const char op[] = "mt_sgd_new";
    mt_sgd_opts z = {0};
    const mt_sgd_opts *s = opts ? opts : &z;
    optim_cfg c = {.kind = MT_OPTIM_SGD, .multi_precision = s->multi_precision};
    if (option(op, "lr", s->lr, 1e-3, INFINITY, &c.lr) < 0 ||
        option_value(op, "weight_decay", s->weight_decay, INFINITY, &c.weight_decay) < 0)
        return NULL;
    return optimizer_new(op, params, n, &c);
}

mt_optimizer *mt_momentum_new(mt_tensor *const *params, int n, const mt_momentum_opts *opts) {
    static const char op[] = "mt_momentum_new";
    mt_momentum_opts z = {0};
    const mt_momentum_opts *s = opts ? opts : &z;
    optim_cfg c = {
        .kind = MT_OPTIM_MOMENTUM, .nesterov = s->nesterov, .multi_precision = s->multi_precision};
    if (option(op, "lr", s->lr, 1e-3, INFINITY, &c.lr) < 0 ||
        option(op, "momentum", s->momentum, 0.9, INFINITY, &c.momentum) < 0 ||
        option_value(op, "weight_decay", s->weight_decay, INFINITY, &c.weight_decay) < 0)
        return NULL;
    if (c.nesterov && c.momentum == 0) { /* as torch.optim.SGD refuses it */
        mt_error_set(MT_ERR_INVALID, "%s: arg 3: nesterov needs a momentum above 0", op);
        return NULL;
    }
    return optimizer_new(op, params, n, &c);
}

static mt_optimizer *adam_new(const char *op, mt_optim_kind kind, mt_tensor *const *params, int n,
                              const mt_adam_opts *opts) {
    mt_adam_opts z = {0};
    const mt_adam_opts *s = opts ? opts : &z;
    optim_cfg c = {.kind = kind, .multi_precision = s->multi_precision};
    /* AdamW's decoupled decay defaults to torch's 0.01; Adam's L2 term defaults to none */
    double wd_default = kind == MT_OPTIM_ADAMW ? 0.01 : 0.0;
    if (option(op, "lr", s->lr, 1e-3, INFINITY, &c.lr) < 0 ||
        option(op, "beta1", s->beta1, 0.9, 1.0, &c.beta1) < 0 ||
        option(op, "beta2", s->beta2, 0.999, 1.0, &c.beta2) < 0 ||
        option(op, "eps", s->eps, 1e-8, INFINITY, &c.eps) < 0 ||
        option(op, "weight_decay", s->weight_decay, wd_default, INFINITY, &c.weight_decay) < 0)
        return NULL;
    return optimizer_new(op, params, n, &c);
}

mt_optimizer *mt_adam_new(mt_tensor *const *params, int n, const mt_adam_opts *opts) {
    return adam_new("mt_adam_new", MT_OPTIM_ADAM, params, n, opts);
}

mt_optimizer *mt_adamw_new(mt_tensor *const *params, int n, const mt_adam_opts *opts) {
    return adam_new("mt_adamw_new", MT_OPTIM_ADAMW, params, n, opts);
}

/* found_inf / inv_scale must be F32 one-element tensors on the optimizer's device. */
static int check_flag(const char *op, int arg, const char *name, const mt_tensor *t,
                      mt_device dev) {
    if (!t) return 0;
    if (t->dtype != MT_F32 || t->numel != 1)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg %d: %s must be a one-element f32 tensor, got %s with %lld "
                            "elements",
                            op, arg, name, mt_dtype_name(t->dtype), (long long)t->numel);
    if (!same_device(t->device, dev))
        return mt_error_set(MT_ERR_DEVICE, "%s: arg %d: %s is on %s:%d, the parameters on %s:%d",
                            op, arg, name, dev_type_name(t->device), t->device.index,
                            dev_type_name(dev), dev.index);
    return 0;
}

/* The gradient of params[i] (or NULL), after checking it fits the optimizer's state. */
static int step_check(const char *op, mt_optimizer *o, int i) {
    mt_tensor *p = o->params[i], *g = p->grad;
    if (!g) return 0;
    if (!same_device(g->device, o->device) || g->numel != p->numel ||
        !mt_dtype_is_floating(g->dtype)) {
        char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
        return mt_error_set(MT_ERR_STATE,
                            "%s: the gradient of params[%d] (%s %s on %s:%d) does not fit the "
                            "parameter (%s %s on %s:%d)",
                            op, i, mt_dtype_name(g->dtype), mt_shape_str(g, b1, sizeof b1),
                            dev_type_name(g->device), g->device.index, mt_dtype_name(p->dtype),
                            mt_shape_str(p, b2, sizeof b2), dev_type_name(p->device),
                            p->device.index);
    }
    /* state made for another dtype (the parameter was cast in place afterwards) */
    mt_dtype md = p->dtype == MT_F64 ? MT_F64 : MT_F32;
    bool has_master = o->masters && o->masters[i];
    bool bad = (has_master && !is_low(p->dtype)) ||
               (o->multi_precision && is_low(p->dtype) && !has_master) || /* small steps lost */
               (o->moment1 && o->moment1[i] && o->moment1[i]->dtype != md);
    if (bad)
        return mt_error_set(MT_ERR_STATE,
                            "%s: params[%d] is now %s, not the dtype the optimizer state was made "
                            "for; call mt_amp_decorate before creating the optimizer",
                            op, i, mt_dtype_name(p->dtype));
    return 0;
}

/* Moments appear at the first step that sees the parameter's gradient. All or nothing: they
   are made first and handed to the optimizer only when every one exists, and taken back
   (moments_drop) when the step's kernel cannot run, so a step that fails leaves the
   optimizer as it was. */
typedef struct {
    mt_tensor *small[16], **made;
    size_t n;
} new_moments;

static bool needs_moment(const mt_optimizer *o, mt_tensor **moments, int i) {
    return moments && o->grad_buf[i] && !moments[i];
}

static void moments_free_list(new_moments *nm) {
    if (nm->made && nm->made != nm->small) free(nm->made);
    nm->made = NULL;
}

static int moments_make(const char *op, mt_optimizer *o, new_moments *nm) {
    mt_tensor **moments[2] = {o->moment1, o->moment2};
    size_t need = 0;
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k < 2; k++) need += needs_moment(o, moments[k], i);
    nm->n = 0;
    nm->made = need <= 16 ? nm->small : mt_heap_alloc(need * sizeof *nm->made);
    if (!nm->made) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
    bool failed = false;
    for (int i = 0; i < o->n && !failed; i++) {
        mt_tensor *p = o->params[i];
        mt_dtype md = p->dtype == MT_F64 ? MT_F64 : MT_F32;
        for (int k = 0; k < 2 && !failed; k++) {
            if (!needs_moment(o, moments[k], i)) continue;
            nm->made[nm->n] = state_zeros(op, p, 0, md, o->device);
            failed = !nm->made[nm->n];
            nm->n += !failed;
        }
    }
    if (failed) {
        for (size_t j = 0; j < nm->n; j++) mt_tensor_unref(nm->made[j]);
        nm->n = 0;
        moments_free_list(nm);
        return mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    }
    size_t m = 0;
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k < 2; k++)
            if (needs_moment(o, moments[k], i)) moments[k][i] = nm->made[m++];
    return 0;
}

/* Takes back the moments moments_make handed over (a failure path: linear search is fine). */
static void moments_drop(mt_optimizer *o, const new_moments *nm) {
    mt_tensor **moments[2] = {o->moment1, o->moment2};
    for (size_t j = 0; j < nm->n; j++)
        for (int i = 0; i < o->n; i++)
            for (int k = 0; k < 2; k++)
                if (moments[k] && moments[k][i] == nm->made[j]) {
                    mt_tensor_unref(moments[k][i]);
                    moments[k][i] = NULL;
                }
}

static int optimizer_step(mt_optimizer *o, const mt_tensor *found_inf, const mt_tensor *inv_scale) {
    static const char op[] = "mt_optimizer_step";
    if (!o) return mt_error_set(MT_ERR_NULL, "%s: arg 1: optimizer is NULL", op);
    /* A step written without checks after a failed forward or backward must not apply
       whatever gradients were half made: refuse while the thread's error is pending. */
    if (mt_last_status() != MT_OK)
        return mt_error_set(MT_ERR_STATE, "%s: an earlier error is pending (%s)", op,
                            mt_last_error());
    int rc = check_flag(op, 2, "found_inf", found_inf, o->device);
    if (!rc) rc = check_flag(op, 3, "inv_scale", inv_scale, o->device);
    if (rc) return rc;
    int with_grad = 0;
    for (int i = 0; i < o->n; i++) {
        if ((rc = step_check(op, o, i)) < 0) return rc;
        o->grad_buf[i] = o->params[i]->grad;
        with_grad += o->grad_buf[i] != NULL;
    }
    if (!with_grad) return 0; /* nothing to update; Adam's step counts stay */
    if ((rc = mt_optim_masters_follow(o)) < 0) return rc;
    new_moments nm = {0};
    if ((rc = moments_make(op, o, &nm)) < 0) return rc;
    mt_optim_step_args a = {
        .kind = o->kind,
        .n = o->n,
        .params = o->params,
        .grads = o->grad_buf,
        .masters = o->masters,
        .moment1 = o->moment1,
        .moment2 = o->moment2,
        .found_inf = found_inf,
        .inv_scale = inv_scale,
        .step_count = o->step_count,
        .lr = o->lr,
        .momentum = o->momentum,
        .beta1 = o->beta1,
        .beta2 = o->beta2,
        .eps = o->eps,
        .weight_decay = o->weight_decay,
        .nesterov = o->nesterov,
    };
    rc = mt_backend_get(o->device)->optim_step(&a);
    if (rc < 0) moments_drop(o, &nm); /* nothing was updated (backend.h: optim_step) */
    moments_free_list(&nm);
    /* an in-place update: saved copies of the parameters in a pending graph become stale.
       Bumped even when found_inf made the kernel skip (the host does not read the flag). */
    for (int i = 0; i < o->n; i++) {
        if (!o->grad_buf[i]) continue;
        if (rc >= 0) {
            mt_tensor_bump_version(o->params[i]);
            if (o->masters && o->masters[i]) mt_tensor_bump_version(o->masters[i]);
        }
        o->grad_buf[i] = NULL;
    }
    if (rc >= 0) mt_optim_masters_synced(o);
    return rc < 0 ? rc : 0;
}

int mt_optimizer_step_ex(mt_optimizer *o, const mt_tensor *found_inf, const mt_tensor *inv_scale) {
    mt_api_enter_at("mt_optimizer_step"); /* the name its messages use */
    return mt_api_exit_status(optimizer_step(o, found_inf, inv_scale));
}

int mt_optimizer_step(mt_optimizer *o) {
    mt_api_enter();
    return mt_api_exit_status(optimizer_step(o, NULL, NULL));
}

void mt_optimizer_zero_grad(mt_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) mt_zero_grad(o->params[i]);
}

void mt_optimizer_free(mt_optimizer *o) {
    if (o) optimizer_free_state(o);
}

int mt_optimizer_set_lr(mt_optimizer *o, double lr) {
    if (!o) return mt_error_set(MT_ERR_NULL, "mt_optimizer_set_lr: arg 1: optimizer is NULL");
    /* unlike the options, 0 is taken literally here: a schedule may end at 0 */
    if (!isfinite(lr) || lr < 0)
        return mt_error_set(MT_ERR_INVALID,
                            "mt_optimizer_set_lr: arg 2: lr %g is invalid: expected a finite "
                            "value >= 0",
                            lr);
    o->lr = lr;
    return 0;
}

double mt_optimizer_get_lr(const mt_optimizer *o) {
    if (!o) {
        mt_error_set(MT_ERR_NULL, "mt_optimizer_get_lr: arg 1: optimizer is NULL");
        return NAN;
    }
    return o->lr;
}

mt_tensor *mt_optimizer_master(mt_optimizer *o, int i) {
    if (!o) return NULL;
    mt_api_enter();
    if (i < 0 || i >= o->n) {
        mt_error_set(MT_ERR_INVALID,
                     "mt_optimizer_master: arg 2: index %d is out of range for %d parameters", i,
                     o->n);
        return mt_api_exit(NULL);
    }
    if (mt_optim_masters_follow(o) < 0) return mt_api_exit(NULL);
    return mt_api_exit(o->masters && o->masters[i] ? mt_tensor_ref(o->masters[i]) : NULL);
}

int mt_optimizer_grads(mt_optimizer *o, mt_tensor **grads) {
    if (!o) return mt_error_set(MT_ERR_NULL, "mt_optimizer_grads: arg 1: optimizer is NULL");
    if (!grads) return mt_error_set(MT_ERR_NULL, "mt_optimizer_grads: arg 2: grads is NULL");
    for (int i = 0; i < o->n; i++) grads[i] = o->params[i]->grad;
    return o->n;
}
