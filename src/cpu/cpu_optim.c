/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "cpu.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_cpu_optim_step(const mt_optim_step_args *a) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_optim_step: not implemented yet"); }
