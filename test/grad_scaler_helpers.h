/* Shared by the GradScaler test programs (test_grad_scaler.c: the scaler's own rules;
   test_grad_scaler_step.c: what its unscale and step do to gradients, parameters and
   optimizers): parameters and scaled gradients set up by hand. */
#ifndef MT_TEST_GRAD_SCALER_HELPERS_H
#define MT_TEST_GRAD_SCALER_HELPERS_H

#include "test_util.h"

/* Exact equality (NaN matches NaN, inf matches inf of the same sign). */
#define assert_same(t, want, n) assert_tensor_close((t), (want), (n), 0, 0)

/* A leaf parameter of dtype dt holding v[0..n). */
static inline mt_tensor *param(const double *v, int64_t n, mt_dtype dt) {
    mt_tensor *d = mt_from_data(v, MT_F64, 1, (const int64_t[]){n}, mt_test_device());
    mt_tensor *p = mt_cast(d, dt);
    if (p == d) { /* F64: a private copy, so the parameter is its own leaf */
        mt_test_drop(p);
        p = mt_clone(d);
    }
    mt_test_drop(d);
    mt_set_requires_grad(p, true);
    return p;
}

/* Sets p.grad = g * scale (what backward of a scaled loss gives), in p's dtype; `poison`
   (inf or nan) replaces element 0 when non-zero. */
static inline void set_grad(mt_tensor *p, const double *g, double scale, double poison) {
    int64_t n = mt_numel(p);
    double v[16];
    assert_true(n <= 16);
    /* memcpy, then scale in place: GCC 12 at -O3 -march=native vectorises a loop reading g
       with masked loads and warns that a one-element compound literal may be uninitialised */
    memcpy(v, g, (size_t)n * sizeof *g);
    for (int64_t i = 0; i < n; i++) v[i] *= scale;
    if (poison != 0) v[0] = poison;
    mt_tensor *c = mt_test_tensor(v, mt_dtype_of(p), 1, (const int64_t[]){n});
    assert_int_equal(mt_set_grad(p, c), 0);
    mt_test_drop(c);
}

#endif
