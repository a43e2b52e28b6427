/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_gradcheck(mt_gradcheck_fn fn, mt_tensor *const *inputs, int n, void *ctx, const mt_gradcheck_opts *opts) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_gradcheck: not implemented yet"); }
