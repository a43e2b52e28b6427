/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

mt_tensor *mt_reshape(mt_tensor *t, int ndim, const int64_t *shape) { return 0; }
mt_tensor *mt_view(mt_tensor *t, int ndim, const int64_t *shape) { return 0; }
mt_tensor *mt_flatten(mt_tensor *t) { return 0; }
mt_tensor *mt_transpose(mt_tensor *t, int d0, int d1) { return 0; }
mt_tensor *mt_permute(mt_tensor *t, int ndim, const int *order) { return 0; }
mt_tensor *mt_narrow(mt_tensor *t, int dim, int64_t start, int64_t length) { return 0; }
mt_tensor *mt_slice(mt_tensor *t, int dim, int64_t start, int64_t end, int64_t step) { return 0; }
mt_tensor *mt_expand(mt_tensor *t, int ndim, const int64_t *shape) { return 0; }
mt_tensor *mt_squeeze(mt_tensor *t, int dim) { return 0; }
mt_tensor *mt_unsqueeze(mt_tensor *t, int dim) { return 0; }
