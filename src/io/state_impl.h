/* The state dict's struct, shared by the map (state.c) and the file format (safetensors.c). */
#ifndef MT_IO_STATE_IMPL_H
#define MT_IO_STATE_IMPL_H
#include "../tensor/tensor_impl.h"

struct mt_state {
    int n, cap;
    char **names;        /* owned copies, in insertion (or file) order */
    mt_tensor **tensors; /* strong references */
    int n_meta, cap_meta;
    char **meta_keys, **meta_values; /* owned copies, in insertion (or file) order */
};

/* Appends (name, t) without looking for an existing entry (the loader has already checked
   that names are unique); retains t. 0, or MT_ERR_OOM with the error set naming fn. */
int mt_state_append(mt_state *s, const char *fn, const char *name, mt_tensor *t);
/* Index of name, or -1. */
int mt_state_find(const mt_state *s, const char *name);
/* Appends or replaces a metadata entry. 0, or MT_ERR_OOM naming fn. */
int mt_state_meta_put(mt_state *s, const char *fn, const char *key, const char *value);
/* Appends a metadata entry without looking for the key (the loader checked uniqueness). */
int mt_state_meta_append(mt_state *s, const char *fn, const char *key, const char *value);
/* Moves every entry and metadata key of src into dst: those dst already has are replaced in
   place, the others appended in src's order. All or nothing: the memory this needs is
   reserved before dst changes, so on MT_ERR_OOM (naming fn) dst is as it was. src is left
   empty either way on success, untouched on failure. The savers (optimizer, scaler, layers)
   fill a fresh state and merge it, so that a failed save leaves the caller's state alone. */
int mt_state_merge(mt_state *dst, mt_state *src, const char *fn);
/* True when s is well-formed UTF-8 (safetensors headers are UTF-8 JSON: a name that is not
   could be written but not read back by other readers). */
bool mt_utf8_valid(const char *s);
#endif
