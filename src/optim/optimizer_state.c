/* Saving and restoring an optimizer's state in a state dict (src/io), so that a resumed run
   continues bit for bit: the kind and options, and per parameter the moments, Adam's step
   count (bias correction) and the FP32 master weight. Names follow torch's optimizer
   state_dict ("state.<i>.exp_avg", "state.<i>.step", ...), under a caller's prefix. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optimizer_impl.h"
#include "../io/state_impl.h"

static const char *const kind_names[] = {"sgd", "momentum", "adam", "adamw"};

/* The options as (name, pointer) pairs, saved as F64 scalars. */
typedef struct {
    const char *name;
    double *value;
    double hi; /* valid range [0, hi) */
} hparam;

static int hparams_of(mt_optimizer *o, hparam *h) {
    int n = 0;
    h[n++] = (hparam){"lr", &o->lr, INFINITY};
    h[n++] = (hparam){"weight_decay", &o->weight_decay, INFINITY};
    if (o->kind == MT_OPTIM_MOMENTUM) h[n++] = (hparam){"momentum", &o->momentum, INFINITY};
    if (o->kind == MT_OPTIM_ADAM || o->kind == MT_OPTIM_ADAMW) {
        h[n++] = (hparam){"beta1", &o->beta1, 1.0};
        h[n++] = (hparam){"beta2", &o->beta2, 1.0};
        h[n++] = (hparam){"eps", &o->eps, INFINITY};
    }
    return n;
}

/* The per-parameter slots this optimizer has: name and the array it lives in. */
typedef struct {
    const char *name;
    mt_tensor **arr;
} slot;

static int slots_of(mt_optimizer *o, slot *sl) {
    int n = 0;
    if (o->kind == MT_OPTIM_MOMENTUM) sl[n++] = (slot){"momentum_buffer", o->moment1};
    if (o->kind == MT_OPTIM_ADAM || o->kind == MT_OPTIM_ADAMW) {
        sl[n++] = (slot){"exp_avg", o->moment1};
        sl[n++] = (slot){"exp_avg_sq", o->moment2};
    }
    if (o->masters) sl[n++] = (slot){"master", o->masters};
    return n;
}

static int key_of(const char *fn, char *key, size_t cap, const char *prefix, const char *name) {
    if ((size_t)snprintf(key, cap, "%s%s", prefix, name) >= cap)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 3: prefix '%s' is too long", fn, prefix);
    return 0;
}

static int put_new(mt_state *s, const char *key, mt_tensor *t) {
    if (!t) return mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    int rc = mt_state_put(s, key, t);
    mt_tensor_unref(t);
    return rc;
}

/* A 0-d copy of parameter i's step count. */
static mt_tensor *step_entry(mt_optimizer *o, int i) {
    mt_tensor *one = mt_narrow(o->step_count, 0, i, 1);
    mt_tensor *scalar = one ? mt_reshape(one, 0, NULL) : NULL;
    mt_tensor *copy = scalar ? mt_clone(scalar) : NULL;
    mt_tensor_unref(scalar);
    mt_tensor_unref(one);
    return copy;
}

static int save_body(const char *fn, mt_optimizer *o, mt_state *s, const char *prefix) {
    char key[600];
    int rc = key_of(fn, key, sizeof key, prefix, "kind");
    if (!rc) rc = mt_state_set_meta(s, key, kind_names[o->kind]);
    if (!rc && !(rc = key_of(fn, key, sizeof key, prefix, "multi_precision")))
        rc = mt_state_set_meta(s, key, o->multi_precision ? "true" : "false");
    if (!rc && !(rc = key_of(fn, key, sizeof key, prefix, "nesterov")))
        rc = mt_state_set_meta(s, key, o->nesterov ? "true" : "false");
    hparam h[8];
    int nh = hparams_of(o, h);
    for (int i = 0; i < nh && !rc; i++)
        if (!(rc = key_of(fn, key, sizeof key, prefix, h[i].name)))
            rc = put_new(s, key, mt_scalar(*h[i].value, MT_F64, MT_CPU));
    if (!rc && !(rc = key_of(fn, key, sizeof key, prefix, "n_params")))
        rc = put_new(s, key, mt_scalar(o->n, MT_I64, MT_CPU));
    /* copies, so that the next step does not change what was saved */
    slot sl[4];
    int ns = slots_of(o, sl);
    for (int i = 0; i < o->n && !rc; i++) {
        char name[128];
        for (int k = 0; k < ns && !rc; k++) {
            if (!sl[k].arr[i]) continue; /* a moment not made yet: no step saw a gradient */
            snprintf(name, sizeof name, "state.%d.%s", i, sl[k].name);
            if (!(rc = key_of(fn, key, sizeof key, prefix, name)))
                rc = put_new(s, key, mt_clone(sl[k].arr[i]));
        }
        /* Adam's count, an F32 scalar as torch's, beside the moments it goes with */
        snprintf(name, sizeof name, "state.%d.step", i);
        if (!rc && o->step_count && o->moment1[i] &&
            !(rc = key_of(fn, key, sizeof key, prefix, name)))
            rc = put_new(s, key, step_entry(o, i));
    }
    return rc;
}

int mt_optimizer_state_save(mt_optimizer *o, mt_state *s, const char *prefix) {
    static const char fn[] = "mt_optimizer_state_save";
    if (!o) return mt_error_set(MT_ERR_NULL, "%s: arg 1: optimizer is NULL", fn);
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 2: state is NULL", fn);
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    /* into a fresh state first, merged at the end: a failed save leaves s as it was */
    mt_state *fresh = mt_optim_masters_follow(o) < 0 ? NULL : mt_state_new();
    int rc = fresh ? save_body(fn, o, fresh, prefix ? prefix : "") : (int)mt_last_status();
    if (rc == 0) rc = mt_state_merge(s, fresh, fn);
    mt_state_free(fresh);
    mt_set_grad_enabled(prev);
    return mt_api_exit_status(rc);
}

/* ------------------------------------------------------------------ load */

/* The entry prefix+name (owned reference), or NULL: missing (with an error when required). */
static mt_tensor *get_entry(const char *fn, mt_state *s, const char *prefix, const char *name,
                            bool required) {
    char key[600];
    if (key_of(fn, key, sizeof key, prefix, name) < 0) return NULL;
    if (!mt_state_contains(s, key)) {
        if (required) mt_error_set(MT_ERR_INVALID, "%s: the state has no entry '%s'", fn, key);
        return NULL;
    }
    return mt_state_get(s, key);
}

/* A host double from a one-element entry of the expected dtype. */
static int get_number(const char *fn, mt_state *s, const char *prefix, const char *name,
                      mt_dtype dt, double *out) {
    mt_tensor *t = get_entry(fn, s, prefix, name, true);
    if (!t) return mt_last_status();
    int rc = 0;
    if (t->dtype != dt || t->numel != 1)
        rc = mt_error_set(
            MT_ERR_INVALID, "%s: entry '%s%s' is %s with %lld elements, expected a %s scalar", fn,
            prefix, name, mt_dtype_name(t->dtype), (long long)t->numel, mt_dtype_name(dt));
    else
        *out = mt_item(t);
    mt_tensor_unref(t);
    return rc ? rc : (int)mt_last_status();
}

static int check_meta(const char *fn, mt_state *s, const char *prefix, const char *name,
                      const char *want) {
    char key[600];
    int rc = key_of(fn, key, sizeof key, prefix, name);
    if (rc) return rc;
    const char *v = mt_state_get_meta(s, key);
    if (!v) return mt_error_set(MT_ERR_INVALID, "%s: the state has no metadata '%s'", fn, key);
    if (strcmp(v, want) != 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: the saved optimizer has %s '%s' but this one has '%s'", fn, key, v,
                            want);
    return 0;
}

/* What a load will install, made in full before anything changes. */
typedef struct {
    double h[8];
    mt_tensor *step;      /* the n counts on the device, to copy into o->step_count */
    mt_tensor **fresh[4]; /* per slot, per parameter: new tensor on the device, or NULL */
} pending;

/* A copy of src on dev in the layout of like (a parameter, or src itself). */
static mt_tensor *device_copy(const char *fn, const mt_tensor *src, const mt_tensor *like,
                              mt_device dev) {
    mt_tensor *t = mt_tensor_new_layout_of(fn, like, src->dtype, dev);
    if (t && mt_copy(t, (mt_tensor *)src) < 0) {
        mt_tensor_unref(t);
        return NULL;
    }
    return t;
}

/* Reads and checks one parameter's slot; fills *out with a device copy (or NULL: absent). */
static int load_slot(const char *fn, mt_optimizer *o, mt_state *s, const char *prefix, int i,
                     const slot *sl, mt_tensor **out) {
    char name[128];
    snprintf(name, sizeof name, "state.%d.%s", i, sl->name);
    bool is_master = strcmp(sl->name, "master") == 0;
    const mt_tensor *p = o->params[i];
    /* a master exists exactly for the low-precision parameters (made at construction) */
    bool required = is_master && o->masters[i];
    mt_tensor *t = get_entry(fn, s, prefix, name, required);
    if (!t) return mt_last_status();
    int rc = 0;
    mt_dtype want = is_master || p->dtype != MT_F64 ? MT_F32 : MT_F64;
    if (is_master && !o->masters[i])
        rc = mt_error_set(MT_ERR_INVALID,
                          "%s: entry '%s%s' is a master weight but params[%d] (%s) has none", fn,
                          prefix, name, i, mt_dtype_name(p->dtype));
    else if (t->dtype != want || t->ndim != p->ndim ||
             memcmp(t->shape, p->shape, (size_t)p->ndim * sizeof *p->shape) != 0) {
        char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
        rc = mt_error_set(MT_ERR_SHAPE, "%s: entry '%s%s' is %s %s, expected %s %s (params[%d])",
                          fn, prefix, name, mt_dtype_name(t->dtype), mt_shape_str(t, b1, sizeof b1),
                          mt_dtype_name(want), mt_shape_str(p, b2, sizeof b2), i);
    } else if (!(*out = device_copy(fn, t, p, o->device)))
        rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    mt_tensor_unref(t);
    return rc;
}

/* One step count entry: an F32 scalar holding a whole number >= 0 (a NaN, negative or
   fractional count would turn the bias correction into NaN or a wrong factor), copied into
   element i of steps. */
static int load_step(const char *fn, mt_state *s, const char *prefix, const char *name,
                     mt_tensor *steps, int i) {
    mt_tensor *t = get_entry(fn, s, prefix, name, true);
    if (!t) return mt_last_status();
    int rc = 0;
    double v = t->dtype == MT_F32 && t->numel == 1 ? mt_item(t) : 0;
    if (mt_last_status()) { /* mt_item ran out of memory */
        rc = mt_last_status();
    } else if (t->dtype != MT_F32 || t->numel != 1) {
        rc =
            mt_error_set(MT_ERR_INVALID, "%s: entry '%s%s' is not an f32 scalar", fn, prefix, name);
    } else if (!(isfinite(v) && v >= 0 && v == floor(v))) {
        rc = mt_error_set(MT_ERR_INVALID, "%s: entry '%s%s' = %g is not a step count", fn, prefix,
                          name, v);
    } else {
        mt_tensor *one = mt_narrow(steps, 0, i, 1);
        rc = one ? mt_copy(one, t) : (int)mt_last_status();
        mt_tensor_unref(one);
    }
    mt_tensor_unref(t);
    return rc;
}

/* Adam's counts: "state.<i>.step" for each parameter that has moments (exp_avg[i]), 0 for the
   others. A state saved before the counts were per parameter has one "step" for all. */
static int load_steps(const char *fn, mt_optimizer *o, mt_state *s, const char *prefix,
                      mt_tensor *const *exp_avg, mt_tensor **out) {
    int64_t n = o->n;
    mt_tensor *steps = mt_tensor_new(fn, 1, &n, MT_F32, o->device);
    int rc = steps ? mt_backend_get(o->device)->fill(steps, 0.0) : (int)mt_last_status();
    char key[600];
    bool legacy =
        !rc && !(rc = key_of(fn, key, sizeof key, prefix, "step")) && mt_state_contains(s, key);
    for (int i = 0; i < o->n && !rc; i++) {
        if (!exp_avg[i]) continue;
        char name[64];
        snprintf(name, sizeof name, "state.%d.step", i);
        rc = load_step(fn, s, prefix, legacy ? "step" : name, steps, i);
    }
    if (rc) {
        mt_tensor_unref(steps);
        return rc;
    }
    *out = steps;
    return 0;
}

/* A parameter's moments are made together, at its first step: a state with one and not the
   other (Adam's exp_avg without exp_avg_sq) is damaged, and would step from a zero moment. */
static int check_moments_together(const char *fn, const mt_optimizer *o, const char *prefix,
                                  const pending *pd, const slot *sl, int ns) {
    for (int i = 0; i < o->n; i++) {
        int first = -1;
        for (int k = 0; k < ns; k++) {
            if (strcmp(sl[k].name, "master") == 0) continue;
            if (first < 0) {
                first = k;
            } else if (!pd->fresh[k][i] != !pd->fresh[first][i]) {
                int has = pd->fresh[k][i] ? k : first, lacks = pd->fresh[k][i] ? first : k;
                return mt_error_set(MT_ERR_INVALID,
                                    "%s: the state has '%sstate.%d.%s' but not '%sstate.%d.%s'", fn,
                                    prefix, i, sl[has].name, prefix, i, sl[lacks].name);
            }
        }
    }
    return 0;
}

static int load_prepare(const char *fn, mt_optimizer *o, mt_state *s, const char *prefix,
                        pending *pd, const hparam *h, int nh, const slot *sl, int ns) {
    int rc = check_meta(fn, s, prefix, "kind", kind_names[o->kind]);
    if (!rc)
        rc = check_meta(fn, s, prefix, "multi_precision", o->multi_precision ? "true" : "false");
    if (!rc) rc = check_meta(fn, s, prefix, "nesterov", o->nesterov ? "true" : "false");
    double n = 0;
    if (!rc) rc = get_number(fn, s, prefix, "n_params", MT_I64, &n);
    if (!rc && n != o->n)
        rc = mt_error_set(MT_ERR_INVALID,
                          "%s: the saved optimizer has %.0f parameters, this one %d", fn, n, o->n);
    for (int k = 0; k < nh && !rc; k++) {
        rc = get_number(fn, s, prefix, h[k].name, MT_F64, &pd->h[k]);
        if (!rc && !(isfinite(pd->h[k]) && pd->h[k] >= 0 && pd->h[k] < h[k].hi))
            rc = mt_error_set(MT_ERR_INVALID, "%s: saved %s%s %g is out of range", fn, prefix,
                              h[k].name, pd->h[k]);
        /* what mt_momentum_new refuses, a state cannot bring in */
        if (!rc && o->nesterov && h[k].value == &o->momentum && pd->h[k] == 0)
            rc = mt_error_set(MT_ERR_INVALID, "%s: saved %smomentum is 0, which nesterov refuses",
                              fn, prefix);
    }
    for (int k = 0; k < ns && !rc; k++) {
        if (!(pd->fresh[k] = mt_heap_calloc((size_t)o->n, sizeof *pd->fresh[k])))
            rc = mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
        for (int i = 0; i < o->n && !rc; i++)
            rc = load_slot(fn, o, s, prefix, i, &sl[k], &pd->fresh[k][i]);
    }
    if (!rc) rc = check_moments_together(fn, o, prefix, pd, sl, ns);
    /* step counts exist for Adam and AdamW, whose slot 0 is exp_avg */
    if (!rc && o->step_count) rc = load_steps(fn, o, s, prefix, pd->fresh[0], &pd->step);
    return rc;
}

int mt_optimizer_state_load(mt_optimizer *o, mt_state *s, const char *prefix) {
    static const char fn[] = "mt_optimizer_state_load";
    if (!o) return mt_error_set(MT_ERR_NULL, "%s: arg 1: optimizer is NULL", fn);
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 2: state is NULL", fn);
    if (!prefix) prefix = "";
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    hparam h[8];
    slot sl[4];
    int nh = hparams_of(o, h), ns = slots_of(o, sl);
    pending pd = {0};
    int rc = load_prepare(fn, o, s, prefix, &pd, h, nh, sl, ns);
    /* everything is made: install it (masters and the step count keep their identity). The
       copies are the backend's own, between tensors of one shape, dtype and device, which
       allocate nothing, so the install cannot stop half way */
    if (!rc && pd.step) rc = mt_tensor_overwrite(o->step_count, pd.step);
    for (int k = 0; k < ns && !rc; k++)
        for (int i = 0; i < o->n && !rc; i++) {
            if (sl[k].arr == o->masters) {
                if (o->masters[i]) rc = mt_tensor_overwrite(o->masters[i], pd.fresh[k][i]);
                continue;
            }
            mt_tensor_unref(sl[k].arr[i]);
            sl[k].arr[i] = pd.fresh[k][i];
            pd.fresh[k][i] = NULL;
        }
    if (!rc) {
        for (int k = 0; k < nh; k++) *h[k].value = pd.h[k];
        mt_optim_masters_synced(o); /* the masters loaded are those of the parameters now */
    }
    mt_tensor_unref(pd.step);
    for (int k = 0; k < ns; k++) {
        for (int i = 0; pd.fresh[k] && i < o->n; i++) mt_tensor_unref(pd.fresh[k][i]);
        free(pd.fresh[k]);
    }
    mt_set_grad_enabled(prev);
    return mt_api_exit_status(rc);
}
