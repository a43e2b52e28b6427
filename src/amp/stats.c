/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../amp/autocast.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

bool mt_amp_stats_on, mt_amp_check_on;
void mt_amp_stats_record(mt_op_id op, mt_dtype compute) {  }
void mt_amp_check_output(mt_op_id op, const mt_tensor *out, mt_tensor *const *inputs, int n) {  }
void mt_amp_stats_enable(bool on) {  }
void mt_amp_stats_reset(void) {  }
int64_t mt_amp_stats_count(const char *op_name, mt_dtype compute) { return 0; }
int mt_amp_stats_print(FILE *f) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_amp_stats_print: not implemented yet"); }
void mt_amp_check_numerics(bool on) {  }
bool mt_amp_numerics_failed(void) { return false; }
const char *mt_amp_numerics_report(void) { return ""; }
void mt_amp_numerics_reset(void) {  }
