/* mt_layer_norm: normalisation over the trailing normalized_ndim dims, as
   torch.nn.functional.layer_norm. MIXED autocast rule: the activation keeps its dtype under
   O1/O2, weight and bias (and the saved statistics) are FP32 (F64 for F64 activations); the
   kernel reads both directly. The tape node saves x, weight, mean and rstd; the backward is
   one fused kernel. */
#include <math.h>
#include "dispatch.h"

static const char *const NAME = "mt_layer_norm";

/* saved: 0 x (contiguous), 1 weight or NULL, 2 mean, 3 rstd */
static int ln_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *x = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3];
    mt_tensor *gy = mt_dispatch_dense(g, x->dtype), *grads[3] = {0};
    int rc = gy ? 0 : mt_backward_failed();
    for (int i = 0; i < 3 && rc == 0; i++) {
        if (!mt_node_needs(n, i)) continue;
        const mt_input_meta *m = &n->inputs[i];
        grads[i] = mt_tensor_new(NAME, m->ndim, m->shape, m->dtype, x->device);
        if (!grads[i]) rc = MT_ERR_OOM;
    }
    const mt_backend *be = mt_backend_get(x->device);
    if (rc == 0 && x->numel == 0) /* no rows: the sums over them are 0 */
        for (int i = 0; i < 3 && rc == 0; i++) rc = grads[i] ? be->fill(grads[i], 0.0) : 0;
    else if (rc == 0)
        rc = be->layer_norm_backward(grads[0], grads[1], grads[2], gy, x, mean, rstd, w);
    mt_tensor_unref(gy);
    for (int i = 0; i < 3; i++) {
        if (rc == 0)
            gi[i] = grads[i];
        else
            mt_tensor_unref(grads[i]);
    }
    return rc;
}

static int check_param(int arg, const char *what, const mt_tensor *p, const mt_tensor *x, int nd) {
    if (!p) return 0;
    if (mt_check_floating(NAME, arg, p) < 0 || mt_check_same_device(NAME, x, p) < 0) return -1;
    bool ok = p->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = p->shape[i] == x->shape[x->ndim - nd + i];
    if (ok) return 0;
    char a[MT_SHAPE_BUF], b[MT_SHAPE_BUF];
    return mt_error_set(MT_ERR_SHAPE,
                        "%s: arg %d: %s shape %s must equal the last %d dims of input %s", NAME,
                        arg, what, mt_shape_str(p, a, sizeof a), nd, mt_shape_str(x, b, sizeof b));
}

static int validate(mt_tensor *x, int nd, mt_tensor *w, mt_tensor *b, double eps) {
    if (mt_check_floating(NAME, 1, x) < 0) return -1;
    if (nd < 1 || nd > x->ndim) {
        char s[MT_SHAPE_BUF];
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 2: normalized_ndim %d must be in [1, %d] for input %s", NAME,
                            nd, x->ndim, mt_shape_str(x, s, sizeof s));
    }
    if (!(eps >= 0) || !isfinite(eps))
        return mt_error_set(MT_ERR_INVALID, "%s: arg 5: eps %g must be finite and >= 0", NAME, eps);
    if (check_param(3, "weight", w, x, nd) < 0 || check_param(4, "bias", b, x, nd) < 0) return -1;
    return 0;
}

static int record(mt_tensor *const *in, mt_tensor *y, mt_tensor *mean, mt_tensor *rstd) {
    int rc = 0;
    mt_node *node = mt_record(MT_OP_LAYER_NORM, ln_backward, in, 3, y, &rc);
    if (!node) return rc;
    rc = mt_node_save(node, 0, in[0]);
    if (!rc && in[1]) rc = mt_node_save(node, 1, in[1]);
    if (!rc) rc = mt_node_save(node, 2, mean);
    if (!rc) rc = mt_node_save(node, 3, rstd);
    return rc;
}

static mt_tensor *layer_norm(mt_tensor *x, int nd, mt_tensor *w, mt_tensor *b, double eps) {
    if (validate(x, nd, w, b, eps) < 0) return NULL;
    mt_tensor *in[3] = {x, w, b}, *c[3], *d[3] = {0};
    int compute = mt_dispatch_mixed(MT_OP_LAYER_NORM, in, 3, 0, c);
    if (compute < 0) return NULL;
    mt_dtype acc = mt_norm_acc_dtype((mt_dtype)compute);
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        if (c[i] && !(d[i] = mt_dispatch_dense(c[i], c[i]->dtype))) rc = mt_backward_failed();
    int64_t rows = 1;
    for (int i = 0; i < x->ndim - nd; i++) rows *= x->shape[i];
    mt_tensor *mean = rc ? NULL : mt_tensor_new(NAME, 1, &rows, acc, x->device);
    mt_tensor *rstd = mean ? mt_tensor_new(NAME, 1, &rows, acc, x->device) : NULL;
    mt_tensor *y =
        rstd ? mt_tensor_new(NAME, x->ndim, x->shape, (mt_dtype)compute, x->device) : NULL;
    if (rc == 0 && !y) rc = MT_ERR_OOM;
    if (rc == 0) rc = mt_backend_get(x->device)->layer_norm(y, mean, rstd, d[0], d[1], d[2], eps);
    if (rc == 0) rc = record(d, y, mean, rstd);
    mt_tensor_unref(mean);
    mt_tensor_unref(rstd);
    if (rc) {
        mt_tensor_unref(y);
        y = NULL;
    }
    mt_dispatch_done(MT_OP_LAYER_NORM, (mt_dtype)compute, y, in, 3);
    mt_dispatch_release(d, 3);
    mt_dispatch_release(c, 3);
    return y;
}

mt_tensor *mt_layer_norm(mt_tensor *x, int normalized_ndim, mt_tensor *weight, mt_tensor *bias,
                         double eps) {
    if (!x) return NULL;
    mt_api_enter();
    return mt_api_exit(layer_norm(x, normalized_ndim, weight, bias, eps));
}
