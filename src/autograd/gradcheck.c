/* Finite-difference gradient check in FP64. The analytic side is one mt_backward of
   fn(inputs) with a fixed pseudo-random cotangent v; the numeric side perturbs each element
   of each input that requires grad by +-eps and differentiates <fn(x), v> by central
   differences. fn runs inside its own scope, so it may be written like a training step
   (no releases). Device-generic: the host reads values only through mt_copy_to_host, and
   writes a perturbed element through the backend's fill kernel on a one-element header of
   the input, so inputs may live in memory the host cannot touch. */
#include <math.h>
#include <stdlib.h>
#include "../math/philox.h"
#include "../tensor/backend.h"
#include "node.h"

/* <y, v> on the host in FP64. */
static int dot_with(mt_tensor *y, const double *v, double *out) {
    mt_tensor *y64 = mt_cast(y, MT_F64);
    if (!y64) return mt_last_status();
    int64_t n = mt_numel(y64);
    double *buf = mt_heap_alloc((size_t)(n ? n : 1) * sizeof *buf);
    if (!buf) return mt_error_set(MT_ERR_OOM, "mt_gradcheck: out of memory");
    int rc = mt_copy_to_host(y64, buf, (size_t)n * sizeof *buf);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += buf[i] * v[i];
    free(buf);
    *out = s;
    return rc;
}

/* Evaluates <fn(inputs), v> without recording. */
static int eval_dot(mt_gradcheck_fn fn, mt_tensor *const *inputs, void *ctx, const double *v,
                    int64_t vn, double *out) {
    bool prev = mt_set_grad_enabled(false);
    mt_scope_begin();
    mt_tensor *y = fn(inputs, ctx);
    int rc = y ? 0 : (mt_last_status() ? (int)mt_last_status() : MT_ERR_INVALID);
    if (!y && rc == MT_ERR_INVALID)
        mt_error_set(MT_ERR_INVALID, "mt_gradcheck: fn returned NULL with no error");
    if (y && mt_numel(y) != vn)
        rc = mt_error_set(MT_ERR_SHAPE, "mt_gradcheck: fn's output changed size between calls");
    if (rc == 0) rc = dot_with(y, v, out);
    mt_scope_end();
    mt_set_grad_enabled(prev);
    return rc;
}

/* Sets logical element i of t (F64, any strides) to value, on t's device: the backend's fill
   on a one-element header over t's storage (it holds no reference and dies here; the kernel
   call takes what it needs). Not mt_fill, on purpose: the input is a leaf that requires grad,
   which mt_fill refuses, and a version bump would make a tape of the caller's that saved this
   input refuse its backward although the values are back. F64 to F64: the restore is exact. */
static int set_element(const mt_backend *be, mt_tensor *t, int64_t i, double value) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->strides[d];
        i /= t->shape[d];
    }
    mt_tensor h;
    mt_tensor_header_init(&h, t->storage, MT_F64, 1, (const int64_t[]){1}, NULL, t->offset + off);
    return be->fill(&h, value);
}

static bool has_overlap(const mt_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->strides[d] == 0) return true;
    return false;
}

static int check_inputs(mt_tensor *const *inputs, int n) {
    if (!inputs) return mt_error_set(MT_ERR_NULL, "mt_gradcheck: arg 2: inputs is NULL");
    if (n <= 0)
        return mt_error_set(MT_ERR_INVALID, "mt_gradcheck: arg 3: n is %d, expected >= 1", n);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        mt_tensor *t = inputs[i];
        if (!t) return mt_error_set(MT_ERR_NULL, "mt_gradcheck: arg 2: input %d is NULL", i);
        if (!t->requires_grad) continue;
        if (t->dtype != MT_F64)
            return mt_error_set(MT_ERR_DTYPE,
                                "mt_gradcheck: arg 2: input %d is %s; finite differences need f64",
                                i, mt_dtype_name(t->dtype));
        if (t->grad_fn)
            return mt_error_set(MT_ERR_INVALID, "mt_gradcheck: arg 2: input %d is not a leaf", i);
        if (has_overlap(t))
            return mt_error_set(MT_ERR_INVALID,
                                "mt_gradcheck: arg 2: input %d has overlapping memory (expanded)",
                                i);
        checked++;
    }
    if (!checked)
        return mt_error_set(MT_ERR_INVALID, "mt_gradcheck: arg 2: no input requires grad");
    return 0;
}

int mt_gradcheck(mt_gradcheck_fn fn, mt_tensor *const *inputs, int n, void *ctx,
                 const mt_gradcheck_opts *opts) {
    if (!fn) return mt_error_set(MT_ERR_NULL, "mt_gradcheck: arg 1: fn is NULL");
    int rc = check_inputs(inputs, n);
    if (rc) return rc;
    double eps = opts && opts->eps > 0 ? opts->eps : 1e-6;
    double atol = opts && opts->atol > 0 ? opts->atol : 1e-5;
    double rtol = opts && opts->rtol > 0 ? opts->rtol : 1e-3;

    /* keep the inputs' existing gradients aside; restore them at the end */
    mt_tensor **kept = mt_heap_calloc((size_t)n, sizeof *kept);
    if (!kept) return mt_error_set(MT_ERR_OOM, "mt_gradcheck: out of memory");
    for (int i = 0; i < n; i++) {
        kept[i] = inputs[i]->grad;
        inputs[i]->grad = NULL;
    }

    double *v = NULL;
    int64_t vn = 0;
    bool prev = mt_set_grad_enabled(true);
    mt_scope_begin();
    mt_tensor *y = fn(inputs, ctx);
    if (!y) {
        rc = mt_last_status() ? (int)mt_last_status()
                              : mt_error_set(MT_ERR_INVALID, "mt_gradcheck: fn returned NULL");
    } else if (!mt_dtype_is_floating(y->dtype)) {
        rc = mt_error_set(MT_ERR_DTYPE, "mt_gradcheck: fn's output is %s, not floating",
                          mt_dtype_name(y->dtype));
    } else if (!y->requires_grad) {
        rc = mt_error_set(MT_ERR_STATE, "mt_gradcheck: fn's output does not depend on any input "
                                        "that requires grad");
    } else {
        vn = y->numel;
        v = mt_heap_alloc((size_t)(vn ? vn : 1) * sizeof *v);
        if (!v) rc = mt_error_set(MT_ERR_OOM, "mt_gradcheck: out of memory");
        /* a fixed cotangent in [-1, 1), so the check is reproducible */
        for (int64_t i = 0; v && i < vn; i++)
            v[i] = 2.0 * mt_philox_uniform(0x9e3779b97f4a7c15ULL, 0, (uint64_t)i) - 1.0;
        mt_tensor *vt = v ? mt_from_data(v, MT_F64, y->ndim, y->shape, y->device) : NULL;
        if (v && !vt) rc = mt_last_status();
        if (rc == 0) rc = mt_backward(y, vt);
    }
    mt_scope_end();
    mt_set_grad_enabled(prev);

    for (int i = 0; rc == 0 && i < n; i++) {
        mt_tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        /* inside an api call, so the cast is a plain reference even when the caller has a
           scope open: released here, it must not also be tracked by the caller's scope */
        mt_api_enter();
        mt_tensor *g64 = x->grad ? mt_cast(x->grad, MT_F64) : NULL;
        size_t bytes = (size_t)(x->numel ? x->numel : 1) * sizeof(double);
        double *ga = mt_heap_calloc(1, bytes), *x0 = mt_heap_alloc(bytes);
        if (!ga || !x0) rc = mt_error_set(MT_ERR_OOM, "mt_gradcheck: out of memory");
        if (rc == 0 && g64) rc = mt_copy_to_host(g64, ga, (size_t)x->numel * sizeof *ga);
        mt_tensor_unref(g64);
        mt_api_exit_status(0);
        /* the input's values, read once (one wait for a device, not one per element) */
        if (rc == 0) rc = mt_copy_to_host(x, x0, (size_t)x->numel * sizeof *x0);
        const mt_backend *be = rc == 0 ? mt_backend_for("mt_gradcheck", x->device) : NULL;
        if (rc == 0 && !be) rc = mt_last_status();
        for (int64_t j = 0; rc == 0 && j < x->numel; j++) {
            double orig = x0[j], fp = 0, fm = 0;
            rc = set_element(be, x, j, orig + eps);
            if (rc == 0) rc = eval_dot(fn, inputs, ctx, v, vn, &fp);
            if (rc == 0) rc = set_element(be, x, j, orig - eps);
            if (rc == 0) rc = eval_dot(fn, inputs, ctx, v, vn, &fm);
            /* always put the element back, also after a failure: the caller's input must
               come out of the check unchanged */
            int restored = set_element(be, x, j, orig);
            if (rc == 0) rc = restored;
            if (rc) break;
            double num = (fp - fm) / (2 * eps);
            if (!(fabs(num - ga[j]) <= atol + rtol * fabs(num)))
                rc = mt_error_set(MT_ERR_STATE,
                                  "mt_gradcheck: input %d element %lld: analytic gradient %.10g, "
                                  "numeric %.10g (atol %g, rtol %g)",
                                  i, (long long)j, ga[j], num, atol, rtol);
        }
        free(x0);
        free(ga);
    }
    /* in reverse: an input given twice kept its gradient in its first slot (the later slot
       saw NULL), so the first slot must be restored last */
    for (int i = n - 1; i >= 0; i--) {
        mt_tensor_unref(inputs[i]->grad);
        inputs[i]->grad = kept[i];
    }
    free(kept);
    free(v);
    return rc;
}
