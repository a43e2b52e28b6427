/* Optimizers: SGD, Momentum, Adam, AdamW against straightforward double-precision loops;
   multi_precision masters; the fused step's found_inf / inv_scale arguments; layouts and sizes;
   error paths. Gradients are set with mt_set_grad, so these tests depend on no op's backward.
   Gradient clipping and O2 decorate: test_clip_decorate.c. */
#include "test_util.h"
#include "../src/optim/optimizer_impl.h"

#define NMAX 64

/* ---------------------------------------------------------------- reference */

typedef struct {
    mt_optim_kind kind;
    double lr, mom, b1, b2, eps, wd;
    bool nesterov;
    int t;
    double m1[NMAX], m2[NMAX];
} ref_opt;

static void ref_step(ref_opt *r, double *p, const double *g, int n) {
    r->t++;
    for (int i = 0; i < n; i++) {
        double gi = g[i];
        switch (r->kind) {
        case MT_OPTIM_SGD:
            gi += r->wd * p[i];
            p[i] -= r->lr * gi;
            break;
        case MT_OPTIM_MOMENTUM:
            gi += r->wd * p[i];
            r->m1[i] = r->mom * r->m1[i] + gi;
            p[i] -= r->lr * (r->nesterov ? gi + r->mom * r->m1[i] : r->m1[i]);
            break;
        case MT_OPTIM_ADAM:
        case MT_OPTIM_ADAMW: {
            if (r->kind == MT_OPTIM_ADAM)
                gi += r->wd * p[i];
            else
                p[i] *= 1.0 - r->lr * r->wd;
            r->m1[i] = r->b1 * r->m1[i] + (1 - r->b1) * gi;
            r->m2[i] = r->b2 * r->m2[i] + (1 - r->b2) * gi * gi;
            double bc1 = 1 - pow(r->b1, r->t), bc2 = 1 - pow(r->b2, r->t);
            p[i] -= r->lr / bc1 * r->m1[i] / (sqrt(r->m2[i]) / sqrt(bc2) + r->eps);
            break;
        }
        }
    }
}

static ref_opt ref_of(mt_optim_kind kind, bool nesterov) {
    ref_opt r = {.kind = kind,
                 .nesterov = nesterov,
                 .lr = 0.05,
                 .mom = 0.8,
                 .b1 = 0.85,
                 .b2 = 0.99,
                 .eps = 1e-6,
                 .wd = 0.1};
    return r;
}

static mt_optimizer *make_opt(const ref_opt *r, mt_tensor **ps, int n, bool mp) {
    switch (r->kind) {
    case MT_OPTIM_SGD:
        return mt_sgd_new(
            ps, n,
            &(mt_sgd_opts){.lr = MT_SET(r->lr), .weight_decay = r->wd, .multi_precision = mp});
    case MT_OPTIM_MOMENTUM:
        return mt_momentum_new(ps, n,
                               &(mt_momentum_opts){.lr = MT_SET(r->lr),
                                                   .momentum = MT_SET(r->mom),
                                                   .weight_decay = r->wd,
                                                   .nesterov = r->nesterov,
                                                   .multi_precision = mp});
    case MT_OPTIM_ADAM:
    case MT_OPTIM_ADAMW: {
        mt_adam_opts o = {.lr = MT_SET(r->lr),
                          .beta1 = MT_SET(r->b1),
                          .beta2 = MT_SET(r->b2),
                          .eps = MT_SET(r->eps),
                          .weight_decay = MT_SET(r->wd),
                          .multi_precision = mp};
        return r->kind == MT_OPTIM_ADAM ? mt_adam_new(ps, n, &o) : mt_adamw_new(ps, n, &o);
    }
    }
    return NULL;
}

/* ---------------------------------------------------------------- helpers */

static void get_values(const mt_tensor *t, double *out) {
    double *v = mt_test_values(t);
    memcpy(out, v, (size_t)mt_numel(t) * sizeof *v);
    free(v);
}

/* Adam's step count of parameter i (the counts are per parameter, as torch's). */
static double step_of(mt_optimizer *o, int i) {
    double *v = mt_test_values(o->step_count);
    double s = v[i];
    free(v);
    return s;
}

static double grad_value(int i, int step) {
    return sin(1.3 * i + 0.7 * step) * (1.0 + 0.25 * step);
}
static double init_value(int i) {
    return cos(0.9 * i) * 0.8 + 0.1;
}

/* Runs 5 steps of kind on a dtype-dt parameter and checks every step against the reference.
   Low-precision parameters: with multi_precision the master follows the reference (computed
   from the rounded start, with the rounded gradients) and the parameter is the master rounded;
   without, the reference rounds the parameter after each step. */
static void check_kind(mt_optim_kind kind, bool nesterov, mt_dtype dt, bool mp) {
    enum { N = 7, STEPS = 5 };
    ref_opt r = ref_of(kind, nesterov);
    bool low = dt == MT_F16 || dt == MT_BF16;
    double p[N], g[N];
    for (int i = 0; i < N; i++) p[i] = low ? mt_test_round_to(init_value(i), dt) : init_value(i);
    mt_tensor *w = mt_test_param(p, dt, MT_SHAPE(N));
    mt_optimizer *o = make_opt(&r, &w, 1, mp);
    assert_non_null(o);
    assert_no_error();
    double atol = dt == MT_F64 ? 1e-13 : 2e-6, rtol = dt == MT_F64 ? 1e-12 : 2e-5;
    for (int s = 0; s < STEPS; s++) {
        /* rounding each step: start each step from the stored value, so that a one-ulp
           difference (float vs double arithmetic at a rounding boundary) does not compound */
        if (low && !mp) get_values(w, p);
        for (int i = 0; i < N; i++)
            g[i] = low ? mt_test_round_to(grad_value(i, s), dt) : grad_value(i, s);
        mt_test_set_grad(w, g);
        assert_int_equal(mt_optimizer_step(o), 0);
        ref_step(&r, p, g, N);
        if (low && !mp)
            for (int i = 0; i < N; i++) p[i] = mt_test_round_to(p[i], dt);
        if (low && mp) {
            mt_tensor *m = mt_optimizer_master(o, 0);
            assert_non_null(m);
            assert_int_equal(mt_dtype_of(m), MT_F32);
            assert_on_test_device(m); /* the master lives with its parameter */
            assert_tensor_close(m, p, N, atol, rtol);
            /* the parameter is exactly the master rounded */
            mt_tensor *mr = mt_cast(m, dt);
            double want[N];
            get_values(mr, want);
            assert_tensor_close(w, want, N, 0, 0);
            mt_release(mr);
            mt_release(m);
        } else {
            /* one storage ulp when rounding each step */
            double lt = dt == MT_F16 ? 1.0 / 1024 : dt == MT_BF16 ? 1.0 / 128 : rtol;
            assert_tensor_close(w, p, N, low ? 1e-6 : atol, low ? lt : rtol);
            assert_null(mt_optimizer_master(o, 0));
        }
    }
    if (kind == MT_OPTIM_ADAM || kind == MT_OPTIM_ADAMW)
        assert_float_equal(step_of(o, 0), STEPS, 0);
    assert_no_error();
    mt_optimizer_free(o);
    mt_release(w);
}

/* ---------------------------------------------------------------- against the reference */

static void test_sgd(void **state) {
    (void)state;
    check_kind(MT_OPTIM_SGD, false, MT_F32, false);
    check_kind(MT_OPTIM_SGD, false, MT_F64, false);
    check_kind(MT_OPTIM_SGD, false, MT_F32, true); /* no effect on F32 */
    check_kind(MT_OPTIM_SGD, false, MT_F64, true);
}

static void test_momentum(void **state) {
    (void)state;
    for (int nest = 0; nest < 2; nest++) {
        check_kind(MT_OPTIM_MOMENTUM, nest, MT_F32, false);
        check_kind(MT_OPTIM_MOMENTUM, nest, MT_F64, false);
    }
}

static void test_adam(void **state) {
    (void)state;
    check_kind(MT_OPTIM_ADAM, false, MT_F32, false);
    check_kind(MT_OPTIM_ADAM, false, MT_F64, false);
}

static void test_adamw(void **state) {
    (void)state;
    check_kind(MT_OPTIM_ADAMW, false, MT_F32, false);
    check_kind(MT_OPTIM_ADAMW, false, MT_F64, false);
}

static void test_low_precision(void **state) {
    (void)state;
    mt_optim_kind kinds[] = {MT_OPTIM_SGD, MT_OPTIM_MOMENTUM, MT_OPTIM_ADAM, MT_OPTIM_ADAMW};
    mt_dtype dts[] = {MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++)
        for (int d = 0; d < 2; d++)
            for (int mp = 0; mp < 2; mp++) check_kind(kinds[k], k == 1, dts[d], mp);
}

/* p = 1.0 F16, lr * g = 1e-4 per step, 10 steps: the master reaches 1.001 and the parameter
   rounds to 1.0009766; plain F16 loses every update. */
static void test_master_keeps_small_updates(void **state) {
    (void)state;
    for (int mp = 0; mp < 2; mp++) {
        mt_tensor *w = mt_test_param((double[]){1.0}, MT_F16, MT_SHAPE(1));
        mt_optimizer *o =
            mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(1e-4), .multi_precision = mp});
        assert_non_null(o);
        for (int s = 0; s < 10; s++) {
            mt_test_set_grad(w, (double[]){-1.0});
            assert_int_equal(mt_optimizer_step(o), 0);
        }
        if (mp) {
            mt_tensor *m = mt_optimizer_master(o, 0);
            assert_tensor_close(m, ((double[]){1.001}), 1, 1e-6, 0);
            mt_release(m);
            assert_tensor_close(w, ((double[]){1.0009765625}), 1, 0, 0);
        } else {
            assert_tensor_close(w, ((double[]){1.0}), 1, 0, 0);
        }
        mt_optimizer_free(o);
        mt_release(w);
    }
    assert_no_error();
}

/* A parameter written after the optimizer was made (weights loaded into it, a broadcast,
   mt_copy) has its master remade from it before the next step, so the step carries on from
   the new values rather than from the master's old ones; a master the step keeps is kept
   (the small updates above). */
static void test_master_follows_written_parameter(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){0.0, 0.0}, MT_F16, MT_SHAPE(2));
    mt_optimizer *o =
        mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(0.125), .multi_precision = true});
    mt_state *ck = mt_state_new();
    mt_tensor *pre = mt_full(MT_SHAPE(2), MT_F16, mt_test_device(), 5.0);
    assert_int_equal(mt_state_put(ck, "w", pre), 0);
    assert_int_equal(mt_state_load_into(ck, NULL, &w, (const char *[]){"w"}, 1, true), 0);
    mt_tensor *m = mt_optimizer_master(o, 0); /* read after the write: the new values */
    assert_tensor_close(m, ((double[]){5.0, 5.0}), 2, 0, 0);
    mt_release(m);
    mt_test_set_grad(w, (double[]){1.0, 2.0});
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(w, ((double[]){4.875, 4.75}), 2, 0, 0);
    /* written again, through a view, between two steps */
    bool prev = mt_set_grad_enabled(false);
    mt_tensor *first = mt_narrow(w, 0, 0, 1);
    assert_int_equal(mt_fill(first, -1.0), 0);
    mt_set_grad_enabled(prev);
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(w, ((double[]){-1.125, 4.5}), 2, 0, 0);
    /* the state saved holds the master of the parameter as it is */
    prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_fill(first, 5.0), 0);
    mt_set_grad_enabled(prev);
    mt_state *saved = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(o, saved, "opt."), 0);
    mt_tensor *sm = mt_state_get(saved, "opt.state.0.master");
    assert_tensor_close(sm, ((double[]){5.0, 4.5}), 2, 0, 0);
    mt_release(sm);
    mt_state_free(saved);
    mt_release(first);
    mt_release(pre);
    mt_state_free(ck);
    mt_optimizer_free(o);
    mt_release(w);
    assert_no_error();
}

/* ---------------------------------------------------------------- step_ex: found_inf, inv_scale */

static void snapshot(mt_optimizer *o, double *out) {
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        mt_tensor *ts[4] = {o->params[i], o->masters ? o->masters[i] : NULL,
                            o->moment1 ? o->moment1[i] : NULL, o->moment2 ? o->moment2[i] : NULL};
        for (int j = 0; j < 4; j++) {
            if (!ts[j]) continue;
            get_values(ts[j], out + k);
            k += (int)mt_numel(ts[j]);
        }
    }
    if (o->step_count) get_values(o->step_count, out + k); /* one count per parameter */
}

static void test_found_inf_skips(void **state) {
    (void)state;
    enum { N = 5 };
    mt_dtype dts[] = {MT_F32, MT_F16, MT_F64};
    for (int d = 0; d < 3; d++) {
        for (int kind = MT_OPTIM_SGD; kind <= MT_OPTIM_ADAMW; kind++) {
            double p[N], g[N];
            for (int i = 0; i < N; i++) p[i] = init_value(i), g[i] = grad_value(i, 0);
            mt_tensor *w = mt_test_param(p, dts[d], MT_SHAPE(N));
            ref_opt r = ref_of(kind, true);
            mt_optimizer *o = make_opt(&r, &w, 1, true);
            mt_test_set_grad(w, g);
            assert_int_equal(mt_optimizer_step(o), 0); /* moments exist and are non-zero */
            double before[4 * N + 1] = {0}, after[4 * N + 1] = {0};
            snapshot(o, before);
            mt_test_set_grad(w, (double[]){1, 2, 3, 4, 5});
            mt_tensor *inf = mt_scalar(1.0, MT_F32, mt_test_device());
            mt_tensor *nan = mt_scalar(NAN, MT_F32, mt_test_device());
            mt_tensor *half = mt_scalar(0.5, MT_F32, mt_test_device());
            assert_int_equal(mt_optimizer_step_ex(o, inf, NULL), 0);
            assert_int_equal(mt_optimizer_step_ex(o, inf, half), 0);
            assert_int_equal(mt_optimizer_step_ex(o, nan, half), 0);
            snapshot(o, after);
            assert_memory_equal(before, after, sizeof before);
            if (o->step_count) assert_float_equal(step_of(o, 0), 1.0, 0);
            /* a clear flag steps */
            mt_tensor *zero = mt_scalar(0.0, MT_F32, mt_test_device());
            assert_int_equal(mt_optimizer_step_ex(o, zero, NULL), 0);
            snapshot(o, after);
            assert_memory_not_equal(before, after, sizeof before);
            if (o->step_count) assert_float_equal(step_of(o, 0), 2.0, 0);
            mt_release(zero);
            mt_release(inf);
            mt_release(nan);
            mt_release(half);
            mt_optimizer_free(o);
            mt_release(w);
        }
    }
    assert_no_error();
}

/* Stepping with gradients 1024 * g and inv_scale 1/1024 equals stepping with g; the
   gradients themselves are left as they were. */
static void test_inv_scale_folding(void **state) {
    (void)state;
    enum { N = 6 };
    mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16, MT_F64};
    for (int d = 0; d < 4; d++) {
        for (int kind = MT_OPTIM_SGD; kind <= MT_OPTIM_ADAMW; kind++) {
            double p[N], g[N], gs[N];
            for (int i = 0; i < N; i++) p[i] = init_value(i);
            mt_tensor *a = mt_test_param(p, dts[d], MT_SHAPE(N));
            mt_tensor *b = mt_test_param(p, dts[d], MT_SHAPE(N));
            ref_opt r = ref_of(kind, false);
            mt_optimizer *oa = make_opt(&r, &a, 1, true), *ob = make_opt(&r, &b, 1, true);
            mt_tensor *inv = mt_scalar(1.0 / 1024, MT_F32, mt_test_device());
            for (int s = 0; s < 3; s++) {
                for (int i = 0; i < N; i++) g[i] = grad_value(i, s), gs[i] = 1024 * g[i];
                mt_test_set_grad(a, g);
                mt_test_set_grad(b, gs);
                assert_int_equal(mt_optimizer_step(oa), 0);
                assert_int_equal(mt_optimizer_step_ex(ob, NULL, inv), 0);
                double va[N];
                get_values(a, va);
                assert_tensor_close(b, va, N, 0, 0);
                mt_tensor *gb = mt_grad(b);
                double want[N];
                for (int i = 0; i < N; i++) want[i] = mt_test_round_to(gs[i], dts[d]);
                assert_tensor_close(gb, want, N, 0, 0);
                mt_release(gb);
            }
            mt_release(inv);
            mt_optimizer_free(oa);
            mt_optimizer_free(ob);
            mt_release(a);
            mt_release(b);
        }
    }
    assert_no_error();
}

/* ---------------------------------------------------------------- grads: zero_grad, skipping */

static void test_zero_grad_and_skip(void **state) {
    (void)state;
    double pa[3] = {1, 2, 3}, pb[2] = {-1, 4};
    mt_tensor *a = mt_test_param(pa, MT_F32, MT_SHAPE(3));
    mt_tensor *b = mt_test_param(pb, MT_F32, MT_SHAPE(2));
    mt_tensor *ps[2] = {a, b};
    mt_optimizer *o = mt_adam_new(ps, 2, &(mt_adam_opts){.lr = MT_SET(0.1)});
    assert_non_null(o);
    /* no gradient at all: nothing moves, the step counts stay */
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(a, pa, 3, 0, 0);
    assert_float_equal(step_of(o, 0), 0, 0);
    assert_float_equal(step_of(o, 1), 0, 0);
    /* only a has a gradient: b is skipped and gets no state */
    mt_test_set_grad(a, (double[]){1, -1, 0.5});
    mt_tensor *grads[2];
    assert_int_equal(mt_optimizer_grads(o, grads), 2);
    assert_non_null(grads[0]);
    assert_null(grads[1]);
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(b, pb, 2, 0, 0);
    assert_null(o->moment1[1]);
    assert_null(o->moment2[1]);
    /* Adam's first step moves each element by lr (sign of g) */
    assert_tensor_close(a, ((double[]){0.9, 2.1, 2.9}), 3, 1e-6, 1e-6);
    mt_optimizer_zero_grad(o);
    assert_null(mt_grad(a));
    assert_null(mt_grad(b));
    assert_int_equal(mt_optimizer_step(o), 0); /* nothing to do after zero_grad */
    assert_tensor_close(a, ((double[]){0.9, 2.1, 2.9}), 3, 1e-6, 1e-6);
    assert_float_equal(step_of(o, 0), 1, 0); /* a counted its step, b none */
    assert_float_equal(step_of(o, 1), 0, 0);
    /* the step bumps the version of what it changed */
    mt_test_set_grad(b, (double[]){1, 1});
    uint64_t va = mt_tensor_version(a), vb = mt_tensor_version(b);
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_true(mt_tensor_version(a) == va);
    assert_true(mt_tensor_version(b) > vb);
    /* b's first update is a first Adam step (t = 1 for b, as torch counts per parameter):
       each element moves by lr */
    assert_tensor_close(b, ((double[]){-1.1, 3.9}), 2, 1e-6, 1e-6);
    assert_float_equal(step_of(o, 0), 1, 0);
    assert_float_equal(step_of(o, 1), 1, 0);
    mt_optimizer_zero_grad(NULL); /* harmless */
    mt_optimizer_free(NULL);
    mt_optimizer_free(o);
    mt_release(a);
    mt_release(b);
    assert_no_error();
}

static void test_lr(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, 2}, MT_F32, MT_SHAPE(2));
    mt_optimizer *o = mt_sgd_new(&w, 1, NULL);
    assert_float_equal(mt_optimizer_get_lr(o), 1e-3, 0);
    assert_int_equal(mt_optimizer_set_lr(o, 0.5), 0);
    assert_float_equal(mt_optimizer_get_lr(o), 0.5, 0);
    mt_test_set_grad(w, (double[]){1, -2});
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(w, ((double[]){0.5, 3.0}), 2, 0, 0);
    assert_int_equal(mt_optimizer_set_lr(o, 0), 0); /* 0 is literal here */
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(w, ((double[]){0.5, 3.0}), 2, 0, 0);
    mt_optimizer_free(o);
    mt_release(w);
    assert_no_error();
}

static void test_defaults(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1}, MT_F32, MT_SHAPE(1));
    mt_optimizer *o = mt_momentum_new(&w, 1, NULL);
    assert_float_equal(o->lr, 1e-3, 0);
    assert_float_equal(o->momentum, 0.9, 0);
    assert_float_equal(o->weight_decay, 0, 0);
    assert_false(o->nesterov);
    mt_optimizer_free(o);
    o = mt_adam_new(&w, 1, &(mt_adam_opts){0});
    assert_float_equal(o->beta1, 0.9, 0);
    assert_float_equal(o->beta2, 0.999, 0);
    assert_float_equal(o->eps, 1e-8, 0);
    assert_float_equal(o->weight_decay, 0, 0);
    mt_optimizer_free(o);
    o = mt_adamw_new(&w, 1, NULL);
    assert_float_equal(o->weight_decay, 0.01, 0); /* torch's AdamW default */
    mt_optimizer_free(o);
    o = mt_adamw_new(&w, 1, &(mt_adam_opts){.weight_decay = MT_SET(0.2)});
    assert_float_equal(o->weight_decay, 0.2, 0);
    mt_optimizer_free(o);
    mt_release(w);
    assert_no_error();
}

/* Zero, set explicitly, means zero for every option where torch accepts 0 (it used to select
   the default): the update is the one the zero gives. */
static void test_explicit_zero_options(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, -1}, MT_F32, MT_SHAPE(2));
    /* AdamW without decay and with beta1 = 0: the first step moves by lr * sign(g) exactly,
       and nothing decays the weight */
    mt_optimizer *o = mt_adamw_new(
        &w, 1, &(mt_adam_opts){.lr = MT_SET(0.5), .beta1 = MT_SET(0), .weight_decay = MT_SET(0)});
    assert_float_equal(o->weight_decay, 0, 0);
    assert_float_equal(o->beta1, 0, 0);
    mt_test_set_grad(w, (double[]){2, -4});
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(w, ((double[]){0.5, -0.5}), 2, 1e-6, 0);
    mt_optimizer_free(o);
    /* lr 0 changes nothing; momentum 0 is plain SGD; eps and beta2 0 are accepted */
    o = mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(0)});
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_tensor_close(w, ((double[]){0.5, -0.5}), 2, 1e-6, 0);
    mt_optimizer_free(o);
    o = mt_momentum_new(&w, 1, &(mt_momentum_opts){.lr = MT_SET(0.25), .momentum = MT_SET(0)});
    assert_float_equal(o->momentum, 0, 0);
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_int_equal(mt_optimizer_step(o), 0); /* no velocity carried over */
    assert_tensor_close(w, ((double[]){-0.5, 1.5}), 2, 1e-6, 0);
    mt_optimizer_free(o);
    o = mt_adam_new(&w, 1, &(mt_adam_opts){.beta2 = MT_SET(0), .eps = MT_SET(0)});
    assert_non_null(o);
    assert_float_equal(o->beta2, 0, 0);
    assert_float_equal(o->eps, 0, 0);
    mt_optimizer_free(o);
    mt_release(w);
    assert_no_error();
}

/* A plain number where MT_SET belongs (brace elision puts it in .value; -Wall warns) is
   refused, not silently replaced by the default. Built field by field, as code compiled
   without -Wall could have it. */
static void test_plain_number_refused(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1}, MT_F32, MT_SHAPE(1));
    mt_adam_opts o = {0};
    o.weight_decay.value = 0.1; /* what `.weight_decay = 0.1` gives */
    assert_null(mt_adamw_new(&w, 1, &o));
    assert_error(MT_ERR_INVALID,
                 "weight_decay is 0.1 without MT_SET: write .weight_decay = MT_SET(0.1)");
    mt_release(w);
}

/* ---------------------------------------------------------------- layouts and sizes */

/* A parameter that is a strided view (every other element of a buffer) and a gradient that
   is an expanded row: the elements between stay untouched. */
static void test_strided(void **state) {
    (void)state;
    mt_dtype dts[] = {MT_F32, MT_F16, MT_F64};
    for (int d = 0; d < 3; d++) {
        for (int mp = 0; mp < 2; mp++) {
            double base_v[12];
            for (int i = 0; i < 12; i++) base_v[i] = i;
            mt_tensor *base = mt_test_tensor(base_v, dts[d], MT_SHAPE(12));
            /* [2, 3] with strides [6, 2] at offset 1: elements 1, 3, 5, 7, 9, 11 */
            mt_tensor *w = mt_tensor_view_of(base, 2, (int64_t[]){2, 3}, (int64_t[]){6, 2}, 1);
            mt_set_requires_grad(w, true);
            mt_tensor *row = mt_test_tensor((double[]){1, 2, 4}, dts[d], MT_SHAPE(1, 3));
            mt_tensor *g = mt_tensor_expand_to(row, 2, (int64_t[]){2, 3});
            assert_int_equal(mt_set_grad(w, g), 0);
            mt_optimizer *o =
                mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(0.5), .multi_precision = mp});
            assert_int_equal(mt_optimizer_step(o), 0);
            double want[6] = {0.5, 2, 3, 6.5, 8, 9};
            assert_tensor_close(w, want, 6, 0, 0);
            double all[12] = {0, 0.5, 2, 2, 4, 3, 6, 6.5, 8, 8, 10, 9};
            assert_tensor_close(base, all, 12, 0, 0);
            assert_tensor_close(g, ((double[]){1, 2, 4, 1, 2, 4}), 6, 0, 0);
            mt_optimizer_free(o);
            mt_release(g);
            mt_release(row);
            mt_release(w);
            mt_release(base);
        }
    }
    assert_no_error();
}

/* Whether parameter k has a gradient at step s of test_many_and_large: some never until the
   last step (their first update there is a first Adam step), some miss the middle one. */
static bool many_has_grad(int k, int s) {
    return s == 2 || (k % 7 != 5 && (s == 0 || k % 3 != 1));
}

/* Many parameters (more than the kernel plans on its stack), some large enough to be split
   across threads, some without a gradient at some steps (Adam's step counts, one per
   parameter, then differ), in every dtype. */
static void test_many_and_large(void **state) {
    (void)state;
    enum { NP = 41 };
    mt_tensor *ps[NP];
    double *vals[NP];
    int64_t sizes[NP];
    mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16, MT_F64};
    for (int k = 0; k < NP; k++) {
        sizes[k] = k % 10 == 3 ? 70001 + k : 17 * k + 1;
        vals[k] = malloc((size_t)sizes[k] * sizeof(double));
        for (int64_t i = 0; i < sizes[k]; i++) vals[k][i] = init_value((int)(i % 1000) + k);
        ps[k] = mt_test_param(vals[k], dts[k % 4], 1, &sizes[k]);
        get_values(ps[k], vals[k]); /* the rounded start */
    }
    mt_optimizer *o =
        mt_adamw_new(ps, NP, &(mt_adam_opts){.lr = MT_SET(0.01), .multi_precision = true});
    assert_non_null(o);
    enum { STEPS = 3 };
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < NP; k++) {
            if (!many_has_grad(k, s)) {
                assert_int_equal(mt_set_grad(ps[k], NULL), 0);
                continue;
            }
            double *g = malloc((size_t)sizes[k] * sizeof *g);
            for (int64_t i = 0; i < sizes[k]; i++) g[i] = grad_value((int)(i % 997), s + k);
            mt_test_set_grad(ps[k], g);
            free(g);
        }
        assert_int_equal(mt_optimizer_step(o), 0);
    }
    for (int k = 0; k < NP; k++) {
        mt_dtype dt = dts[k % 4];
        double *want = malloc((size_t)sizes[k] * sizeof *want);
        memcpy(want, vals[k], (size_t)sizes[k] * sizeof *want);
        /* element i of parameter k sees the same reference as a 1-element run over the
           steps that gave k a gradient (ref_step counts them) */
        int steps = 0;
        for (int64_t i = 0; i < sizes[k]; i++) {
            ref_opt r = {.kind = MT_OPTIM_ADAMW,
                         .lr = 0.01,
                         .b1 = 0.9,
                         .b2 = 0.999,
                         .eps = 1e-8,
                         .wd = 0.01};
            for (int s = 0; s < STEPS; s++) {
                if (!many_has_grad(k, s)) continue;
                double g = grad_value((int)(i % 997), s + k);
                if (dt != MT_F32 && dt != MT_F64) g = mt_test_round_to(g, dt);
                ref_step(&r, &want[i], &g, 1);
            }
            steps = r.t;
        }
        assert_float_equal(step_of(o, k), steps, 0);
        mt_tensor *check = ps[k];
        mt_tensor *m = mt_optimizer_master(o, k);
        if (m) check = m; /* low-precision: the master holds the exact result */
        assert_tensor_close(check, want, sizes[k], 1e-6, 1e-5);
        mt_release(m);
        free(want);
    }
    mt_optimizer_free(o);
    for (int k = 0; k < NP; k++) {
        mt_release(ps[k]);
        free(vals[k]);
    }
    assert_no_error();
}

/* ---------------------------------------------------------------- errors */

static void test_create_errors(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, 2}, MT_F32, MT_SHAPE(2));
    mt_tensor *nog = mt_ones(MT_SHAPE(2), MT_F32, mt_test_device());
    mt_tensor *i64 = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    mt_tensor *y = mt_mul_scalar(w, 2.0);
    assert_non_null(y);

    assert_null(mt_sgd_new(NULL, 1, NULL));
    assert_error(MT_ERR_NULL, "mt_sgd_new: arg 1: params is NULL");
    assert_null(mt_momentum_new(&w, 0, NULL));
    assert_error(MT_ERR_INVALID, "mt_momentum_new: arg 2: n is 0, expected at least one");
    /* Nesterov without momentum (torch.optim.SGD refuses it too) */
    assert_null(
        mt_momentum_new(&w, 1, &(mt_momentum_opts){.momentum = MT_SET(0), .nesterov = true}));
    assert_error(MT_ERR_INVALID, "mt_momentum_new: arg 3: nesterov needs a momentum above 0");
    mt_tensor *ps[2] = {w, NULL};
    assert_null(mt_adam_new(ps, 2, NULL));
    assert_error(MT_ERR_NULL, "mt_adam_new: arg 1: params[1] is NULL");
    ps[1] = y;
    assert_null(mt_adamw_new(ps, 2, NULL));
    assert_error(MT_ERR_STATE,
                 "mt_adamw_new: arg 1: params[1] is not a leaf (made by mt_mul_scalar)");
    ps[1] = i64;
    assert_null(mt_sgd_new(ps, 2, NULL));
    assert_error(MT_ERR_DTYPE, "params[1] has dtype i64; parameters must be floating");
    ps[1] = nog;
    assert_null(mt_sgd_new(ps, 2, NULL));
    assert_error(MT_ERR_STATE, "params[1] does not require grad");
    ps[1] = w;
    assert_null(mt_sgd_new(ps, 2, NULL));
    assert_error(MT_ERR_INVALID, "params[0] and params[1] are the same tensor");
    /* a parameter on another device: a header copy (never retained) marked with a device
       other than the one under test, deliberately a literal: cuda:0 when testing the CPU, the
       CPU when testing a GPU */
    mt_tensor fake;
    memcpy(&fake, w, sizeof fake);
    fake.device = mt_test_device_is_cpu() ? MT_CUDA(0) : MT_CPU;
    ps[1] = &fake;
    assert_null(mt_sgd_new(ps, 2, NULL));
    char want[96];
    snprintf(want, sizeof want, "params[1] is on %s:%d but params[0] is on %s:%d",
             fake.device.type == MT_DEVICE_CPU ? "cpu" : "cuda", fake.device.index,
             mt_test_device_is_cpu() ? "cpu" : "cuda", mt_test_device().index);
    assert_error(MT_ERR_DEVICE, want);
    /* an expanded parameter cannot be updated in place */
    mt_tensor *s = mt_scalar(1.0, MT_F32, mt_test_device());
    mt_tensor *ex = mt_tensor_expand_to(s, 1, (int64_t[]){3});
    mt_set_requires_grad(ex, true);
    assert_null(mt_sgd_new(&ex, 1, NULL));
    assert_error(MT_ERR_INVALID, "params[0] has overlapping memory");
    mt_release(ex);
    mt_release(s);

    /* options */
    assert_null(mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(-0.1)}));
    assert_error(MT_ERR_INVALID,
                 "mt_sgd_new: arg 3: lr -0.1 is invalid: expected a finite value >= 0");
    assert_null(mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(NAN)}));
    assert_error(MT_ERR_INVALID, "lr nan is invalid");
    assert_null(mt_sgd_new(&w, 1, &(mt_sgd_opts){.weight_decay = -1}));
    assert_error(MT_ERR_INVALID, "weight_decay -1 is invalid");
    assert_null(mt_momentum_new(&w, 1, &(mt_momentum_opts){.momentum = MT_SET(-0.5)}));
    assert_error(MT_ERR_INVALID, "mt_momentum_new: arg 3: momentum -0.5 is invalid");
    assert_null(mt_adam_new(&w, 1, &(mt_adam_opts){.beta1 = MT_SET(1.0)}));
    assert_error(MT_ERR_INVALID, "beta1 1 is invalid: expected a value in [0, 1)");
    assert_null(mt_adam_new(&w, 1, &(mt_adam_opts){.beta2 = MT_SET(-0.1)}));
    assert_error(MT_ERR_INVALID, "beta2 -0.1 is invalid");
    assert_null(mt_adamw_new(&w, 1, &(mt_adam_opts){.eps = MT_SET(-1e-8)}));
    assert_error(MT_ERR_INVALID, "eps -1e-08 is invalid");
    assert_null(mt_adamw_new(&w, 1, &(mt_adam_opts){.weight_decay = MT_SET(-0.01)}));
    assert_error(MT_ERR_INVALID, "mt_adamw_new: arg 3: weight_decay -0.01 is invalid");
    assert_null(mt_adam_new(&w, 1, &(mt_adam_opts){.lr = MT_SET(INFINITY)}));
    assert_error(MT_ERR_INVALID, "lr inf is invalid");

    mt_release(y);
    mt_release(i64);
    mt_release(nog);
    mt_release(w);
}

static void test_use_errors(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, 2}, MT_F32, MT_SHAPE(2));
    mt_optimizer *o = mt_adam_new(&w, 1, NULL);
    mt_test_set_grad(w, (double[]){1, 1});

    assert_int_equal(mt_optimizer_step(NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_optimizer_step: arg 1: optimizer is NULL");
    mt_tensor *f64 = mt_scalar(0, MT_F64, mt_test_device()),
              *two = mt_zeros(MT_SHAPE(2), MT_F32, mt_test_device());
    assert_int_equal(mt_optimizer_step_ex(o, f64, NULL), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "arg 2: found_inf must be a one-element f32 tensor, got f64");
    assert_int_equal(mt_optimizer_step_ex(o, NULL, two), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID,
                 "arg 3: inv_scale must be a one-element f32 tensor, got f32 with 2");
    assert_float_equal(step_of(o, 0), 0, 0); /* refused steps changed nothing */
    assert_tensor_close(w, ((double[]){1, 2}), 2, 0, 0);

    assert_int_equal(mt_optimizer_set_lr(NULL, 1), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_optimizer_set_lr: arg 1: optimizer is NULL");
    assert_int_equal(mt_optimizer_set_lr(o, -1), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_optimizer_set_lr: arg 2: lr -1 is invalid");
    assert_int_equal(mt_optimizer_set_lr(o, NAN), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "lr nan is invalid");
    assert_float_equal(mt_optimizer_get_lr(o), 1e-3, 0);
    assert_true(isnan(mt_optimizer_get_lr(NULL)));
    assert_error(MT_ERR_NULL, "mt_optimizer_get_lr: arg 1: optimizer is NULL");

    assert_null(mt_optimizer_master(NULL, 0)); /* NULL in, NULL out, no error */
    assert_no_error();
    assert_null(mt_optimizer_master(o, 1));
    assert_error(MT_ERR_INVALID, "mt_optimizer_master: arg 2: index 1 is out of range for 1");
    assert_null(mt_optimizer_master(o, -1));
    assert_error(MT_ERR_INVALID, "index -1 is out of range");
    assert_int_equal(mt_optimizer_grads(o, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_optimizer_grads: arg 2: grads is NULL");

    assert_true(isnan(mt_clip_grad_norm(NULL, 1)));
    assert_error(MT_ERR_NULL, "mt_clip_grad_norm: arg 1: optimizer is NULL");
    assert_true(isnan(mt_clip_grad_norm(o, -1)));
    assert_error(MT_ERR_INVALID, "mt_clip_grad_norm: arg 2: max_norm -1 is invalid");
    assert_true(isnan(mt_clip_grad_norm(o, NAN)));
    assert_error(MT_ERR_INVALID, "max_norm nan is invalid");

    /* the first error sticks through a chain of calls on a failed optimizer */
    mt_optimizer *bad = mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(-1)});
    mt_optimizer_zero_grad(bad);
    assert_int_equal(mt_optimizer_step(bad), MT_ERR_NULL);
    mt_optimizer_free(bad);
    assert_error(MT_ERR_INVALID, "mt_sgd_new: arg 3: lr -1 is invalid");

    mt_release(f64);
    mt_release(two);
    mt_optimizer_free(o);
    mt_release(w);
}

/* Scope use: a master handed out inside a scope belongs to it; the optimizer's state does
   not. */
static void test_scope(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, 2}, MT_BF16, MT_SHAPE(2));
    mt_tensor *g = mt_ones(MT_SHAPE(2), MT_BF16, mt_test_device());
    int64_t live = mt_live_tensors();
    mt_scope_begin();
    mt_optimizer *o = mt_adam_new(&w, 1, &(mt_adam_opts){.multi_precision = true});
    assert_int_equal(mt_set_grad(w, g), 0);
    assert_int_equal(mt_optimizer_step(o), 0);
    mt_tensor *m = mt_optimizer_master(o, 0);
    assert_non_null(m);
    mt_scope_end();
    /* the scope released only its handle on the master: the master, the moments and the
       step count live on */
    assert_int_equal(mt_live_tensors(), live + 4);
    assert_int_equal(mt_optimizer_step(o), 0);
    mt_optimizer_free(o);
    mt_release(g);
    mt_release(w);
    assert_no_error();
}

/* Out of memory is an error that leaves everything as it was. */
static void test_out_of_memory(void **state) {
    (void)state;
    enum { N = 1000 };
    double v[N];
    for (int i = 0; i < N; i++) v[i] = init_value(i);
    mt_tensor *h = mt_test_param(v, MT_F16, MT_SHAPE(N));
    mt_tensor *w = mt_test_param(v, MT_F32, MT_SHAPE(N));
    mt_test_set_grad(w, v);
    mt_optimizer *o = mt_adam_new(&w, 1, NULL);
    mt_debug_set_alloc_limit(1000);
    /* the FP32 master (4000 bytes) cannot be allocated */
    assert_null(mt_sgd_new(&h, 1, &(mt_sgd_opts){.multi_precision = true}));
    assert_error(MT_ERR_OOM, "mt_sgd_new: out of memory");
    /* nor can Adam's moments at the first step */
    assert_int_equal(mt_optimizer_step(o), MT_ERR_OOM);
    assert_error(MT_ERR_OOM, "mt_optimizer_step: out of memory");
    mt_debug_set_alloc_limit(0);
    assert_tensor_close(w, v, N, 1e-7, 1e-7);
    assert_float_equal(step_of(o, 0), 0, 0);
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_float_equal(step_of(o, 0), 1, 0);
    mt_optimizer_free(o);
    mt_release(w);
    mt_release(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_sgd),
        MT_TEST(test_momentum),
        MT_TEST(test_adam),
        MT_TEST(test_adamw),
        MT_TEST(test_low_precision),
        MT_TEST(test_master_keeps_small_updates),
        MT_TEST(test_master_follows_written_parameter),
        MT_TEST(test_found_inf_skips),
        MT_TEST(test_inv_scale_folding),
        MT_TEST(test_zero_grad_and_skip),
        MT_TEST(test_lr),
        MT_TEST(test_defaults),
        MT_TEST(test_explicit_zero_options),
        MT_TEST(test_plain_number_refused),
        MT_TEST(test_strided),
        MT_TEST(test_many_and_large),
        MT_TEST(test_create_errors),
        MT_TEST(test_use_errors),
        MT_TEST(test_scope),
        MT_TEST(test_out_of_memory),
    };
    return MT_RUN_TESTS(tests);
}
