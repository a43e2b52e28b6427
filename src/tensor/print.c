/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_print(const mt_tensor *t, FILE *f) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_print: not implemented yet"); }
int mt_format(const mt_tensor *t, char *buf, size_t cap) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_format: not implemented yet"); }
