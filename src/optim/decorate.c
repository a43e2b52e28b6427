/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_amp_decorate(mt_tensor *const *params, int n, mt_dtype low, const bool *keep_fp32) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_amp_decorate: not implemented yet"); }
