/* Losses: mean squared error and cross entropy (fused log-softmax + NLL). Both run in FP32
   under autocast and return 0-d tensors; per-row and total accumulation is FP32 (F64 for
   F64 inputs) whatever the storage dtype. */
#include <math.h>
#include <stdlib.h>
#include "dispatch.h"

/* ------------------------------------------------------------------ mse_loss */

/* saved[0] = pred - target; ints[0] = numel.
   d/dpred = 2 (pred - target) g / n, d/dtarget = the negative. */
static int mse_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *d = n->saved[0];
    double k = n->ints[0] ? 2.0 / (double)n->ints[0] : NAN;
    mt_tensor *s = mt_mul_scalar(g, k);
    mt_tensor *gp = s ? mt_mul(d, s) : NULL;
    mt_tensor_unref(s);
    if (!gp) return mt_backward_failed();
    int rc = 0;
    if (mt_node_needs(n, 1)) {
        gi[1] = mt_neg(gp);
        if (!gi[1]) rc = mt_backward_failed();
    }
    if (mt_node_needs(n, 0)) gi[0] = mt_tensor_ref(gp);
    mt_tensor_unref(gp);
    return rc;
}

static mt_tensor *mse_loss(mt_tensor *pred, mt_tensor *target) {
    const char *name = "mt_mse_loss";
    if (mt_check_floating(name, 1, pred) < 0 || mt_check_floating(name, 2, target) < 0 ||
        mt_check_same_device(name, pred, target) < 0)
        return NULL;
    if (!mt_same_shape(pred, target)) {
        char a[MT_SHAPE_BUF], b[MT_SHAPE_BUF];
        mt_error_set(MT_ERR_SHAPE,
                     "%s: arg 2: target shape %s differs from pred shape %s (no broadcasting)",
                     name, mt_shape_str(target, b, sizeof b), mt_shape_str(pred, a, sizeof a));
        return NULL;
    }
    mt_tensor *in[2] = {pred, target}, *c[2];
    int compute = mt_dispatch_inputs(MT_OP_MSE_LOSS, in, 2, c);
    if (compute < 0) return NULL;
    const mt_backend *be = mt_backend_get(pred->device);
    int64_t ones[MT_MAX_DIMS];
    for (int i = 0; i < pred->ndim; i++) ones[i] = 1;
    uint32_t all = pred->ndim ? (uint32_t)((1u << pred->ndim) - 1) : 0;
    mt_dtype dt = (mt_dtype)compute;
    mt_tensor *d = mt_tensor_new(name, pred->ndim, pred->shape, dt, pred->device);
    mt_tensor *sq = d ? mt_tensor_new(name, pred->ndim, pred->shape, dt, pred->device) : NULL;
    mt_tensor *kept = sq ? mt_tensor_new(name, pred->ndim, ones, dt, pred->device) : NULL;
    int rc = kept ? be->binary(MT_OP_SUB, d, c[0], c[1]) : MT_ERR_OOM;
    if (rc == 0) rc = be->binary(MT_OP_MUL, sq, d, d);
    if (rc == 0) rc = be->reduce(MT_OP_MEAN, kept, sq, all);
    mt_tensor *out = rc == 0 ? mt_tensor_view_of(kept, 0, NULL, NULL, kept->offset) : NULL;
    if (rc == 0 && !out) rc = MT_ERR_OOM;
    mt_tensor_unref(sq);
    mt_tensor_unref(kept);
    if (rc == 0) {
        mt_node *node = mt_record(MT_OP_MSE_LOSS, mse_backward, c, 2, out, &rc);
        if (node) {
            node->ints[0] = pred->numel;
            node->n_ints = 1;
            rc = mt_node_save(node, 0, d);
        }
    }
    mt_tensor_unref(d);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(MT_OP_MSE_LOSS, (mt_dtype)compute, out, in, 2);
    mt_dispatch_release(c, 2);
    return out;
}

mt_tensor *mt_mse_loss(mt_tensor *pred, mt_tensor *target) {
    if (!pred || !target) return NULL;
    mt_api_enter();
    return mt_api_exit(mse_loss(pred, target));
}

/* ------------------------------------------------------------------ cross_entropy */

/* The accumulation dtype of the per-row buffers: F64 for F64 logits, else F32. */
static mt_dtype acc_dtype(mt_dtype dt) {
    return dt == MT_F64 ? MT_F64 : MT_F32;
}

/* saved[0] = logits, saved[1] = labels, saved[2] = lse, saved[3] = the count of counted
   rows (0-d, on the device: reading it would cost a host sync); ints[0] = ignore_index. */
static int ce_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *x = n->saved[0], *labels = n->saved[1], *lse = n->saved[2], *valid = n->saved[3];
    mt_tensor *ga = mt_cast(g, acc_dtype(x->dtype));
    /* valid == 0: the forward was nan (0/0) and so is every gradient, as torch */
    mt_tensor *scale = ga ? mt_div(ga, valid) : NULL;
    mt_tensor_unref(ga);
    mt_tensor *out =
        scale ? mt_tensor_new("mt_cross_entropy", x->ndim, x->shape, n->inputs[0].dtype, x->device)
              : NULL;
    int rc = out ? mt_backend_get(x->device)->cross_entropy_backward(out, x, labels, lse, scale,
                                                                     n->ints[0])
                 : mt_backward_failed();
    mt_tensor_unref(scale);
    if (rc) {
        mt_tensor_unref(out);
        return rc;
    }
    gi[0] = out;
    return 0;
}

/* Labels in [0, C) or equal to ignore_index, checked on the host for host labels. Device
   labels are checked by the kernel, which reports at the next synchronisation: reading them
   here would cost a host sync every step. */
static int check_labels(const char *name, const mt_tensor *labels, int64_t C, int64_t ignore) {
    int64_t N = labels->numel;
    const int64_t *v;
    int64_t *copy = NULL;
    if (labels->device.type == MT_DEVICE_CPU && mt_is_contiguous(labels)) {
        v = mt_tensor_data(labels);
    } else {
        copy = mt_heap_alloc((size_t)(N ? N : 1) * sizeof *copy);
        if (!copy)
            return mt_error_set(MT_ERR_OOM, "%s: out of memory reading %lld labels", name,
                                (long long)N);
        int rc = mt_copy_to_host(labels, copy, (size_t)N * sizeof *copy);
        if (rc) {
            free(copy);
            return rc;
        }
        v = copy;
    }
    int rc = 0;
    for (int64_t i = 0; i < N; i++) {
        if (v[i] == ignore || (v[i] >= 0 && v[i] < C)) continue;
        rc = mt_error_set(MT_ERR_INVALID,
                          "%s: arg 2: label %lld at row %lld is out of range [0, %lld)%s", name,
                          (long long)v[i], (long long)i, (long long)C,
                          ignore == MT_IGNORE_INDEX_NONE ? "" : " and not ignore_index");
        break;
    }
    free(copy);
    return rc;
}

static mt_tensor *cross_entropy(mt_tensor *logits, mt_tensor *labels, int64_t ignore) {
    const char *name = "mt_cross_entropy";
    char sa[MT_SHAPE_BUF], sb[MT_SHAPE_BUF];
    if (mt_check_floating(name, 1, logits) < 0 || mt_check_same_device(name, logits, labels) < 0)
        return NULL;
    if (logits->ndim != 2) {
        mt_error_set(MT_ERR_SHAPE, "%s: arg 1: logits must be [N, C], got shape %s", name,
                     mt_shape_str(logits, sa, sizeof sa));
        return NULL;
    }
    if (labels->dtype != MT_I64) {
        mt_error_set(MT_ERR_DTYPE, "%s: arg 2: labels must be i64, got %s", name,
                     mt_dtype_name(labels->dtype));
        return NULL;
    }
    if (labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
        mt_error_set(MT_ERR_SHAPE,
                     "%s: arg 2: labels shape %s does not match logits %s (want [%lld])", name,
                     mt_shape_str(labels, sb, sizeof sb), mt_shape_str(logits, sa, sizeof sa),
                     (long long)logits->shape[0]);
        return NULL;
    }
    int64_t C = logits->shape[1];
    if (labels->device.type == MT_DEVICE_CPU && check_labels(name, labels, C, ignore) < 0)
        return NULL;
    /* An exact upcast is done by the kernel reading the low-precision logits directly. */
    mt_tensor *c;
    int compute = mt_dispatch_upcast_input(MT_OP_CROSS_ENTROPY, logits, &c);
    if (compute < 0) return NULL;
    mt_dtype acc = acc_dtype((mt_dtype)compute);
    const mt_backend *be = mt_backend_get(logits->device);
    int64_t N = logits->shape[0];
    mt_tensor *loss = mt_tensor_new(name, 1, &N, acc, logits->device);
    mt_tensor *lse =
        loss ? mt_tensor_new(name, 2, (const int64_t[]){N, 2}, acc, logits->device) : NULL;
    mt_tensor *total =
        lse ? mt_tensor_new(name, 1, (const int64_t[]){1}, acc, logits->device) : NULL;
    mt_tensor *valid = total ? mt_tensor_new(name, 0, NULL, acc, logits->device) : NULL;
    mt_tensor *out = valid ? mt_tensor_new(name, 0, NULL, (mt_dtype)compute, logits->device) : NULL;
    int rc = out ? be->cross_entropy(loss, lse, valid, c, labels, ignore) : MT_ERR_OOM;
    if (rc == 0) rc = be->reduce(MT_OP_SUM, total, loss, 1u);
    mt_tensor *total0 = rc == 0 ? mt_tensor_view_of(total, 0, NULL, NULL, total->offset) : NULL;
    if (rc == 0 && !total0) rc = MT_ERR_OOM;
    /* the mean on the device; valid == 0 gives 0 / 0 = nan, like torch's mean over no rows */
    if (rc == 0) rc = be->binary(MT_OP_DIV, total0, total0, valid);
    if (rc == 0) rc = be->copy(out, total0);
    mt_tensor_unref(total0);
    mt_tensor_unref(loss);
    mt_tensor_unref(total);
    if (rc == 0) {
        mt_node *node = mt_record(MT_OP_CROSS_ENTROPY, ce_backward, &c, 1, out, &rc);
        if (node) {
            node->ints[0] = ignore;
            node->n_ints = 1;
            rc = mt_node_save(node, 0, c);
            if (!rc) rc = mt_node_save(node, 1, labels);
            if (!rc) rc = mt_node_save(node, 2, lse);
            if (!rc) rc = mt_node_save(node, 3, valid);
        }
    }
    mt_tensor_unref(lse);
    mt_tensor_unref(valid);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(MT_OP_CROSS_ENTROPY, (mt_dtype)compute, out, &logits, 1);
    mt_tensor_unref(c);
    return out;
}

mt_tensor *mt_cross_entropy_ex(mt_tensor *logits, mt_tensor *labels, int64_t ignore_index) {
    if (!logits || !labels) return NULL;
    mt_api_enter_at("mt_cross_entropy"); /* the name its messages use, whichever form was called */
    return mt_api_exit(cross_entropy(logits, labels, ignore_index));
}

mt_tensor *mt_cross_entropy(mt_tensor *logits, mt_tensor *labels) {
    return mt_cross_entropy_ex(logits, labels, -100);
}
