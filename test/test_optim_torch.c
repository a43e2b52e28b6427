/* Optimizers against torch.optim itself: trajectories recorded by tools/gen_golden_optim.py
   (test/data/optim_torch.txt) from SGD, SGD with momentum or Nesterov, Adam and AdamW, in F32
   and F64, over several parameters and steps, with learning-rate changes and steps that leave a
   parameter without a gradient (torch skips it, and Adam's step count, per parameter as
   torch's state[p]["step"], does not advance for it). test_optim checks the formulas against
   double-precision loops; this pins them, and the step bookkeeping, to torch's results. */
#include "test_util.h"
#include "golden_reader.h"
#include "../src/optim/optimizer_impl.h"

#ifndef MT_TEST_DATA_DIR
#define MT_TEST_DATA_DIR "test/data"
#endif

enum { MAX_PARAMS = 4 };

typedef struct {
    mt_optim_kind kind;
    double lr, momentum, beta1, beta2, eps, wd;
    bool nesterov;
} hyper;

static bool word(golden_lexer *lx, const char *want) {
    const char *t = golden_token(lx);
    return t && strcmp(t, want) == 0;
}

static bool kind_parse(const char *s, mt_optim_kind *k) {
    static const char *const names[] = {"sgd", "momentum", "adam", "adamw"};
    static const mt_optim_kind kinds[] = {MT_OPTIM_SGD, MT_OPTIM_MOMENTUM, MT_OPTIM_ADAM,
                                          MT_OPTIM_ADAMW};
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *k = kinds[i];
            return true;
        }
    return false;
}

static mt_optimizer *make_optimizer(const hyper *h, mt_tensor **ps, int n) {
    switch (h->kind) {
    case MT_OPTIM_SGD:
        return mt_sgd_new(ps, n, &(mt_sgd_opts){.lr = MT_SET(h->lr), .weight_decay = h->wd});
    case MT_OPTIM_MOMENTUM:
        return mt_momentum_new(ps, n,
                               &(mt_momentum_opts){.lr = MT_SET(h->lr),
                                                   .momentum = MT_SET(h->momentum),
                                                   .weight_decay = h->wd,
                                                   .nesterov = h->nesterov});
    case MT_OPTIM_ADAM:
    case MT_OPTIM_ADAMW: {
        mt_adam_opts o = {.lr = MT_SET(h->lr),
                          .beta1 = MT_SET(h->beta1),
                          .beta2 = MT_SET(h->beta2),
                          .eps = MT_SET(h->eps),
                          .weight_decay = MT_SET(h->wd)};
        return h->kind == MT_OPTIM_ADAM ? mt_adam_new(ps, n, &o) : mt_adamw_new(ps, n, &o);
    }
    }
    return NULL;
}

static mt_tensor *tensor_of(const golden_tensor *g) {
    return mt_test_tensor(g->v, g->dt, g->ndim, g->shape);
}

/* Runs one case from "kind" to "end" on the device under test; false: the file is malformed. */
static bool run_case(golden_lexer *lx, const char *name) {
    hyper h = {0};
    long long n, nesterov, ngrads, idx;
    if (!word(lx, "kind") || !kind_parse(golden_token(lx), &h.kind) || !word(lx, "hyper"))
        return false;
    double *hv[] = {&h.lr, &h.momentum, &h.beta1, &h.beta2, &h.eps, &h.wd};
    for (int i = 0; i < 6; i++)
        if (!golden_number(lx, hv[i])) return false;
    if (!golden_int(lx, 0, 1, &nesterov) || !word(lx, "nparams") ||
        !golden_int(lx, 1, MAX_PARAMS, &n))
        return false;
    h.nesterov = nesterov;
    mt_tensor *ps[MAX_PARAMS] = {0};
    golden_tensor gt;
    for (int i = 0; i < n; i++) {
        if (!word(lx, "param") || !golden_tensor_parse(lx, &gt, false)) return false;
        ps[i] = tensor_of(&gt);
        mt_set_requires_grad(ps[i], true);
        free(gt.v);
    }
    mt_optimizer *o = make_optimizer(&h, ps, (int)n);
    if (!o) fail_msg("%s: %s", name, mt_last_error());
    bool ok = true;
    for (int step = 0;; step++) {
        const char *t = golden_token(lx);
        if (t && strcmp(t, "end") == 0) break;
        double lr;
        if (!t || strcmp(t, "step") != 0 || !golden_number(lx, &lr) ||
            !golden_int(lx, 0, n, &ngrads)) {
            ok = false;
            break;
        }
        assert_int_equal(mt_optimizer_set_lr(o, lr), 0);
        for (int i = 0; i < n; i++) assert_int_equal(mt_set_grad(ps[i], NULL), 0);
        for (int k = 0; k < ngrads && ok; k++) {
            ok = word(lx, "grad") && golden_int(lx, 0, n - 1, &idx) &&
                 golden_tensor_parse(lx, &gt, false);
            if (!ok) break;
            mt_tensor *g = tensor_of(&gt);
            assert_int_equal(mt_set_grad(ps[idx], g), 0);
            mt_release(g);
            free(gt.v);
        }
        if (ok && mt_optimizer_step(o) != 0)
            fail_msg("%s: step %d: %s", name, step, mt_last_error());
        for (int i = 0; i < n && ok; i++) {
            ok = word(lx, "expect") && golden_int(lx, i, i, &idx) &&
                 golden_tensor_parse(lx, &gt, false);
            if (!ok) break;
            /* F64: the same formulas in another order; F32: torch's single-tensor loops
               round each intermediate to F32, mixtape folds constants in double */
            bool f64 = gt.dt == MT_F64;
            double atol = f64 ? 1e-14 : 1e-6, rtol = f64 ? 1e-12 : 1e-5;
            double *v = mt_test_values(ps[i]);
            for (int64_t e = 0; e < gt.n; e++)
                if (!(fabs(v[e] - gt.v[e]) <= atol + rtol * fabs(gt.v[e])))
                    fail_msg("%s: step %d: params[%d] element %lld is %.17g, torch %.17g", name,
                             step, i, (long long)e, v[e], gt.v[e]);
            free(v);
            free(gt.v);
        }
        if (!ok) break;
    }
    mt_optimizer_free(o);
    for (int i = 0; i < n; i++) mt_release(ps[i]);
    return ok;
}

static void test_torch_trajectories(void **state) {
    (void)state;
    const char *path = MT_TEST_DATA_DIR "/optim_torch.txt";
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
    text[size] = '\0';
    fclose(f);
    golden_lexer lx = {text, 1};
    int cases = 0;
    const char *t;
    while ((t = golden_token(&lx))) {
        char name[128];
        const char *nm = strcmp(t, "case") == 0 ? golden_token(&lx) : NULL;
        if (!nm) fail_msg("%s:%d: expected 'case <name>'", path, lx.line);
        snprintf(name, sizeof name, "%s", nm);
        if (!run_case(&lx, name)) fail_msg("%s:%d: malformed case %s", path, lx.line, name);
        cases++;
    }
    free(text);
    assert_int_equal(cases, 30); /* every case of the generator ran */
    assert_no_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_torch_trajectories),
    };
    return MT_RUN_TESTS(tests);
}
