/* mt_conv2d: 2-d convolution with torch.nn.functional.conv2d's semantics (NCHW logical
   shapes, stride, padding, dilation, groups), on the backend's three convolution families.
   The output is channels-last when the input or the weight is (torch's rule), the input's
   gradient in the output's format and the weight's gradient in the weight's. The tape
   node keeps the geometry as its state, the input (for the weight's gradient) and the weight
   (for the input's gradient); the bias gradient is a reduction of the output gradient. */
#include <stdlib.h>
#include "memory_format.h"

/* Geometry from the options: 0 in stride, dilation and groups means 1 (torch rejects 0 there,
   so no valid value is lost). */
static int conv_params(const mt_conv2d_opts *o, mt_conv2d_params *p) {
    const char *name = "mt_conv2d";
    mt_conv2d_opts d = o ? *o : (mt_conv2d_opts){0};
    for (int i = 0; i < 2; i++) {
        if (d.stride[i] < 0 || d.padding[i] < 0 || d.dilation[i] < 0)
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg 4: stride, padding and dilation must not be negative, "
                                "got stride [%lld, %lld], padding [%lld, %lld], dilation [%lld, "
                                "%lld]",
                                name, (long long)d.stride[0], (long long)d.stride[1],
                                (long long)d.padding[0], (long long)d.padding[1],
                                (long long)d.dilation[0], (long long)d.dilation[1]);
        p->stride[i] = d.stride[i] ? d.stride[i] : 1;
        p->padding[i] = d.padding[i];
        p->dilation[i] = d.dilation[i] ? d.dilation[i] : 1;
    }
    if (d.groups < 0)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 4: groups must be positive, got %lld", name,
                            (long long)d.groups);
    p->groups = d.groups ? d.groups : 1;
    return 0;
}

/* Checks the operands and sets the output's shape. Where one window covers a dim (output
   extent 1) the stride there changes nothing, so it is lowered to the padded input's extent
   for the libraries (oneDNN and cuDNN refuse strides past 32 bits); likewise the dilation
   of a 1-wide kernel. */
static int conv_check(mt_tensor *x, mt_tensor *w, mt_tensor *b, mt_conv2d_params *p,
                      int64_t *out_shape) {
    const char *name = "mt_conv2d";
    char bx[MT_SHAPE_BUF], bw[MT_SHAPE_BUF], bb[MT_SHAPE_BUF];
    if (mt_check_floating(name, 1, x) < 0 || mt_check_floating(name, 2, w) < 0 ||
        (b && mt_check_floating(name, 3, b) < 0) || mt_check_same_device(name, x, w) < 0 ||
        (b && mt_check_same_device(name, x, b) < 0))
        return -1;
    if (x->ndim != 4)
        return mt_error_set(MT_ERR_SHAPE, "%s: arg 1: input must be 4-d [N, C, H, W], got shape %s",
                            name, mt_shape_str(x, bx, sizeof bx));
    if (w->ndim != 4)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 2: weight must be 4-d [out_channels, in_channels / groups, "
                            "kH, kW], got shape %s",
                            name, mt_shape_str(w, bw, sizeof bw));
    int64_t C = x->shape[1], OC = w->shape[0], g = p->groups;
    if (C % g || OC % g)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: groups %lld must divide in_channels %lld and out_channels %lld",
                            name, (long long)g, (long long)C, (long long)OC);
    if (w->shape[1] * g != C)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 2: weight %s expects %lld input channels (groups %lld), "
                            "input %s has %lld",
                            name, mt_shape_str(w, bw, sizeof bw), (long long)(w->shape[1] * g),
                            (long long)g, mt_shape_str(x, bx, sizeof bx), (long long)C);
    if (b && (b->ndim != 1 || b->shape[0] != OC))
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 3: bias of shape %s does not fit weight %s "
                            "(expected [%lld])",
                            name, mt_shape_str(b, bb, sizeof bb), mt_shape_str(w, bw, sizeof bw),
                            (long long)OC);
    out_shape[0] = x->shape[0];
    out_shape[1] = OC;
    for (int i = 0; i < 2; i++) {
        int64_t span, padded; /* the dilated kernel's extent, the padded input's */
        if (__builtin_mul_overflow(p->dilation[i], w->shape[2 + i] - 1, &span) ||
            __builtin_add_overflow(span, 1, &span) ||
            __builtin_mul_overflow(p->padding[i], 2, &padded) ||
            __builtin_add_overflow(padded, x->shape[2 + i], &padded))
            return mt_error_set(MT_ERR_SHAPE,
                                "%s: kernel %s with dilation [%lld, %lld] or input %s with "
                                "padding [%lld, %lld] overflows int64",
                                name, mt_shape_str(w, bw, sizeof bw), (long long)p->dilation[0],
                                (long long)p->dilation[1], mt_shape_str(x, bx, sizeof bx),
                                (long long)p->padding[0], (long long)p->padding[1]);
        if (w->shape[2 + i] < 1 || span > padded)
            return mt_error_set(MT_ERR_SHAPE,
                                "%s: kernel %s (dilation %lld) is larger than the padded input "
                                "%s (padding %lld)",
                                name, mt_shape_str(w, bw, sizeof bw), (long long)p->dilation[i],
                                mt_shape_str(x, bx, sizeof bx), (long long)p->padding[i]);
        out_shape[2 + i] = (padded - span) / p->stride[i] + 1;
        if (out_shape[2 + i] == 1 && p->stride[i] > padded - span + 1)
            p->stride[i] = padded - span + 1;
        if (w->shape[2 + i] == 1) p->dilation[i] = 1;
    }
    return 0;
}

static mt_tensor *grad_as(mt_tensor *g, mt_dtype dt) {
    return g->dtype == dt ? mt_tensor_ref(g) : mt_cast(g, dt);
}

static int conv_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    const char *name = "mt_conv2d";
    const mt_conv2d_params *p = n->state;
    const mt_backend *be = mt_backend_get(g->device);
    const mt_input_meta *mx = &n->inputs[0], *mw = &n->inputs[1];
    bool cl = n->ints[0] != 0, weight_cl = n->ints[1] != 0;
    mt_tensor *gc = grad_as(g, mx->dtype);
    mt_tensor *gy = gc ? mt_dense_4d(name, gc, cl) : NULL;
    mt_tensor_unref(gc);
    if (!gy) return mt_backward_failed();
    bool empty = gy->numel == 0 || mx->shape[1] == 0; /* no output, or no input channels */
    int rc = 0;
    if (mt_node_needs(n, 0)) {
        mt_tensor *gx = mt_tensor_new_format(name, mx->shape, mx->dtype, g->device, cl);
        rc = !gx     ? mt_backward_failed()
             : empty ? be->fill(gx, 0.0)
                     : be->conv2d_backward_data(gx, gy, n->saved[1], p);
        if (rc)
            mt_tensor_unref(gx);
        else
            gi[0] = gx;
    }
    if (rc == 0 && mt_node_needs(n, 1)) {
        /* in the weight's format: a channels-last parameter's gradient then needs no copy
           and accumulates in the parameter's layout */
        mt_tensor *gw = mt_tensor_new_format(name, mw->shape, mw->dtype, g->device, weight_cl);
        rc = !gw     ? mt_backward_failed()
             : empty ? be->fill(gw, 0.0)
                     : be->conv2d_backward_weight(gw, gy, n->saved[0], p);
        if (rc)
            mt_tensor_unref(gw);
        else
            gi[1] = gw;
    }
    if (rc == 0 && mt_node_needs(n, 2)) { /* the bias gradient sums gy over N, H and W */
        int64_t oc = mw->shape[0];
        mt_tensor *gb = mt_tensor_new(name, 1, &oc, n->inputs[2].dtype, g->device);
        mt_tensor h;
        if (gb)
            mt_tensor_header_init(&h, gb->storage, gb->dtype, 4, (int64_t[]){1, oc, 1, 1}, NULL,
                                  gb->offset);
        rc = gb ? be->reduce(MT_OP_SUM, &h, gy, 0xDu) : mt_backward_failed();
        if (rc)
            mt_tensor_unref(gb);
        else
            gi[2] = gb;
    }
    mt_tensor_unref(gy);
    return rc;
}

/* No input channels (C / groups == 0): every output is a sum over nothing, so the output is
   the bias broadcast, or zeros. The libraries refuse an empty reduction. */
static int conv_no_channels(const mt_backend *be, mt_tensor *out, const mt_tensor *b) {
    if (!b) return be->fill(out, 0.0);
    mt_tensor h;
    mt_tensor_header_init(&h, b->storage, b->dtype, 4, out->shape,
                          (int64_t[]){0, b->strides[0], 0, 0}, b->offset);
    return be->copy(out, &h);
}

/* Runs the forward on cast inputs c[] (x and w dense) and records the node. */
static mt_tensor *conv_run(mt_tensor **c, mt_tensor *const *in, const int64_t *shape,
                           const mt_conv2d_params *p, bool weight_cl) {
    const char *name = "mt_conv2d";
    const mt_backend *be = mt_backend_get(c[0]->device);
    /* channels-last when the input or the weight is (torch's cudnn and mkldnn rule): a
       channels-last model then stays channels-last where an activation is both formats at
       once (1x1 spatial) and needs no weight copy there */
    bool cl = mt_prefers_channels_last(c[0]) || weight_cl;
    mt_tensor *out = mt_tensor_new_format(name, shape, c[0]->dtype, c[0]->device, cl);
    int rc = out ? 0 : mt_backward_failed();
    if (rc == 0 && out->numel > 0)
        rc = c[1]->numel == 0 ? conv_no_channels(be, out, c[2])
                              : be->conv2d(out, c[0], c[1], c[2], p);
    if (rc == 0) {
        mt_node *node = mt_record(MT_OP_CONV2D, conv_backward, in, 3, out, &rc);
        if (node) rc = mt_node_copy_state(node, p, sizeof *p, name);
        if (node && rc == 0) {
            node->ints[0] = cl;
            node->ints[1] = weight_cl;
            node->n_ints = 2;
            /* dW needs x and dx needs W: save only what a needed gradient uses */
            if (mt_node_needs(node, 1)) rc = mt_node_save(node, 0, c[0]);
            if (rc == 0 && mt_node_needs(node, 0)) rc = mt_node_save(node, 1, c[1]);
        }
    }
    if (rc) {
        mt_tensor_unref(out);
        return NULL;
    }
    return out;
}

static mt_tensor *conv_impl(mt_tensor *x, mt_tensor *w, mt_tensor *b, const mt_conv2d_opts *o) {
    const char *name = "mt_conv2d";
    mt_conv2d_params p;
    int64_t shape[4];
    if (conv_params(o, &p) < 0 || conv_check(x, w, b, &p, shape) < 0) return NULL;
    if (!mt_backend_for(name, x->device)) return NULL;
    mt_tensor *in[3] = {x, w, b}, *c[3];
    int compute = mt_dispatch_inputs(MT_OP_CONV2D, in, 3, c);
    if (compute < 0) return NULL;
    /* the kernels take dense NCHW or NHWC operands; other strides are copied once here, and
       the node's edges still lead to the cast inputs */
    mt_tensor *d[3] = {mt_dense_4d(name, c[0], false), mt_dense_4d(name, c[1], false),
                       c[2] && !mt_is_contiguous(c[2]) ? mt_contiguous(c[2]) : mt_tensor_ref(c[2])};
    bool weight_cl = mt_prefers_channels_last(c[1]);
    mt_tensor *out = d[0] && d[1] && (d[2] || !c[2]) ? conv_run(d, c, shape, &p, weight_cl) : NULL;
    mt_dispatch_done(MT_OP_CONV2D, (mt_dtype)compute, out, in, 3);
    mt_dispatch_release(d, 3);
    mt_dispatch_release(c, 3);
    return out;
}

mt_tensor *mt_conv2d(mt_tensor *x, mt_tensor *w, mt_tensor *b, const mt_conv2d_opts *o) {
    if (!x || !w) return NULL;
    mt_api_enter();
    return mt_api_exit(conv_impl(x, w, b, o));
}
