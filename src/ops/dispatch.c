#include <stdio.h>
#include "dispatch.h"

const char *mt_op_fullname(mt_op_id op) {
    static const char *names[MT_OP_COUNT];
    static char storage[MT_OP_COUNT][32];
    if ((unsigned)op >= MT_OP_COUNT) return "mt_?";
    if (!names[op]) { /* benign race: every thread writes the same bytes */
        snprintf(storage[op], sizeof storage[op], "mt_%s", mt_op_name(op));
        names[op] = storage[op];
    }
    return names[op];
}

int mt_dispatch_inputs(mt_op_id op, mt_tensor *const *in, int n, mt_tensor **cast) {
    mt_dtype widest = MT_DTYPE_COUNT;
    for (int i = 0; i < n; i++) {
        if (!in[i] || !mt_dtype_is_floating(in[i]->dtype)) continue;
        widest =
            widest == MT_DTYPE_COUNT ? in[i]->dtype : mt_promote_floating(widest, in[i]->dtype);
    }
    if (widest == MT_DTYPE_COUNT) { /* no floating input: nothing to cast */
        for (int i = 0; i < n; i++) cast[i] = mt_retain(in[i]);
        return n > 0 && in[0] ? (int)in[0]->dtype : (int)MT_F32;
    }
    mt_dtype compute = mt_autocast_decide(op, widest);
    for (int i = 0; i < n; i++) {
        mt_tensor *t = in[i];
        if (!t || !mt_dtype_is_floating(t->dtype) || t->dtype == compute) {
            cast[i] = mt_retain(t);
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
        mt_release(cast[i]);
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
    *cast = mt_retain(t);
    return (int)want;
}
