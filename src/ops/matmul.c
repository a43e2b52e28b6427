/* matmul (torch.matmul semantics) and linear, on the backend's gemm kernel. Forward and
   backward hand the kernel strided views: transposes and batch broadcasting are strides,
   never copies. Gradients are written by the GEMM straight into fresh tensors, and the sum
   over broadcast batch dims is folded into the GEMM (a longer contraction, or beta = 1)
   instead of a product followed by a reduction. */
#include <string.h>
#include "dispatch.h"

/* ------------------------------------------------------------------ views */

/* t as the left operand of a matrix product: a 1-D [K] becomes the row [1, K]. */
static void left_matrix(mt_tensor *h, const mt_tensor *t) {
    if (t->ndim == 1)
        mt_tensor_header_init(h, t->storage, t->dtype, 2, (int64_t[]){1, t->shape[0]},
                              (int64_t[]){0, t->strides[0]}, t->offset);
    else
        mt_tensor_header_init(h, t->storage, t->dtype, t->ndim, t->shape, t->strides, t->offset);
}

/* t as the right operand: a 1-D [K] becomes the column [K, 1]. */
static void right_matrix(mt_tensor *h, const mt_tensor *t) {
    if (t->ndim == 1)
        mt_tensor_header_init(h, t->storage, t->dtype, 2, (int64_t[]){t->shape[0], 1},
                              (int64_t[]){t->strides[0], 0}, t->offset);
    else
        mt_tensor_header_init(h, t->storage, t->dtype, t->ndim, t->shape, t->strides, t->offset);
}

/* Swaps the last two dims of a header in place (a transposed view). */
static void transpose_last(mt_tensor *h) {
    int d = h->ndim;
    int64_t s = h->shape[d - 1], st = h->strides[d - 1];
    h->shape[d - 1] = h->shape[d - 2];
    h->strides[d - 1] = h->strides[d - 2];
    h->shape[d - 2] = s;
    h->strides[d - 2] = st;
}

/* True when the batch dims (sizes batch[], strides str[]) followed by an inner dim of size n
   and stride s merge into one dim; its stride goes to *stride. Size-1 dims are skipped. */
static bool merges(int nb, const int64_t *batch, const int64_t *str, int64_t n, int64_t s,
                   int64_t *stride) {
    int64_t size = n, inner = s;
    bool have = n != 1;
    for (int i = nb - 1; i >= 0; i--) {
        if (batch[i] == 1) continue;
        if (have && str[i] != size * inner) return false;
        if (!have) inner = str[i];
        size = have ? size * batch[i] : batch[i];
        have = true;
    }
    *stride = inner;
    return true;
}

/* Strides of t's batch dims aligned (from the right) to a batch of nb dims; 0 where t
   broadcasts. */
static void aligned_batch_strides(const mt_tensor *t, int nb, const int64_t *batch, int64_t *str) {
    int tb = t->ndim - 2, off = nb - tb;
    for (int i = 0; i < nb; i++)
        str[i] = i < off || (t->shape[i - off] == 1 && batch[i] != 1) ? 0 : t->strides[i - off];
}

/* An operand [batch.., rows, R] (strides: tstr in the batch, row_stride, r_stride) copied
   to a new contiguous [rows, count * R] matrix whose columns run over (batch.., R): the
   layout in which the batch dims and R merge into one contraction. NULL with the error set. */
static mt_tensor *contraction_copy(const char *op, const mt_backend *be, const mt_tensor *t,
                                   const int64_t *tstr, int nb, const int64_t *batch, int64_t count,
                                   int64_t rows, int64_t R, int64_t row_stride, int64_t r_stride) {
    mt_tensor *c = mt_tensor_new(op, 2, (int64_t[]){rows, count * R}, t->dtype, t->device);
    if (!c) return NULL;
    int64_t shape[MT_MAX_DIMS], sstr[MT_MAX_DIMS], dstr[MT_MAX_DIMS], inner = R;
    shape[0] = rows;
    sstr[0] = row_stride;
    dstr[0] = count * R;
    for (int i = nb - 1; i >= 0; i--) {
        shape[1 + i] = batch[i];
        sstr[1 + i] = tstr[i];
        dstr[1 + i] = inner;
        inner *= batch[i];
    }
    shape[nb + 1] = R;
    sstr[nb + 1] = r_stride;
    dstr[nb + 1] = 1;
    mt_tensor src, dst;
    mt_tensor_header_init(&src, t->storage, t->dtype, nb + 2, shape, sstr, t->offset);
    mt_tensor_header_init(&dst, c->storage, c->dtype, nb + 2, shape, dstr, c->offset);
    if (be->copy(&dst, &src) < 0) {
        mt_tensor_unref(c);
        return NULL;
    }
    return c;
}

/* out = l @ r with the reduced batch dims summed, one GEMM per batch entry: the first into
   each output entry with beta = 0, the rest accumulating with beta = 1. */
static int gemm_reduce_entries(const mt_backend *be, mt_tensor *out, const mt_tensor *l,
                               const mt_tensor *r, int nb, const int64_t *batch,
                               const bool *reduced) {
    int64_t lstr[MT_MAX_DIMS], rstr[MT_MAX_DIMS], count = 1;
    for (int i = 0; i < nb; i++) count *= batch[i];
    aligned_batch_strides(l, nb, batch, lstr);
    aligned_batch_strides(r, nb, batch, rstr);
    int64_t P = out->shape[nb], Q = out->shape[nb + 1], R = l->shape[l->ndim - 1];
    int64_t ls_p = l->strides[l->ndim - 2], ls_r = l->strides[l->ndim - 1];
    int64_t rs_r = r->strides[r->ndim - 2], rs_q = r->strides[r->ndim - 1];
    mt_tensor lh, rh, oh;
    for (int64_t bi = 0; bi < count; bi++) {
        int64_t rem = bi, lo = l->offset, ro = r->offset, oo = out->offset;
        bool first = true;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t idx = rem % batch[i];
            rem /= batch[i];
            lo += idx * lstr[i];
            ro += idx * rstr[i];
            if (reduced[i])
                first &= idx == 0;
            else
                oo += idx * out->strides[i];
        }
        mt_tensor_header_init(&lh, l->storage, l->dtype, 2, (int64_t[]){P, R},
                              (int64_t[]){ls_p, ls_r}, lo);
        mt_tensor_header_init(&rh, r->storage, r->dtype, 2, (int64_t[]){R, Q},
                              (int64_t[]){rs_r, rs_q}, ro);
        mt_tensor_header_init(&oh, out->storage, out->dtype, 2, (int64_t[]){P, Q},
                              (int64_t[]){Q, 1}, oo);
        int rc = be->gemm(&oh, &lh, &rh, 1.0, first ? 0.0 : 1.0);
        if (rc) return rc;
    }
    return 0;
}

/* t as a new contiguous F32 tensor, or NULL with the error set. */
static mt_tensor *f32_copy(const char *op, const mt_backend *be, const mt_tensor *t) {
    mt_tensor *c = mt_tensor_new(op, t->ndim, t->shape, MT_F32, t->device);
    if (c && be->copy(c, t) < 0) {
        mt_tensor_unref(c);
        return NULL;
    }
    return c;
}

/* The entries' sums of an F16/BF16 out accumulated in F32 and rounded once, as a GEMM
   accumulates its own contraction (beta = 1 into a low-precision out would round the
   partial sum after every entry, and a long batch would stop growing). */
static int gemm_reduce_entries_f32(const char *op, const mt_backend *be, mt_tensor *out,
                                   const mt_tensor *l, const mt_tensor *r, int nb,
                                   const int64_t *batch, const bool *reduced) {
    mt_tensor *lf = f32_copy(op, be, l), *rf = lf ? f32_copy(op, be, r) : NULL;
    mt_tensor *acc = rf ? mt_tensor_new(op, out->ndim, out->shape, MT_F32, out->device) : NULL;
    int rc = acc ? gemm_reduce_entries(be, acc, lf, rf, nb, batch, reduced) : mt_last_status();
    if (rc == 0) rc = be->copy(out, acc);
    mt_tensor_unref(acc);
    mt_tensor_unref(rf);
    mt_tensor_unref(lf);
    return rc;
}

/* out = l @ r, summed over the batch dims in which out has size 1 but the batch does not
   (the gradient of an operand that was broadcast). out [batch.., P, Q] is contiguous with 1
   in the summed dims; l [.., P, R] and r [.., R, Q] broadcast to the batch (nb dims). When
   every batch dim is summed, this is one GEMM with a contraction of batch * R, over a copy of
   an operand in which the batch dims and R do not merge (as torch's reshape copies). A
   partial sum is one GEMM per batch entry, accumulated in F32 for an F16/BF16 out. */
static int gemm_reduce(const char *op, const mt_backend *be, mt_tensor *out, const mt_tensor *l,
                       const mt_tensor *r, int nb, const int64_t *batch) {
    bool reduced[MT_MAX_DIMS] = {0}, any = false, all = true;
    int64_t count = 1;
    for (int i = 0; i < nb; i++) {
        reduced[i] = out->shape[i] == 1 && batch[i] != 1;
        any |= reduced[i];
        all &= reduced[i] || batch[i] == 1;
        count *= batch[i];
    }
    if (!any) return be->gemm(out, l, r, 1.0, 0.0);
    if (!all) {
        bool low = out->dtype == MT_F16 || out->dtype == MT_BF16;
        return low ? gemm_reduce_entries_f32(op, be, out, l, r, nb, batch, reduced)
                   : gemm_reduce_entries(be, out, l, r, nb, batch, reduced);
    }
    int64_t lstr[MT_MAX_DIMS], rstr[MT_MAX_DIMS];
    aligned_batch_strides(l, nb, batch, lstr);
    aligned_batch_strides(r, nb, batch, rstr);
    int64_t P = out->shape[nb], Q = out->shape[nb + 1], R = l->shape[l->ndim - 1];
    int64_t ls_p = l->strides[l->ndim - 2], ls_r = l->strides[l->ndim - 1];
    int64_t rs_r = r->strides[r->ndim - 2], rs_q = r->strides[r->ndim - 1];
    mt_tensor lh, rh, oh, *lc = NULL, *rc_t = NULL;
    int64_t lr, rr;
    if (merges(nb, batch, lstr, R, ls_r, &lr)) {
        mt_tensor_header_init(&lh, l->storage, l->dtype, 2, (int64_t[]){P, count * R},
                              (int64_t[]){ls_p, lr}, l->offset);
    } else {
        lc = contraction_copy(op, be, l, lstr, nb, batch, count, P, R, ls_p, ls_r);
        if (!lc) return mt_last_status();
        mt_tensor_header_init(&lh, lc->storage, lc->dtype, 2, lc->shape, NULL, lc->offset);
    }
    if (merges(nb, batch, rstr, R, rs_r, &rr)) {
        mt_tensor_header_init(&rh, r->storage, r->dtype, 2, (int64_t[]){count * R, Q},
                              (int64_t[]){rr, rs_q}, r->offset);
    } else {
        rc_t = contraction_copy(op, be, r, rstr, nb, batch, count, Q, R, rs_q, rs_r);
        if (!rc_t) {
            mt_tensor_unref(lc);
            return mt_last_status();
        }
        mt_tensor_header_init(&rh, rc_t->storage, rc_t->dtype, 2, (int64_t[]){count * R, Q},
                              (int64_t[]){1, count * R}, rc_t->offset);
    }
    mt_tensor_header_init(&oh, out->storage, out->dtype, 2, (int64_t[]){P, Q}, NULL, out->offset);
    int rc = be->gemm(&oh, &lh, &rh, 1.0, 0.0);
    mt_tensor_unref(rc_t);
    mt_tensor_unref(lc);
    return rc;
}

/* A header over the fresh contiguous gradient t (shape of an operand with `ond` dims) seen as
   [batch with 1 in the operand's missing or size-1 dims.., P, Q]. */
static void grad_target(mt_tensor *h, const mt_tensor *t, int nb, int ond, const int64_t *oshape,
                        int64_t P, int64_t Q) {
    int64_t shape[MT_MAX_DIMS];
    int tb = ond > 2 ? ond - 2 : 0, off = nb - tb;
    for (int i = 0; i < nb; i++) shape[i] = i < off ? 1 : oshape[i - off];
    shape[nb] = P;
    shape[nb + 1] = Q;
    mt_tensor_header_init(h, t->storage, t->dtype, nb + 2, shape, NULL, t->offset);
}

/* The backend of dev with a gemm kernel, or NULL with an error naming op. */
static const mt_backend *gemm_backend(const char *op, mt_device dev) {
    const mt_backend *be = mt_backend_for(op, dev);
    if (be && !be->gemm) {
        mt_error_set(MT_ERR_UNSUPPORTED, "%s: the %s backend has no GEMM kernel", op, be->name);
        return NULL;
    }
    return be;
}

/* g in dtype dt (a new reference). */
static mt_tensor *grad_as(mt_tensor *g, mt_dtype dt) {
    return g->dtype == dt ? mt_tensor_ref(g) : mt_cast(g, dt);
}

/* ------------------------------------------------------------------ matmul */

static int matmul_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    const mt_input_meta *ma = &n->inputs[0], *mb = &n->inputs[1];
    const char *name = "mt_matmul";
    const mt_backend *be = mt_backend_get(g->device);
    mt_tensor *gc = grad_as(g, ma->dtype);
    if (!gc) return mt_backward_failed();
    bool a1 = ma->ndim == 1, b1 = mb->ndim == 1;
    int nb = n->out_ndim - (a1 ? 0 : 1) - (b1 ? 0 : 1);
    const int64_t *batch = n->out_shape;
    int64_t M = a1 ? 1 : ma->shape[ma->ndim - 2], K = ma->shape[ma->ndim - 1];
    int64_t N = b1 ? 1 : mb->shape[mb->ndim - 1];
    /* the gradient as [batch.., M, N], with stride 0 in a dim a 1-D operand dropped */
    int64_t gshape[MT_MAX_DIMS], gstr[MT_MAX_DIMS];
    for (int i = 0; i < nb; i++) {
        gshape[i] = batch[i];
        gstr[i] = gc->strides[i];
    }
    gshape[nb] = M;
    gshape[nb + 1] = N;
    gstr[nb] = a1 ? 0 : gc->strides[nb];
    gstr[nb + 1] = b1 ? 0 : gc->strides[gc->ndim - 1];
    mt_tensor gh, oh, xh;
    mt_tensor_header_init(&gh, gc->storage, gc->dtype, nb + 2, gshape, gstr, gc->offset);
    int rc = 0;
    if (mt_node_needs(n, 0)) { /* dA = dC @ B^T */
        mt_tensor *ga = mt_tensor_new(name, ma->ndim, ma->shape, ma->dtype, g->device);
        if (!ga)
            rc = mt_backward_failed();
        else {
            right_matrix(&xh, n->saved[1]);
            transpose_last(&xh);
            grad_target(&oh, ga, nb, ma->ndim, ma->shape, M, K);
            rc = gemm_reduce(name, be, &oh, &gh, &xh, nb, batch);
            if (rc)
                mt_tensor_unref(ga);
            else
                gi[0] = ga;
        }
    }
    if (rc == 0 && mt_node_needs(n, 1)) { /* dB = A^T @ dC */
        mt_tensor *gb = mt_tensor_new(name, mb->ndim, mb->shape, mb->dtype, g->device);
        if (!gb)
            rc = mt_backward_failed();
        else {
            left_matrix(&xh, n->saved[0]);
            transpose_last(&xh);
            grad_target(&oh, gb, nb, mb->ndim, mb->shape, K, N);
            rc = gemm_reduce(name, be, &oh, &xh, &gh, nb, batch);
            if (rc)
                mt_tensor_unref(gb);
            else
                gi[1] = gb;
        }
    }
    mt_tensor_unref(gc);
    return rc;
}

/* Output shape and batch of a @ b with torch.matmul's rules, or an error. */
typedef struct {
    int nb, out_nd;
    int64_t batch[MT_MAX_DIMS], out_shape[MT_MAX_DIMS];
} mm_shape;

static int matmul_shape(const mt_tensor *a, const mt_tensor *b, mm_shape *s) {
    char ba[MT_SHAPE_BUF], bb[MT_SHAPE_BUF];
    for (int i = 0; i < 2; i++) {
        const mt_tensor *t = i ? b : a;
        if (t->ndim == 0)
            return mt_error_set(MT_ERR_SHAPE,
                                "mt_matmul: arg %d: expected a tensor with at least 1 dim, got a "
                                "0-d tensor (use mt_mul for scalars)",
                                i + 1);
    }
    int64_t ka = a->shape[a->ndim - 1], kb = b->shape[b->ndim == 1 ? 0 : b->ndim - 2];
    if (ka != kb)
        return mt_error_set(MT_ERR_SHAPE, "mt_matmul: arg 2: shape %s cannot multiply %s",
                            mt_shape_str(b, bb, sizeof bb), mt_shape_str(a, ba, sizeof ba));
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nbb = b->ndim > 2 ? b->ndim - 2 : 0;
    s->nb = na > nbb ? na : nbb;
    for (int i = 0; i < s->nb; i++) {
        int ia = i - (s->nb - na), ib = i - (s->nb - nbb);
        int64_t da = ia < 0 ? 1 : a->shape[ia], db = ib < 0 ? 1 : b->shape[ib];
        if (da != db && da != 1 && db != 1)
            return mt_error_set(MT_ERR_SHAPE,
                                "mt_matmul: batch dims of %s and %s do not broadcast (%lld vs "
                                "%lld)",
                                mt_shape_str(a, ba, sizeof ba), mt_shape_str(b, bb, sizeof bb),
                                (long long)da, (long long)db);
        s->batch[i] = da == 1 ? db : da;
    }
    s->out_nd = s->nb;
    memcpy(s->out_shape, s->batch, (size_t)s->nb * sizeof *s->batch);
    if (a->ndim > 1) s->out_shape[s->out_nd++] = a->shape[a->ndim - 2];
    if (b->ndim > 1) s->out_shape[s->out_nd++] = b->shape[b->ndim - 1];
    return 0;
}

static mt_tensor *matmul_impl(mt_tensor *a, mt_tensor *b) {
    const char *name = "mt_matmul";
    if (mt_check_floating(name, 1, a) < 0 || mt_check_floating(name, 2, b) < 0 ||
        mt_check_same_device(name, a, b) < 0)
        return NULL;
    mm_shape s;
    if (matmul_shape(a, b, &s) < 0) return NULL;
    const mt_backend *be = gemm_backend(name, a->device);
    if (!be) return NULL;
    mt_tensor *in[2] = {a, b}, *c[2];
    int compute = mt_dispatch_inputs(MT_OP_MATMUL, in, 2, c);
    if (compute < 0) return NULL;
    mt_tensor *out = mt_tensor_new(name, s.out_nd, s.out_shape, (mt_dtype)compute, a->device);
    int rc = out ? 0 : mt_backward_failed();
    if (rc == 0) {
        mt_tensor ah, bh, oh;
        left_matrix(&ah, c[0]);
        right_matrix(&bh, c[1]);
        int64_t cshape[MT_MAX_DIMS];
        memcpy(cshape, s.batch, (size_t)s.nb * sizeof *cshape);
        cshape[s.nb] = a->ndim > 1 ? a->shape[a->ndim - 2] : 1;
        cshape[s.nb + 1] = b->ndim > 1 ? b->shape[b->ndim - 1] : 1;
        mt_tensor_header_init(&oh, out->storage, out->dtype, s.nb + 2, cshape, NULL, out->offset);
        rc = be->gemm(&oh, &ah, &bh, 1.0, 0.0);
    }
    if (rc == 0) {
        mt_node *node = mt_record(MT_OP_MATMUL, matmul_backward, c, 2, out, &rc);
        /* dA needs B and dB needs A: save only what a needed gradient uses */
        if (node && mt_node_needs(node, 1)) rc = mt_node_save(node, 0, c[0]);
        if (node && rc == 0 && mt_node_needs(node, 0)) rc = mt_node_save(node, 1, c[1]);
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(MT_OP_MATMUL, (mt_dtype)compute, out, in, 2);
    mt_dispatch_release(c, 2);
    return out;
}

mt_tensor *mt_matmul(mt_tensor *a, mt_tensor *b) {
    if (!a || !b) return NULL;
    mt_api_enter();
    return mt_api_exit(matmul_impl(a, b));
}

/* ------------------------------------------------------------------ linear */

/* x [.., in] (1-D: [in]) as a matrix operand [.., M, in]. */
static void rows_matrix(mt_tensor *h, const mt_tensor *t) {
    left_matrix(h, t);
}

/* x [.., in] as one 2-D matrix [rows, in] without a copy, when its leading dims merge (a
   contiguous batch of rows); false otherwise. */
static bool flat_rows(mt_tensor *h, const mt_tensor *t) {
    int nd = t->ndim;
    if (nd == 1) {
        left_matrix(h, t);
        return true;
    }
    int64_t rs, rows = 1;
    for (int i = 0; i < nd - 1; i++) rows *= t->shape[i];
    if (t->numel == 0) { /* no element to address: any strides do, the contiguous ones */
        mt_tensor_header_init(h, t->storage, t->dtype, 2, (int64_t[]){rows, t->shape[nd - 1]}, NULL,
                              t->offset);
        return true;
    }
    if (!merges(nd - 2, t->shape, t->strides, t->shape[nd - 2], t->strides[nd - 2], &rs))
        return false;
    mt_tensor_header_init(h, t->storage, t->dtype, 2, (int64_t[]){rows, t->shape[nd - 1]},
                          (int64_t[]){rs, t->strides[nd - 1]}, t->offset);
    return true;
}

/* W [out, in] as the right operand W^T [in, out]: its strides swapped. */
static void weight_t(mt_tensor *h, const mt_tensor *w) {
    mt_tensor_header_init(h, w->storage, w->dtype, 2, (int64_t[]){w->shape[1], w->shape[0]},
                          (int64_t[]){w->strides[1], w->strides[0]}, w->offset);
}

/* The gradients of x, W and b from gc, the gradient of x @ W^T + b in the compute dtype.
   saved[0] is x (when dW is needed), saved[1] W (when dx is). */
static int linear_grads(mt_node *n, const char *name, mt_tensor *gc, mt_tensor **gi) {
    const mt_input_meta *mx = &n->inputs[0], *mw = &n->inputs[1];
    const mt_backend *be = mt_backend_get(gc->device);
    int64_t out_f = mw->shape[0], in_f = mw->shape[1];
    mt_tensor gh, oh, xh;
    rows_matrix(&gh, gc); /* [.., M, out] */
    int rc = 0;
    if (mt_node_needs(n, 0)) { /* dx = dy @ W */
        mt_tensor *gx = mt_tensor_new(name, mx->ndim, mx->shape, mx->dtype, gc->device);
        if (!gx)
            rc = mt_backward_failed();
        else {
            rows_matrix(&oh, gx);
            rc = be->gemm(&oh, &gh, n->saved[1], 1.0, 0.0);
            if (rc)
                mt_tensor_unref(gx);
            else
                gi[0] = gx;
        }
    }
    if (rc == 0 && mt_node_needs(n, 1)) { /* dW = dy^T @ x over all leading dims */
        mt_tensor *gw = mt_tensor_new(name, 2, mw->shape, mw->dtype, gc->device);
        if (!gw)
            rc = mt_backward_failed();
        else {
            mt_tensor gt;
            rows_matrix(&gt, gc);
            transpose_last(&gt); /* [.., out, M] */
            rows_matrix(&xh, n->saved[0]);
            int nb = gt.ndim - 2;
            grad_target(&oh, gw, nb, 2, mw->shape, out_f, in_f);
            rc = gemm_reduce(name, be, &oh, &gt, &xh, nb, gt.shape);
            if (rc)
                mt_tensor_unref(gw);
            else
                gi[1] = gw;
        }
    }
    if (rc == 0 && mt_node_needs(n, 2)) { /* db = dy summed over the leading dims */
        mt_tensor *gb = mt_tensor_new(name, 1, (int64_t[]){out_f}, n->inputs[2].dtype, gc->device);
        if (!gb)
            rc = mt_backward_failed();
        else {
            if (gc->ndim == 1) {
                rc = be->copy(gb, gc);
            } else {
                int64_t kshape[MT_MAX_DIMS];
                for (int i = 0; i < gc->ndim - 1; i++) kshape[i] = 1;
                kshape[gc->ndim - 1] = out_f;
                mt_tensor_header_init(&oh, gb->storage, gb->dtype, gc->ndim, kshape, NULL,
                                      gb->offset);
                rc = be->reduce(MT_OP_SUM, &oh, gc, (1u << (gc->ndim - 1)) - 1u);
            }
            if (rc)
                mt_tensor_unref(gb);
            else
                gi[2] = gb;
        }
    }
    return rc;
}

static int linear_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *gc = grad_as(g, n->inputs[0].dtype);
    if (!gc) return mt_backward_failed();
    int rc = linear_grads(n, "mt_linear", gc, gi);
    mt_tensor_unref(gc);
    return rc;
}

/* The fused elementwise backward kernel of each activation, reading saved[2]: the output
   for RELU (y > 0 where the pre-activation is), the pre-activation for the GELUs. */
static mt_op_id act_backward_op(mt_activation act) {
    return act == MT_ACT_RELU   ? MT_OP_RELU_BACKWARD
           : act == MT_ACT_GELU ? MT_OP_GELU_BACKWARD
                                : MT_OP_GELU_TANH_BACKWARD;
}

static int linear_act_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    const char *name = "mt_linear_act";
    mt_activation act = (mt_activation)n->ints[0];
    mt_tensor *gc = grad_as(g, n->inputs[0].dtype);
    if (!gc) return mt_backward_failed();
    mt_tensor *gz = gc;
    int rc = 0;
    if (act != MT_ACT_NONE) { /* gz = act'(z) * g in one pass */
        gz = mt_tensor_new(name, gc->ndim, gc->shape, gc->dtype, gc->device);
        rc = gz ? mt_backend_get(gc->device)->binary(act_backward_op(act), gz, gc, n->saved[2])
                : mt_backward_failed();
    }
    if (rc == 0) rc = linear_grads(n, name, gz, gi);
    if (gz != gc) mt_tensor_unref(gz);
    mt_tensor_unref(gc);
    return rc;
}

static int linear_check(const char *name, mt_tensor *x, mt_tensor *w, mt_tensor *b) {
    char bx[MT_SHAPE_BUF], bw[MT_SHAPE_BUF], bb[MT_SHAPE_BUF];
    if (mt_check_floating(name, 1, x) < 0 || mt_check_floating(name, 2, w) < 0 ||
        (b && mt_check_floating(name, 3, b) < 0) || mt_check_same_device(name, x, w) < 0 ||
        (b && mt_check_same_device(name, x, b) < 0))
        return -1;
    if (x->ndim == 0)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 1: input must have at least 1 dim [.., in_features], "
                            "got a 0-d tensor",
                            name);
    if (w->ndim != 2)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 2: weight must be 2-D [out_features, in_features], "
                            "got shape %s",
                            name, mt_shape_str(w, bw, sizeof bw));
    if (x->shape[x->ndim - 1] != w->shape[1])
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 2: weight %s cannot multiply input %s (in_features "
                            "%lld vs %lld)",
                            name, mt_shape_str(w, bw, sizeof bw), mt_shape_str(x, bx, sizeof bx),
                            (long long)w->shape[1], (long long)x->shape[x->ndim - 1]);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 3: bias of shape %s does not fit weight %s "
                            "(expected [%lld])",
                            name, mt_shape_str(b, bb, sizeof bb), mt_shape_str(w, bw, sizeof bw),
                            (long long)w->shape[0]);
    return 0;
}

/* out = x @ W^T + b the unfused way, for an x whose rows do not flatten: the bias goes into
   the output first and the (batched) GEMM adds onto it. */
static int linear_unfused(const mt_backend *be, mt_tensor *out, mt_tensor *const *c) {
    double beta = 0.0;
    int rc = 0;
    if (c[2]) {
        mt_tensor *eb = mt_tensor_expand_to(c[2], out->ndim, out->shape);
        rc = eb ? be->copy(out, eb) : mt_backward_failed();
        mt_tensor_unref(eb);
        beta = 1.0;
    }
    if (rc == 0) {
        mt_tensor xh, wt, oh;
        rows_matrix(&xh, c[0]);
        weight_t(&wt, c[1]);
        rows_matrix(&oh, out);
        rc = be->gemm(&oh, &xh, &wt, 1.0, beta);
    }
    return rc;
}

static mt_tensor *dense_rows(const mt_backend *be, const char *name, const mt_tensor *x);

/* out (and pre) = act(x @ W^T + b) through the backend's epilogue; x must flatten. The
   epilogue reads a dense bias: a strided one is copied first (it is small). */
static int linear_fused(const mt_backend *be, mt_tensor *out, mt_tensor *pre, const mt_tensor *x2,
                        mt_tensor *const *c, mt_activation act) {
    mt_tensor *bd = NULL;
    if (c[2] && !mt_is_contiguous(c[2]) && !(bd = dense_rows(be, "mt_linear", c[2])))
        return mt_backward_failed();
    mt_tensor wt, oh, ph;
    int64_t rows = x2->shape[0], n = c[1]->shape[0];
    weight_t(&wt, c[1]);
    mt_tensor_header_init(&oh, out->storage, out->dtype, 2, (int64_t[]){rows, n}, NULL,
                          out->offset);
    if (pre)
        mt_tensor_header_init(&ph, pre->storage, pre->dtype, 2, (int64_t[]){rows, n}, NULL,
                              pre->offset);
    mt_gemm_epilogue_args a = {
        .c = &oh, .pre = pre ? &ph : NULL, .a = x2, .b = &wt, .bias = bd ? bd : c[2], .act = act};
    int rc = be->gemm_epilogue(&a);
    mt_tensor_unref(bd);
    return rc;
}

/* A dense copy of x (not recorded: the node saves it in x's place; or a strided bias). */
static mt_tensor *dense_rows(const mt_backend *be, const char *name, const mt_tensor *x) {
    mt_tensor *d = mt_tensor_new(name, x->ndim, x->shape, x->dtype, x->device);
    if (d && be->copy(d, x)) {
        mt_tensor_unref(d);
        return NULL;
    }
    return d;
}

static mt_tensor *linear_impl(mt_op_id id, mt_tensor *x, mt_tensor *w, mt_tensor *b,
                              mt_activation act) {
    const char *name = id == MT_OP_LINEAR ? "mt_linear" : "mt_linear_act";
    if (act < MT_ACT_NONE || act > MT_ACT_GELU_TANH) {
        mt_error_set(MT_ERR_INVALID,
                     "%s: arg 4: activation %d is not MT_ACT_NONE, MT_ACT_RELU, MT_ACT_GELU or "
                     "MT_ACT_GELU_TANH",
                     name, (int)act);
        return NULL;
    }
    if (linear_check(name, x, w, b) < 0) return NULL;
    const mt_backend *be = gemm_backend(name, x->device);
    if (!be) return NULL;
    mt_tensor *in[3] = {x, w, b}, *c[3];
    int compute = mt_dispatch_inputs(id, in, 3, c);
    if (compute < 0) return NULL;
    int nd = x->ndim;
    int64_t shape[MT_MAX_DIMS];
    memcpy(shape, x->shape, (size_t)nd * sizeof *shape);
    shape[nd - 1] = w->shape[0];
    mt_tensor *out = mt_tensor_new(name, nd, shape, (mt_dtype)compute, x->device);
    bool gelu = act == MT_ACT_GELU || act == MT_ACT_GELU_TANH;
    mt_tensor *pre = NULL, *xd = NULL, *xs = c[0], x2;
    int rc = out ? 0 : mt_backward_failed();
    if (rc == 0 && gelu && mt_autograd_wanted(c, 3)) {
        pre = mt_tensor_new(name, nd, shape, (mt_dtype)compute, x->device);
        if (!pre) rc = mt_backward_failed();
    }
    /* plain linear keeps the batched GEMM for rows that do not flatten; the fused op copies
       them (rare: a transposed batch) so that one epilogue GEMM does it all */
    if (rc == 0 && !flat_rows(&x2, c[0])) {
        if (id == MT_OP_LINEAR) {
            rc = linear_unfused(be, out, c);
            xs = NULL;
        } else if ((xd = dense_rows(be, name, c[0])) != NULL) {
            if (!flat_rows(&x2, xd)) /* a dense copy always flattens */
                rc = mt_error_set(MT_ERR_INTERNAL, "%s: a dense copy of x does not flatten", name);
            xs = xd;
        } else {
            rc = mt_backward_failed();
        }
    }
    if (rc == 0 && xs) rc = linear_fused(be, out, pre, &x2, c, act);
    if (rc == 0) {
        mt_node *node = mt_record(id, id == MT_OP_LINEAR ? linear_backward : linear_act_backward, c,
                                  3, out, &rc);
        /* dx needs W and dW needs x: save only what a needed gradient uses */
        if (node && mt_node_needs(node, 1)) rc = mt_node_save(node, 0, xd ? xd : c[0]);
        if (node && rc == 0 && mt_node_needs(node, 0)) rc = mt_node_save(node, 1, c[1]);
        if (node && rc == 0 && act != MT_ACT_NONE) rc = mt_node_save(node, 2, pre ? pre : out);
        if (node) {
            node->ints[0] = act;
            node->n_ints = 1;
        }
    }
    mt_tensor_unref(pre);
    mt_tensor_unref(xd);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(id, (mt_dtype)compute, out, in, 3);
    mt_dispatch_release(c, 3);
    return out;
}

mt_tensor *mt_linear(mt_tensor *x, mt_tensor *w, mt_tensor *b) {
    if (!x || !w) return NULL;
    mt_api_enter();
    return mt_api_exit(linear_impl(MT_OP_LINEAR, x, w, b, MT_ACT_NONE));
}

mt_tensor *mt_linear_act(mt_tensor *x, mt_tensor *w, mt_tensor *b, mt_activation act) {
    if (!x || !w) return NULL;
    mt_api_enter();
    return mt_api_exit(linear_impl(MT_OP_LINEAR_ACT, x, w, b, act));
}
