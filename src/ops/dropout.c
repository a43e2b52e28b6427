/* mt_dropout: inverted dropout (torch.nn.functional.dropout). In training each element is
   zeroed with probability p and the rest scaled by 1 / (1 - p); the mask comes from the
   global Philox generator (a counter range reserved per call), and the tape node keeps only
   the seed and offset: the backward regenerates the same mask. Runs in the input's dtype
   (F16/BF16 included, no up-cast), or in the one a custom autocast list gives it. Not
   training, or p == 0: the input itself. */
#include "dispatch.h"

static const char *const NAME = "mt_dropout";

/* scalars[0] = p; ints: 0 seed, 1 offset (bit patterns of the uint64 values) */
static int dropout_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    const mt_input_meta *m = &n->inputs[0];
    mt_tensor *gc = mt_dispatch_dense(g, m->dtype);
    mt_tensor *out = gc ? mt_tensor_new(NAME, m->ndim, m->shape, m->dtype, gc->device) : NULL;
    int rc = out ? mt_backend_get(gc->device)
                       ->dropout(out, gc, n->scalars[0], (uint64_t)n->ints[0], (uint64_t)n->ints[1])
                 : mt_backward_failed();
    mt_tensor_unref(gc);
    if (rc) {
        mt_tensor_unref(out);
        return rc;
    }
    gi[0] = out;
    return 0;
}

static mt_tensor *dropout(mt_tensor *x, double p, bool training) {
    if (mt_check_floating(NAME, 1, x) < 0) return NULL;
    if (!(p >= 0 && p <= 1)) {
        mt_error_set(MT_ERR_INVALID, "%s: arg 2: p %g must be in [0, 1]", NAME, p);
        return NULL;
    }
    if (!training || p == 0) return mt_tensor_ref(x);
    mt_tensor *xc = mt_dispatch_dense_input(MT_OP_DROPOUT, x);
    if (!xc) return NULL;
    mt_tensor *out = mt_tensor_new(NAME, x->ndim, x->shape, xc->dtype, x->device);
    /* the tape node too is made before the draw: a failed call leaves the generator alone */
    mt_node *node = NULL;
    int rc = out ? 0 : MT_ERR_OOM;
    if (rc == 0 && mt_autograd_wanted(&xc, 1) &&
        !(node = mt_node_new(MT_OP_DROPOUT, dropout_backward, &xc, 1)))
        rc = MT_ERR_OOM;
    if (rc == 0) rc = mt_scope_reserve();
    uint64_t seed, offset;
    if (rc == 0) {
        mt_rng_reserve((uint64_t)x->numel, &seed, &offset);
        rc = mt_backend_get(x->device)->dropout(out, xc, p, seed, offset);
    }
    if (rc == 0 && node) {
        node->scalars[0] = p;
        node->ints[0] = (int64_t)seed;
        node->ints[1] = (int64_t)offset;
        node->n_ints = 2;
        mt_node_attach(node, out);
    } else if (node) {
        mt_node_release(node);
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(MT_OP_DROPOUT, xc->dtype, out, &x, 1);
    mt_tensor_unref(xc);
    return out;
}

mt_tensor *mt_dropout(mt_tensor *x, double p, bool training) {
    if (!x) return NULL;
    mt_api_enter();
    return mt_api_exit(dropout(x, p, training));
}
