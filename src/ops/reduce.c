/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

mt_tensor *mt_sum(mt_tensor *t, int ndims, const int *dims, bool keepdim) { return 0; }
mt_tensor *mt_mean(mt_tensor *t, int ndims, const int *dims, bool keepdim) { return 0; }
mt_tensor *mt_max(mt_tensor *t, int ndims, const int *dims, bool keepdim) { return 0; }
mt_tensor *mt_sum_all(mt_tensor *t) { return 0; }
mt_tensor *mt_mean_all(mt_tensor *t) { return 0; }
mt_tensor *mt_max_all(mt_tensor *t) { return 0; }
mt_tensor *mt_softmax(mt_tensor *t, int dim) { return 0; }
mt_tensor *mt_log_softmax(mt_tensor *t, int dim) { return 0; }
