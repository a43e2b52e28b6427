#include "dispatch.h"

/* Built at compile time from ops.def: a table filled lazily on first use would be written by
   one thread while another reads it (a data race, even if every writer stores the same bytes). */
static const char *const op_fullnames[MT_OP_COUNT] = {
#define MT_OP(id, name, rule, saves, fused) [MT_OP_##id] = "mt_" #name,
#include "../tensor/ops.def"
#undef MT_OP
};

const char *mt_op_fullname(mt_op_id op) {
    return (unsigned)op < MT_OP_COUNT ? op_fullnames[op] : "mt_?";
}

/* The widest floating dtype of the inputs, as torch's result_type: a 0-d tensor takes part
   only when no input with dims is floating (x_f16 * tensor(0.5) stays f16, as a Python
   scalar would); MT_DTYPE_COUNT when no input is floating. */
static mt_dtype widest_floating(mt_tensor *const *in, int n) {
    mt_dtype widest[2] = {MT_DTYPE_COUNT, MT_DTYPE_COUNT}; /* [0]: 0-d inputs, [1]: the others */
    for (int i = 0; i < n; i++) {
        if (!in[i] || !mt_dtype_is_floating(in[i]->dtype)) continue;
        mt_dtype *w = &widest[in[i]->ndim > 0];
        *w = *w == MT_DTYPE_COUNT ? in[i]->dtype : mt_promote_floating(*w, in[i]->dtype);
    }
    return widest[1] != MT_DTYPE_COUNT ? widest[1] : widest[0];
}

int mt_dispatch_inputs(mt_op_id op, mt_tensor *const *in, int n, mt_tensor **cast) {
    mt_dtype widest = widest_floating(in, n);
    if (widest == MT_DTYPE_COUNT) { /* no floating input: nothing to cast */
        for (int i = 0; i < n; i++) cast[i] = mt_tensor_ref(in[i]);
        return n > 0 && in[0] ? (int)in[0]->dtype : (int)MT_F32;
    }
    mt_dtype compute = mt_autocast_decide(op, widest);
    for (int i = 0; i < n; i++) {
        mt_tensor *t = in[i];
        if (!t || !mt_dtype_is_floating(t->dtype) || t->dtype == compute) {
            cast[i] = mt_tensor_ref(t);
            continue;
        }
        cast[i] = mt_autocast_cast(t, compute);
        if (!cast[i]) {
            mt_dispatch_release(cast, i);
            return -1;
        }
    }
    return (int)compute;
}

void mt_dispatch_release(mt_tensor **cast, int n) {
    for (int i = 0; i < n; i++) {
        mt_tensor_unref(cast[i]);
        cast[i] = NULL;
    }
}

static bool exact_upcast(mt_dtype from, mt_dtype to) {
    return (to == MT_F32 && (from == MT_F16 || from == MT_BF16)) ||
           (to == MT_F64 && from != MT_F64);
}

int mt_dispatch_upcast_input(mt_op_id op, mt_tensor *t, mt_tensor **cast) {
    mt_dtype want = mt_autocast_decide(op, t->dtype);
    if (want != t->dtype && !exact_upcast(t->dtype, want))
        return mt_dispatch_inputs(op, &t, 1, cast);
    *cast = mt_tensor_ref(t);
    return (int)want;
}

int mt_dispatch_mixed(mt_op_id op, mt_tensor *const *in, int n, uint32_t act_mask,
                      mt_tensor **cast) {
    mt_dtype act = mt_autocast_decide(op, in[0]->dtype);
    mt_dtype acc = mt_norm_acc_dtype(act);
    for (int i = 0; i < n; i++) {
        mt_tensor *t = in[i];
        mt_dtype want = i == 0 || (act_mask >> i & 1u) ? act : acc;
        if (!t || !mt_dtype_is_floating(t->dtype) || t->dtype == want) {
            cast[i] = mt_tensor_ref(t);
            continue;
        }
        cast[i] = mt_autocast_cast(t, want);
        if (!cast[i]) {
            mt_dispatch_release(cast, i);
            return -1;
        }
    }
    return (int)act;
}

mt_tensor *mt_dispatch_dense(mt_tensor *t, mt_dtype dt) {
    if (!t) return NULL;
    mt_tensor *c = mt_cast(t, dt);
    mt_tensor *d = c ? mt_contiguous(c) : NULL;
    mt_tensor_unref(c);
    return d;
}

mt_tensor *mt_dispatch_dense_input(mt_op_id op, mt_tensor *t) {
    mt_tensor *cast;
    if (mt_dispatch_inputs(op, &t, 1, &cast) < 0) return NULL;
    mt_tensor *d = mt_dispatch_dense(cast, cast->dtype);
    mt_tensor_unref(cast);
    return d;
}
