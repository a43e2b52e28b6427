#include "init.h"
#include "../amp/autocast.h"

mt_tensor *mt_nn_uniform_param(int ndim, const int64_t *shape, double bound, mt_dtype dt,
                               mt_device dev) {
    mt_dtype draw = dt == MT_F64 ? MT_F64 : MT_F32;
    /* the draw is the same whatever region or lists the caller has (as torch's in-place
       init, which autocast never sees) */
    mt_autocast_token autocast = mt_autocast_suspend();
    mt_tensor *u = mt_rand(ndim, shape, draw, dev);
    mt_tensor *s = u ? mt_mul_scalar(u, 2.0 * bound) : NULL;
    mt_tensor_unref(u);
    mt_tensor *v = s ? mt_add_scalar(s, -bound) : NULL;
    mt_tensor_unref(s);
    mt_tensor *p = v ? mt_cast(v, dt) : NULL;
    mt_tensor_unref(v);
    mt_autocast_resume(autocast);
    if (p) mt_set_requires_grad(p, true);
    return p;
}
