/* Parameter initialisation shared by the layers (src/nn). */
#ifndef MT_NN_INIT_H
#define MT_NN_INIT_H
#include "../tensor/tensor_impl.h"

/* U(-bound, bound) of the given shape in dtype dt, drawn from the global generator in FP32
   (F64 for F64) and rounded once; a leaf that requires grad. Call with grad mode off. */
mt_tensor *mt_nn_uniform_param(int ndim, const int64_t *shape, double bound, mt_dtype dt,
                               mt_device dev);
#endif
