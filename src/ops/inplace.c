/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_fill(mt_tensor *t, double value) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_fill: not implemented yet"); }
int mt_zero(mt_tensor *t) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_zero: not implemented yet"); }
int mt_copy(mt_tensor *dst, mt_tensor *src) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_copy: not implemented yet"); }
int mt_add_inplace(mt_tensor *a, mt_tensor *b) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_add_inplace: not implemented yet"); }
int mt_mul_scalar_inplace(mt_tensor *a, double s) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_mul_scalar_inplace: not implemented yet"); }
