/* The GradScaler (DESIGN.md section 4): dynamic loss scaling with the scale, the counters and
   the found-inf flag kept as F32 0-d tensors on the parameters' device, so a training step
   (scale, backward, unscale, step, update) never reads the device from the host:
   - scale(loss) multiplies by the scale tensor (a recorded op: backward carries the scale);
   - unscale is one fused pass over the optimizer's gradients that multiplies them by
     1/scale (computed on the device) and raises found_inf on any inf/nan;
   - step hands found_inf to the optimizer kernel, which does nothing when it is set (and,
     when unscale was not called, multiplies by 1/scale itself, in FP32 registers);
   - update runs the update_loss_scaling logic on the device.
   As in PyTorch, each optimizer of a step has its own found-inf flag (its step is skipped
   only for an inf/nan in its own gradients) and update backs off when any of them is set. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../optim/optimizer_impl.h"
#include "autocast.h"
#include "../io/state_impl.h"
#include "../dist/dist_decline.h"

#define MAX_OPTIMIZERS 16 /* optimizers one scaler can serve within one step */

typedef struct {
    mt_optimizer *o;
    mt_tensor *found; /* F32 0-d on the state's device: inf/nan in this optimizer's grads */
    bool unscaled, stepped;
} opt_state;

/* The device state: F32 0-d tensors. FOUND_INF is the flag of the last update (any
   optimizer of that step found inf/nan). */
enum { SCALE, GOOD, BAD, SKIPPED, FOUND_INF, N_STATE };

struct mt_grad_scaler {
    double growth_factor, backoff_factor, min_scale, max_scale;
    int growth_interval, backoff_after;
    bool disabled;
    bool dist;             /* found-inf flags are all-reduced (max) over the ranks (mt_dist) */
    mt_tensor *t[N_STATE]; /* on `device`, made on first use; until then `host` holds it */
    mt_device device;
    mt_grad_scaler_state host;
    /* per-step state machine, cleared by update */
    opt_state opts[MAX_OPTIMIZERS];
    int n_opts;
};

static const char *dev_name(mt_device d) {
    return d.type == MT_DEVICE_CUDA ? "cuda" : "cpu";
}
static bool same_device(mt_device a, mt_device b) {
    return a.type == b.type && a.index == b.index;
}

static void clear_step(mt_grad_scaler *s) {
    for (int i = 0; i < s->n_opts; i++) mt_tensor_unref(s->opts[i].found);
    s->n_opts = 0;
}

static void release_tensors(mt_grad_scaler *s) {
    for (int i = 0; i < N_STATE; i++) {
        mt_tensor_unref(s->t[i]);
        s->t[i] = NULL;
    }
}

/* Makes the device tensors (from the host values) on dev, or moves them there. */
static int ensure_state(mt_grad_scaler *s, const char *fn, mt_device dev) {
    if (s->t[SCALE]) {
        if (same_device(s->device, dev)) return 0;
        bool mid_step = false; /* flags already made on the old device */
        for (int i = 0; i < s->n_opts; i++) mid_step |= s->opts[i].found != NULL;
        if (mid_step)
            return mt_error_set(
                MT_ERR_DEVICE,
                "%s: the optimizers of one step must be on one device (%s:%d and %s:%d)", fn,
                dev_name(s->device), s->device.index, dev_name(dev), dev.index);
        /* the state follows the parameters (e.g. the loss was scaled on another device) */
        mt_tensor *moved[N_STATE] = {0};
        for (int i = 0; i < N_STATE; i++) {
            moved[i] = mt_to(s->t[i], dev);
            if (!moved[i]) {
                for (int k = 0; k < i; k++) mt_tensor_unref(moved[k]);
                return mt_error_set(mt_last_status() ? mt_last_status() : MT_ERR_DEVICE,
                                    "%s: cannot move the scaler state to %s:%d", fn, dev_name(dev),
                                    dev.index);
            }
        }
        for (int i = 0; i < N_STATE; i++) {
            mt_tensor_unref(s->t[i]);
            s->t[i] = moved[i];
        }
        s->device = dev;
        return 0;
    }
    const double init[N_STATE] = {s->host.scale, (double)s->host.good_steps,
                                  (double)s->host.bad_steps, (double)s->host.skipped_steps, 0.0};
    for (int i = 0; i < N_STATE; i++) {
        s->t[i] = mt_scalar(init[i], MT_F32, dev);
        if (!s->t[i]) {
            release_tensors(s);
            return mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
        }
    }
    s->device = dev;
    return 0;
}

static int check_scaler(const mt_grad_scaler *s, const char *fn) {
    return s ? 0 : mt_error_set(MT_ERR_NULL, "%s: arg 1: scaler is NULL", fn);
}

/* ------------------------------------------------------------------ construction */

mt_grad_scaler *mt_grad_scaler_new(const mt_grad_scaler_opts *opts) {
    const char *fn = "mt_grad_scaler_new";
    mt_grad_scaler_opts o = opts ? *opts : (mt_grad_scaler_opts){0};
    double init = o.init_scale != 0 ? o.init_scale : 65536.0;
    double growth = o.growth_factor != 0 ? o.growth_factor : 2.0;
    double backoff = o.backoff_factor != 0 ? o.backoff_factor : 0.5;
    int interval = o.growth_interval != 0 ? o.growth_interval : 2000;
    int after = o.backoff_after != 0 ? o.backoff_after : 1;
    double lo = o.min_scale != 0 ? o.min_scale : 1.0;
    double hi = o.max_scale != 0 ? o.max_scale : 16777216.0;
    /* the scale is an F32 tensor: the bounds must be representable */
    if (!(lo > 0 && hi >= lo && hi <= FLT_MAX)) {
        mt_error_set(MT_ERR_INVALID,
                     "%s: min_scale %g and max_scale %g must satisfy 0 < min_scale <= max_scale <= "
                     "FLT_MAX",
                     fn, lo, hi);
        return NULL;
    }
    /* the F32 scale is clamped to the bounds as F32 holds them: kept so, the clamped scale
       is inside them when it is read back, set again or loaded */
    lo = (float)lo;
    hi = (float)hi;
    if (lo == 0) {
        mt_error_set(MT_ERR_INVALID, "%s: min_scale %g is 0 in F32", fn, o.min_scale);
        return NULL;
    }
    if (!((float)init >= lo && (float)init <= hi)) { /* as the F32 scale will hold it */
        mt_error_set(MT_ERR_INVALID, "%s: init_scale %g is outside [min_scale %g, max_scale %g]",
                     fn, init, lo, hi);
        return NULL;
    }
    if (!(isfinite(growth) && growth >= 1.0)) {
        mt_error_set(MT_ERR_INVALID, "%s: growth_factor %g must be finite and >= 1", fn, growth);
        return NULL;
    }
    if (!(backoff > 0.0 && backoff <= 1.0)) {
        mt_error_set(MT_ERR_INVALID, "%s: backoff_factor %g must be in (0, 1]", fn, backoff);
        return NULL;
    }
    /* the step counters are F32 tensors, exact up to 2^24 */
    if (interval < 1 || after < 1 || interval > 16777216 || after > 16777216) {
        mt_error_set(MT_ERR_INVALID,
                     "%s: growth_interval %d and backoff_after %d must be in [1, 2^24]", fn,
                     interval, after);
        return NULL;
    }
    mt_grad_scaler *s = mt_heap_calloc(1, sizeof *s);
    if (!s) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
        return NULL;
    }
    s->growth_factor = growth;
    s->backoff_factor = backoff;
    s->growth_interval = interval;
    s->backoff_after = after;
    s->min_scale = lo;
    s->max_scale = hi;
    s->disabled = o.disabled;
    s->host.scale = init;
    return s;
}

void mt_grad_scaler_free(mt_grad_scaler *s) {
    if (!s) return;
    clear_step(s);
    release_tensors(s);
    free(s);
}

/* ------------------------------------------------------------------ scale */

mt_tensor *mt_grad_scaler_scale(mt_grad_scaler *s, mt_tensor *loss) {
    const char *fn = "mt_grad_scaler_scale";
    if (check_scaler(s, fn) < 0) return NULL;
    if (!loss) return NULL; /* NULL in, NULL out: the error of whatever made it stays */
    mt_api_enter();
    if (s->disabled) return mt_api_exit(mt_tensor_ref(loss));
    if (!mt_dtype_is_floating(loss->dtype)) {
        mt_error_set(MT_ERR_DTYPE, "%s: arg 2: loss must be a floating tensor, got %s", fn,
                     mt_dtype_name(loss->dtype));
        return mt_api_exit(NULL);
    }
    bool had_state = s->t[SCALE] != NULL;
    if (!had_state && ensure_state(s, fn, loss->device) < 0) return mt_api_exit(NULL);
    /* The multiply runs on the device (no host read of the scale) in the loss's dtype, with
       autocast off so an enclosing O2 region cannot lower an FP32 loss. */
    mt_tensor *sc = same_device(s->device, loss->device) ? mt_tensor_ref(s->t[SCALE])
                                                         : mt_to(s->t[SCALE], loss->device);
    mt_tensor *sd = sc ? mt_cast(sc, loss->dtype) : NULL;
    mt_tensor_unref(sc);
    mt_autocast_token autocast = mt_autocast_suspend(); /* takes none of the user's nesting */
    mt_tensor *out = sd ? mt_mul(loss, sd) : NULL;
    mt_autocast_resume(autocast);
    mt_tensor_unref(sd);
    if (!out && !had_state) release_tensors(s); /* a failed call leaves the scaler as it was */
    return mt_api_exit(out);
}

/* ------------------------------------------------------------------ unscale, step, update */

/* o's entry since the last update, or NULL. */
static opt_state *opt_entry(const mt_grad_scaler *s, const mt_optimizer *o) {
    for (int i = 0; i < s->n_opts; i++)
        if (s->opts[i].o == o) return (opt_state *)&s->opts[i];
    return NULL;
}

static opt_state *find_opt(mt_grad_scaler *s, mt_optimizer *o, const char *fn) {
    opt_state *st = opt_entry(s, o);
    if (st) return st;
    if (s->n_opts == MAX_OPTIMIZERS) {
        mt_error_set(MT_ERR_STATE, "%s: one scaler serves at most %d optimizers per step", fn,
                     MAX_OPTIMIZERS);
        return NULL;
    }
    s->opts[s->n_opts] = (opt_state){o, NULL, false, false};
    return &s->opts[s->n_opts++];
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (mt_tensor *const *)a, y = (uintptr_t) * (mt_tensor *const *)b;
    return x < y ? -1 : x > y;
}

/* One gradient tensor set on two parameters (mt_set_grad) must be unscaled once: later
   occurrences are dropped from the list. */
static int drop_duplicates(mt_tensor **grads, int n, const char *fn) {
    mt_tensor *small[16];
    mt_tensor **sorted = n <= 16 ? small : mt_heap_alloc((size_t)n * sizeof *sorted);
    if (!sorted) return mt_error_set(MT_ERR_OOM, "%s: out of memory for %d gradients", fn, n);
    memcpy(sorted, grads, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_ptr);
    bool dup = false;
    for (int i = 1; i < n; i++) dup |= sorted[i] && sorted[i] == sorted[i - 1];
    if (sorted != small) free(sorted);
    for (int i = 0; dup && i < n; i++) /* rare: quadratic is fine */
        for (int k = 0; k < i && grads[i]; k++)
            if (grads[k] == grads[i]) grads[i] = NULL;
    return 0;
}

/* What the fused passes over o's gradients need, made before any of them runs: the list of
   gradients (duplicates dropped, overlapping ones made dense), 1/scale on the device and the
   flag. The step runs the check pass, the optimizer and the unscale pass back to back, and
   nothing that can fail comes after the optimizer has changed the parameters. */
typedef struct {
    const mt_backend *be;
    mt_tensor *small[16], **grads;
    int n;
    mt_tensor *inv, *one; /* 1/scale; 1 (check-only passes) */
} unscale_plan;

static void plan_free(unscale_plan *p) {
    mt_tensor_unref(p->inv);
    mt_tensor_unref(p->one);
    if (p->grads && p->grads != p->small) free(p->grads);
    p->grads = NULL;
    p->inv = p->one = NULL;
}

/* The gradients, checked, with expanded views replaced by dense copies. */
static int plan_grads(unscale_plan *p, mt_grad_scaler *s, mt_optimizer *o, const char *fn) {
    p->grads = o->n <= 16 ? p->small : mt_heap_alloc((size_t)o->n * sizeof *p->grads);
    if (!p->grads) return mt_error_set(MT_ERR_OOM, "%s: out of memory for %d gradients", fn, o->n);
    int n = p->n = mt_optimizer_grads(o, p->grads);
    for (int i = 0; i < n; i++) {
        mt_tensor *g = p->grads[i];
        if (!g) continue;
        if (!same_device(g->device, s->device))
            return mt_error_set(MT_ERR_DEVICE,
                                "%s: gradient of parameter %d is on %s:%d, the scaler state on "
                                "%s:%d",
                                fn, i, dev_name(g->device), g->device.index, dev_name(s->device),
                                s->device.index);
        if (!mt_dtype_is_floating(g->dtype))
            return mt_error_set(MT_ERR_DTYPE, "%s: gradient of parameter %d has dtype %s", fn, i,
                                mt_dtype_name(g->dtype));
        if (mt_optim_overlaps(g)) {
            /* elements sharing memory (an expanded view) cannot be scaled in place one at a
               time: the parameter gets a dense copy first (same values: nothing changes if
               the call fails later) */
            mt_tensor *dense = mt_clone(g);
            mt_tensor *plain = dense ? mt_detach(dense) : NULL; /* no history on a .grad */
            mt_tensor_unref(dense);
            int rc = plain ? mt_set_grad(o->params[i], plain) : mt_last_status();
            mt_tensor_unref(plain);
            if (rc) return rc;
            p->n = mt_optimizer_grads(o, p->grads); /* borrowed pointers changed */
        }
    }
    return drop_duplicates(p->grads, p->n, fn);
}

/* check: a check-only pass will run (it needs the factor 1) */
static int plan_make(unscale_plan *p, mt_grad_scaler *s, opt_state *st, const char *fn,
                     bool check) {
    *p = (unscale_plan){0};
    if (ensure_state(s, fn, st->o->device) < 0) return mt_last_status();
    if (!st->found && !(st->found = mt_scalar(0.0, MT_F32, s->device)))
        return mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    if (!(p->be = mt_backend_for(fn, s->device))) return mt_last_status();
    int rc = plan_grads(p, s, st->o, fn);
    if (rc == 0) {
        /* 1/scale on the device, in FP32 whatever the autocast state and lists say */
        mt_autocast_token autocast = mt_autocast_suspend();
        bool prev = mt_set_grad_enabled(false);
        p->inv = mt_rdiv_scalar(s->t[SCALE], 1.0);
        mt_set_grad_enabled(prev);
        mt_autocast_resume(autocast);
        if (p->inv && check) p->one = mt_scalar(1.0, MT_F32, s->device);
        if (!p->inv || (check && !p->one))
            rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    }
    if (rc) plan_free(p);
    return rc;
}

/* With data parallelism each rank makes one found-inf exchange (an all-reduce) per unscale,
   and per step of an optimizer not unscaled yet. */
static bool exchanges(const mt_grad_scaler *s) {
    return !s->disabled && s->dist && mt_dist_world_size() > 1;
}

/* A rank that fails before its exchange still takes part in it, marked failed: the others
   then fail their unscale or step as well (and change nothing), where they would otherwise
   wait for it until the timeout. Returns rc. */
static int decline(const mt_grad_scaler *s, int rc) {
    if (rc < 0 && exchanges(s)) mt_dist_all_reduce_decline("mt_all_reduce", rc);
    return rc;
}

/* Whether a step of o makes the exchange: o was not unscaled since the last update. */
static bool step_exchanges(const mt_grad_scaler *s, const mt_optimizer *o) {
    const opt_state *st = opt_entry(s, o);
    return exchanges(s) && !(st && st->unscaled);
}

/* One fused pass: found |= any inf/nan, and g *= 1/scale when `apply`. Without `apply` the
   gradients are only checked (a multiply by one, which the kernels skip), for a step whose
   optimizer kernel folds 1/scale in, so FP16 gradients are unscaled in FP32 registers
   instead of being rounded to FP16 again. */
static int plan_run(const unscale_plan *p, mt_grad_scaler *s, opt_state *st, bool apply) {
    int rc = p->be->unscale(p->grads, p->n, apply ? p->inv : p->one, st->found);
    /* every rank must take the same skip decision (and keep the same scale): a flag raised
       on one rank is raised on all before the optimizer sees it */
    if (!apply && exchanges(s))
        rc = rc == 0 ? mt_all_reduce(st->found, MT_REDUCE_MAX) : decline(s, rc);
    if (rc == 0 && apply)
        for (int i = 0; i < p->n; i++)
            if (p->grads[i]) mt_tensor_bump_version(p->grads[i]);
    return rc;
}

/* A failed unscale or step leaves the scaler as it was: the per-step entry it opened for the
   optimizer, and the device state it made from the host values, are dropped again. */
typedef struct {
    bool had_state;
    int n_opts;
} scaler_undo;

static scaler_undo undo_mark(const mt_grad_scaler *s) {
    return (scaler_undo){s->t[SCALE] != NULL, s->n_opts};
}

static int undo_if_failed(mt_grad_scaler *s, scaler_undo u, int rc) {
    if (rc == 0) return 0;
    for (int i = u.n_opts; i < s->n_opts; i++) mt_tensor_unref(s->opts[i].found);
    s->n_opts = u.n_opts;
    if (!u.had_state) release_tensors(s);
    return rc;
}

/* True (after recording why) when an earlier error of this thread is pending: the scaler
   then leaves gradients, parameters and its own state alone, so that a step written without
   checks never applies a half-made gradient (DESIGN.md: check once, at the end). */
static bool pending_error(const char *fn) {
    if (mt_last_status() == MT_OK) return false;
    mt_error_set(MT_ERR_STATE, "%s: an earlier error is pending (%s)", fn, mt_last_error());
    return true;
}

static bool any_grad(const mt_optimizer *o) {
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad) return true;
    return false;
}

int mt_grad_scaler_unscale(mt_grad_scaler *s, mt_optimizer *o) {
    const char *fn = "mt_grad_scaler_unscale";
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    if (!o) return decline(s, mt_error_set(MT_ERR_NULL, "%s: arg 2: optimizer is NULL", fn));
    if (s->disabled) return 0;
    if (pending_error(fn)) return decline(s, MT_ERR_STATE);
    mt_api_enter();
    scaler_undo undo = undo_mark(s);
    opt_state *st = find_opt(s, o, fn);
    int rc = 0;
    if (!st)
        rc = MT_ERR_STATE;
    else if (st->stepped)
        rc = mt_error_set(MT_ERR_STATE,
                          "%s: called after mt_grad_scaler_step; call mt_grad_scaler_update first",
                          fn);
    else if (st->unscaled)
        rc = mt_error_set(MT_ERR_STATE,
                          "%s: already called for this optimizer since the last update; call it "
                          "once per step, before step and update",
                          fn);
    /* an unscale that saw no gradient would let the step apply, unchecked and still scaled,
       the gradients a later backward makes (torch's step then refuses: "No inf checks") */
    else if (!any_grad(o))
        rc = mt_error_set(MT_ERR_STATE,
                          "%s: none of the optimizer's %d parameters has a gradient (nothing to "
                          "unscale or check); run backward first",
                          fn, o->n);
    if (rc < 0) return mt_api_exit_status(undo_if_failed(s, undo, decline(s, rc)));
    unscale_plan p;
    bool check = exchanges(s);
    rc = decline(s, plan_make(&p, s, st, fn, check));
    if (rc == 0) {
        /* one fused pass; with data parallelism the check and its all-reduce come first, so
           that an all-reduce that fails leaves the gradients as they were */
        if (check) rc = plan_run(&p, s, st, false);
        if (rc == 0) rc = plan_run(&p, s, st, true);
        plan_free(&p);
    }
    if (rc == 0) st->unscaled = true;
    return mt_api_exit_status(undo_if_failed(s, undo, rc));
}

int mt_grad_scaler_step(mt_grad_scaler *s, mt_optimizer *o) {
    const char *fn = "mt_grad_scaler_step";
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    /* no decline: whether the peers' step makes an exchange depends on their optimizer */
    if (!o) return mt_error_set(MT_ERR_NULL, "%s: arg 2: optimizer is NULL", fn);
    if (s->disabled) return mt_optimizer_step(o);
    /* a failure before the found-inf exchange declines it (decline), when this step makes one */
    bool exchange = step_exchanges(s, o);
    if (pending_error(fn)) return exchange ? decline(s, MT_ERR_STATE) : MT_ERR_STATE;
    mt_api_enter();
    scaler_undo undo = undo_mark(s);
    opt_state *st = find_opt(s, o, fn);
    int rc = 0;
    if (!st)
        rc = MT_ERR_STATE;
    else if (st->stepped) /* makes no exchange: the step unscaled */
        rc = mt_error_set(MT_ERR_STATE,
                          "%s: already called for this optimizer since the last update; call "
                          "mt_grad_scaler_update after each step",
                          fn);
    /* torch's "No inf checks were recorded for this optimizer": a step with no gradient at
       all is a training loop that lost its backward, not a clean step to count toward growth */
    else if (!any_grad(o))
        rc = mt_error_set(MT_ERR_STATE,
                          "%s: none of the optimizer's %d parameters has a gradient (no inf/nan "
                          "check to base the step on); run backward first",
                          fn, o->n);
    /* masters brought up to parameters written since (optimizer.c) before the exchange: an
       allocation failing there after the ranks agreed to step would step the others only */
    if (rc == 0) rc = mt_optim_masters_follow(o);
    if (rc < 0) {
        if (exchange) decline(s, rc);
        return mt_api_exit_status(undo_if_failed(s, undo, rc));
    }
    /* Not unscaled yet: a check-only pass sets found (the optimizer kernel could not know of
       an inf in a gradient it has not reached yet) and the unscale folds into the step, so a
       low-precision gradient reaches the FP32 master without a second rounding. Afterwards
       the gradients are unscaled in place, as torch's step leaves them: read after the step
       they are the true gradients. */
    bool folded = !st->unscaled;
    unscale_plan p = {0};
    rc = folded ? plan_make(&p, s, st, fn, true) : 0;
    if (rc < 0 && exchange) decline(s, rc);
    if (rc == 0 && folded) rc = plan_run(&p, s, st, false);
    if (rc == 0) rc = mt_optimizer_step_ex(o, st->found, folded ? p.inv : NULL);
    /* the parameters have changed: the step is done whatever follows. The unscale pass makes
       no allocation (the plan holds what it needs; the backends' unscale kernels allocate
       nothing), so it can only fail with a broken device, and then the step still counts */
    if (rc == 0) {
        st->unscaled = st->stepped = true;
        if (folded) rc = plan_run(&p, s, st, true);
        plan_free(&p);
        return mt_api_exit_status(rc);
    }
    plan_free(&p);
    return mt_api_exit_status(undo_if_failed(s, undo, rc));
}

int mt_grad_scaler_update(mt_grad_scaler *s) {
    const char *fn = "mt_grad_scaler_update";
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    if (s->disabled) return 0;
    if (pending_error(fn)) {
        /* the step failed somewhere: it counts neither as good nor as bad, and the next step
           starts clean (torch's update also resets the per-step state) */
        clear_step(s);
        return MT_ERR_STATE;
    }
    /* an unscale is an inf check too: a loop that unscaled, saw an inf and skipped the step
       itself still updates (torch: any recorded inf check) */
    bool any = false;
    for (int i = 0; i < s->n_opts; i++) any |= s->opts[i].stepped || s->opts[i].unscaled;
    if (!any)
        return mt_error_set(MT_ERR_STATE,
                            "%s: no mt_grad_scaler_step or unscale since the last update; call "
                            "step first",
                            fn);
    mt_api_enter();
    const mt_backend *be = mt_backend_for(fn, s->device);
    if (!be) return mt_api_exit_status(mt_last_status());
    mt_scale_update_args a = {
        .scale = s->t[SCALE],
        .good_steps = s->t[GOOD],
        .bad_steps = s->t[BAD],
        .skipped_steps = s->t[SKIPPED],
        .found_inf = s->t[FOUND_INF],
        .growth_factor = s->growth_factor,
        .backoff_factor = s->backoff_factor,
        .min_scale = s->min_scale,
        .max_scale = s->max_scale,
        .growth_interval = s->growth_interval,
        .backoff_after = s->backoff_after,
    };
    /* found_inf := max over the optimizers' flags, on the device */
    int rc = be->fill(s->t[FOUND_INF], 0.0);
    for (int i = 0; i < s->n_opts && rc == 0; i++)
        if (s->opts[i].found)
            rc = be->binary(MT_OP_MAXIMUM, s->t[FOUND_INF], s->t[FOUND_INF], s->opts[i].found);
    if (rc == 0) rc = be->scale_update(&a);
    if (rc == 0) clear_step(s);
    return mt_api_exit_status(rc);
}

int mt_grad_scaler_set_dist(mt_grad_scaler *s, bool on) {
    const char *fn = "mt_grad_scaler_set_dist";
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    if (on && !mt_dist_is_initialized())
        return mt_error_set(MT_ERR_STATE, "%s: call mt_dist_init first", fn);
    if (s->n_opts)
        return mt_error_set(MT_ERR_STATE,
                            "%s: a step is in progress; call it before scale or "
                            "after update",
                            fn);
    s->dist = on;
    return 0;
}

int mt_grad_scaler_minimize(mt_grad_scaler *s, mt_optimizer *o) {
    mt_api_enter(); /* errors inside read "mt_grad_scaler_minimize: ..." */
    int rc = mt_grad_scaler_step(s, o);
    return mt_api_exit_status(rc < 0 ? rc : mt_grad_scaler_update(s));
}

/* ------------------------------------------------------------------ reading the state */

/* The value of a state tensor on the host (a sync on a GPU); NAN on failure. */
static double read_state(const mt_tensor *t) {
    return mt_item(t);
}

float mt_grad_scaler_get_scale(mt_grad_scaler *s) {
    if (check_scaler(s, "mt_grad_scaler_get_scale") < 0) return NAN;
    if (s->disabled) return 1.0f; /* the factor the loss is multiplied by */
    return (float)(s->t[SCALE] ? read_state(s->t[SCALE]) : s->host.scale);
}

bool mt_grad_scaler_last_step_skipped(mt_grad_scaler *s) {
    if (check_scaler(s, "mt_grad_scaler_last_step_skipped") < 0 || s->disabled || !s->t[SCALE])
        return false;
    /* between unscale or step and update: this step's optimizers; afterwards: the step
       update saw */
    bool stepped = false, found = false;
    for (int i = 0; i < s->n_opts; i++)
        if (s->opts[i].stepped || s->opts[i].unscaled) {
            stepped = true;
            found |= read_state(s->opts[i].found) != 0.0;
        }
    return stepped ? found : read_state(s->t[FOUND_INF]) != 0.0;
}

int64_t mt_grad_scaler_skipped_steps(mt_grad_scaler *s) {
    if (check_scaler(s, "mt_grad_scaler_skipped_steps") < 0) return -1;
    return s->t[SCALE] ? (int64_t)read_state(s->t[SKIPPED]) : s->host.skipped_steps;
}

int mt_grad_scaler_state_get(mt_grad_scaler *s, mt_grad_scaler_state *out) {
    const char *fn = "mt_grad_scaler_state_get";
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    if (!out) return mt_error_set(MT_ERR_NULL, "%s: arg 2: output struct is NULL", fn);
    if (!s->t[SCALE]) {
        *out = s->host;
        return 0;
    }
    double v[4] = {read_state(s->t[SCALE]), read_state(s->t[GOOD]), read_state(s->t[BAD]),
                   read_state(s->t[SKIPPED])};
    for (int i = 0; i < 4; i++)
        if (isnan(v[i])) return mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    *out = (mt_grad_scaler_state){v[0], (int64_t)v[1], (int64_t)v[2], (int64_t)v[3]};
    return 0;
}

static int scaler_state_set(mt_grad_scaler *s, const mt_grad_scaler_state *in) {
    const char *fn = "mt_grad_scaler_state_set";
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    if (!in) return mt_error_set(MT_ERR_NULL, "%s: arg 2: state is NULL", fn);
    if (!((float)in->scale >= s->min_scale && (float)in->scale <= s->max_scale))
        return mt_error_set(MT_ERR_INVALID, "%s: scale %g is outside [min_scale %g, max_scale %g]",
                            fn, in->scale, s->min_scale, s->max_scale);
    if (in->good_steps < 0 || in->bad_steps < 0 || in->skipped_steps < 0)
        return mt_error_set(
            MT_ERR_INVALID, "%s: counters must be >= 0 (good %lld, bad %lld, skipped %lld)", fn,
            (long long)in->good_steps, (long long)in->bad_steps, (long long)in->skipped_steps);
    /* the counters live in F32: integers are exact up to 2^24 */
    const int64_t exact = (int64_t)1 << 24;
    if (in->good_steps > exact || in->bad_steps > exact || in->skipped_steps > exact)
        return mt_error_set(MT_ERR_INVALID, "%s: counters above 2^24 cannot be stored exactly", fn);
    if (!s->t[SCALE]) {
        s->host = *in;
        return 0;
    }
    const mt_backend *be = mt_backend_for(fn, s->device);
    if (!be) return mt_last_status();
    /* fills allocate nothing: only a broken device can stop them */
    int rc = be->fill(s->t[SCALE], in->scale);
    if (rc == 0) rc = be->fill(s->t[GOOD], (double)in->good_steps);
    if (rc == 0) rc = be->fill(s->t[BAD], (double)in->bad_steps);
    if (rc == 0) rc = be->fill(s->t[SKIPPED], (double)in->skipped_steps);
    if (rc == 0) s->host = *in;
    return rc;
}

int mt_grad_scaler_state_set(mt_grad_scaler *s, const mt_grad_scaler_state *in) {
    mt_api_enter(); /* errors inside read "mt_grad_scaler_state_set: ..." */
    return mt_api_exit_status(scaler_state_set(s, in));
}

/* ------------------------------------------------------------------ checkpoints */

static const char *const state_names[N_STATE] = {"scale", "growth_tracker", "bad_steps",
                                                 "skipped_steps", "found_inf"};
enum { H_GROWTH, H_BACKOFF, H_MIN, H_MAX, H_INTERVAL, H_AFTER, N_HPARAM };
static const char *const hparam_names[N_HPARAM] = {"growth_factor",   "backoff_factor",
                                                   "min_scale",       "max_scale",
                                                   "growth_interval", "backoff_after"};

static int scaler_key(const char *fn, char *key, size_t cap, const char *prefix, const char *name) {
    if ((size_t)snprintf(key, cap, "%s%s", prefix, name) >= cap)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 3: prefix '%s' is too long", fn, prefix);
    return 0;
}

static int scaler_put(const char *fn, mt_state *st, const char *prefix, const char *name,
                      mt_tensor *t) {
    char key[600];
    int rc = t ? scaler_key(fn, key, sizeof key, prefix, name) : (int)mt_last_status();
    if (!rc) rc = mt_state_put(st, key, t);
    mt_tensor_unref(t);
    return rc ? rc : 0;
}

/* The checks that open a state save or load: a scaler and a state, a prefix ("" for NULL),
   and no step in progress. */
static int check_state_io(const mt_grad_scaler *s, const mt_state *st, const char **prefix,
                          const char *fn) {
    if (check_scaler(s, fn) < 0) return MT_ERR_NULL;
    if (!st) return mt_error_set(MT_ERR_NULL, "%s: arg 2: state is NULL", fn);
    if (!*prefix) *prefix = "";
    if (s->n_opts)
        return mt_error_set(MT_ERR_STATE,
                            "%s: called between unscale/step and update; save or load the "
                            "scaler between training steps",
                            fn);
    return 0;
}

int mt_grad_scaler_state_save(mt_grad_scaler *s, mt_state *st, const char *prefix) {
    const char *fn = "mt_grad_scaler_state_save";
    int rc = check_state_io(s, st, &prefix, fn);
    if (rc) return rc;
    mt_api_enter();
    /* into a fresh state first, merged at the end: a failed save leaves the caller's alone */
    mt_state *dst = st;
    if (!(st = mt_state_new())) return mt_api_exit_status(mt_last_status());
    const double hp[N_HPARAM] = {s->growth_factor, s->backoff_factor,  s->min_scale,
                                 s->max_scale,     s->growth_interval, s->backoff_after};
    for (int i = 0; i < N_HPARAM && !rc; i++)
        rc = scaler_put(fn, st, prefix, hparam_names[i], mt_scalar(hp[i], MT_F64, MT_CPU));
    if (!rc) rc = scaler_put(fn, st, prefix, "disabled", mt_scalar(s->disabled, MT_BOOL, MT_CPU));
    /* copies of the device values (no host read); the host values before first use */
    const double host[N_STATE] = {s->host.scale, (double)s->host.good_steps,
                                  (double)s->host.bad_steps, (double)s->host.skipped_steps, 0.0};
    for (int i = 0; i < N_STATE && !rc; i++)
        rc = scaler_put(fn, st, prefix, state_names[i],
                        s->t[SCALE] ? mt_clone(s->t[i]) : mt_scalar(host[i], MT_F32, MT_CPU));
    if (rc == 0) rc = mt_state_merge(dst, st, fn);
    mt_state_free(st);
    return mt_api_exit_status(rc);
}

/* A one-element entry of dtype dt: its tensor (owned) and its value. */
static mt_tensor *scaler_get(const char *fn, mt_state *st, const char *prefix, const char *name,
                             mt_dtype dt, double *value) {
    char key[600];
    if (scaler_key(fn, key, sizeof key, prefix, name) < 0) return NULL;
    if (!mt_state_contains(st, key)) {
        mt_error_set(MT_ERR_INVALID, "%s: the state has no entry '%s'", fn, key);
        return NULL;
    }
    mt_tensor *t = mt_state_get(st, key);
    if (t && (t->dtype != dt || t->numel != 1)) {
        mt_error_set(MT_ERR_INVALID,
                     "%s: entry '%s' is %s with %lld elements, expected a %s scalar", fn, key,
                     mt_dtype_name(t->dtype), (long long)t->numel, mt_dtype_name(dt));
        mt_tensor_unref(t);
        return NULL;
    }
    if (t) *value = mt_item(t);
    if (t && mt_last_status() != MT_OK) { /* the read itself failed (out of memory) */
        mt_tensor_unref(t);
        return NULL;
    }
    return t;
}

/* The saved options, checked as mt_grad_scaler_new checks them. */
static int check_loaded_options(const char *fn, const double *h) {
    bool ok = (float)h[H_MIN] > 0 && h[H_MAX] >= h[H_MIN] && h[H_MAX] <= FLT_MAX &&
              isfinite(h[H_GROWTH]) && h[H_GROWTH] >= 1.0 && h[H_BACKOFF] > 0.0 &&
              h[H_BACKOFF] <= 1.0;
    for (int i = H_INTERVAL; i <= H_AFTER; i++)
        ok = ok && h[i] >= 1 && h[i] <= 16777216.0 && h[i] == floor(h[i]); /* as _new */
    if (!ok)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: saved options are invalid (growth %g, backoff %g, scale range "
                            "[%g, %g], growth_interval %g, backoff_after %g)",
                            fn, h[H_GROWTH], h[H_BACKOFF], h[H_MIN], h[H_MAX], h[H_INTERVAL],
                            h[H_AFTER]);
    return 0;
}

static int check_loaded_values(const char *fn, const double *h, const double *v) {
    /* the bounds as F32 holds them, as mt_grad_scaler_new keeps them (a file saved before
       that has them as given, a scale clamped to one just outside) */
    if (!(v[SCALE] >= (float)h[H_MIN] && v[SCALE] <= (float)h[H_MAX]))
        return mt_error_set(MT_ERR_INVALID, "%s: saved scale %g is outside [%g, %g]", fn, v[SCALE],
                            h[H_MIN], h[H_MAX]);
    /* the F32 counters stop at 2^24 (x + 1 == x there), and mt_grad_scaler_state_set refuses
       more: a larger value, or inf, is a damaged file (and no int64) */
    for (int i = GOOD; i <= SKIPPED; i++)
        if (!(v[i] >= 0 && v[i] <= 16777216.0 && v[i] == floor(v[i])))
            return mt_error_set(MT_ERR_INVALID, "%s: saved %s %g is not a count in [0, 2^24]", fn,
                                state_names[i], v[i]);
    if (v[FOUND_INF] != 0 && v[FOUND_INF] != 1)
        return mt_error_set(MT_ERR_INVALID, "%s: saved found_inf %g is not 0 or 1", fn,
                            v[FOUND_INF]);
    return 0;
}

int mt_grad_scaler_state_load(mt_grad_scaler *s, mt_state *st, const char *prefix) {
    const char *fn = "mt_grad_scaler_state_load";
    int rc = check_state_io(s, st, &prefix, fn);
    if (rc) return rc;
    mt_api_enter();
    double h[N_HPARAM], v[N_STATE], disabled = 0;
    mt_tensor *t[N_STATE] = {0}, *made[N_STATE] = {0};
    for (int i = 0; i < N_HPARAM && !rc; i++) {
        mt_tensor *x = scaler_get(fn, st, prefix, hparam_names[i], MT_F64, &h[i]);
        rc = x ? 0 : (int)mt_last_status();
        mt_tensor_unref(x);
    }
    if (!rc) {
        mt_tensor *x = scaler_get(fn, st, prefix, "disabled", MT_BOOL, &disabled);
        rc = x ? 0 : (int)mt_last_status();
        mt_tensor_unref(x);
    }
    for (int i = 0; i < N_STATE && !rc; i++)
        if (!(t[i] = scaler_get(fn, st, prefix, state_names[i], MT_F32, &v[i])))
            rc = mt_last_status();
    if (!rc) rc = check_loaded_options(fn, h);
    if (!rc) rc = check_loaded_values(fn, h, v);
    /* the device values are copied as saved (no rounding through the host); before first
       use the state is made on the entries' device and follows the parameters from there */
    mt_device dev = s->t[SCALE] ? s->device : (t[SCALE] ? t[SCALE]->device : MT_CPU);
    for (int i = 0; i < N_STATE && !rc; i++) {
        made[i] = mt_tensor_new(fn, 0, NULL, MT_F32, dev);
        if (!made[i] || mt_copy(made[i], t[i]) < 0) rc = mt_last_status();
    }
    if (!rc) {
        release_tensors(s);
        for (int i = 0; i < N_STATE; i++) {
            s->t[i] = made[i];
            made[i] = NULL;
        }
        s->device = dev;
        s->host = (mt_grad_scaler_state){v[SCALE], (int64_t)v[GOOD], (int64_t)v[BAD],
                                         (int64_t)v[SKIPPED]};
        s->growth_factor = h[H_GROWTH];
        s->backoff_factor = h[H_BACKOFF];
        s->min_scale = (float)h[H_MIN];
        s->max_scale = (float)h[H_MAX];
        s->growth_interval = (int)h[H_INTERVAL];
        s->backoff_after = (int)h[H_AFTER];
        s->disabled = disabled != 0;
    }
    for (int i = 0; i < N_STATE; i++) {
        mt_tensor_unref(t[i]);
        mt_tensor_unref(made[i]);
    }
    return mt_api_exit_status(rc);
}
