/* Layout helpers of the ops that take 4-d activations (convolution, pooling). */
#ifndef MT_OPS_MEMORY_FORMAT_H
#define MT_OPS_MEMORY_FORMAT_H
#include "dispatch.h"

/* t itself (a new reference) when its strides are dense NCHW or NHWC; otherwise an
   unrecorded copy in NHWC (channels_last) or NCHW. NULL with an error. */
mt_tensor *mt_dense_4d(const char *op, mt_tensor *t, bool channels_last);
#endif
