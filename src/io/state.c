/* The state dict: an ordered name -> tensor map with string metadata, and loading a state
   into parameters with torch's load_state_dict semantics. The file format is safetensors.c. */
#include <stdlib.h>
#include <string.h>
#include "state_impl.h"

#define META_KEY "__metadata__" /* safetensors' reserved header key */

bool mt_utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len) return false;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        /* overlong forms, surrogates and code points past U+10FFFF are not UTF-8 */
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        p += len;
    }
    return true;
}

mt_state *mt_state_new(void) {
    mt_state *s = mt_heap_calloc(1, sizeof *s);
    if (!s) mt_error_set(MT_ERR_OOM, "mt_state_new: out of memory");
    return s;
}

void mt_state_free(mt_state *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        mt_tensor_unref(s->tensors[i]);
    }
    for (int i = 0; i < s->n_meta; i++) {
        free(s->meta_keys[i]);
        free(s->meta_values[i]);
    }
    free(s->names);
    free(s->tensors);
    free(s->meta_keys);
    free(s->meta_values);
    free(s);
}

int mt_state_find(const mt_state *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) return i;
    return -1;
}

/* Makes room for `need` entries in two parallel arrays; 0 or -1 (then only their capacity may
   have grown, never their contents). */
static int reserve(void ***a, void ***b, int need, int *cap) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 8;
    if (nc < need) nc = need;
    void **na = mt_heap_realloc(*a, (size_t)nc * sizeof *na);
    if (!na) return -1;
    *a = na;
    void **nb = mt_heap_realloc(*b, (size_t)nc * sizeof *nb);
    if (!nb) return -1;
    *b = nb;
    *cap = nc;
    return 0;
}

int mt_state_append(mt_state *s, const char *fn, const char *name, mt_tensor *t) {
    char *copy = NULL;
    if (reserve((void ***)&s->names, (void ***)&s->tensors, s->n + 1, &s->cap) < 0 ||
        !(copy = mt_heap_strdup(name)))
        return mt_error_set(MT_ERR_OOM, "%s: out of memory adding entry '%s'", fn, name);
    s->names[s->n] = copy;
    s->tensors[s->n++] = mt_tensor_ref(t);
    return 0;
}

static int meta_find(const mt_state *s, const char *key) {
    for (int i = 0; i < s->n_meta; i++)
        if (strcmp(s->meta_keys[i], key) == 0) return i;
    return -1;
}

int mt_state_merge(mt_state *dst, mt_state *src, const char *fn) {
    int add = 0, add_meta = 0;
    for (int i = 0; i < src->n; i++) add += mt_state_find(dst, src->names[i]) < 0;
    for (int i = 0; i < src->n_meta; i++) add_meta += meta_find(dst, src->meta_keys[i]) < 0;
    if (reserve((void ***)&dst->names, (void ***)&dst->tensors, dst->n + add, &dst->cap) < 0 ||
        reserve((void ***)&dst->meta_keys, (void ***)&dst->meta_values, dst->n_meta + add_meta,
                &dst->cap_meta) < 0)
        return mt_error_set(MT_ERR_OOM, "%s: out of memory adding %d entries to the state", fn,
                            add + add_meta);
    /* from here on nothing allocates: src's strings and references change hands */
    for (int i = 0; i < src->n; i++) {
        int k = mt_state_find(dst, src->names[i]);
        if (k < 0) {
            dst->names[dst->n] = src->names[i];
            dst->tensors[dst->n++] = src->tensors[i];
            continue;
        }
        free(src->names[i]);
        mt_tensor_unref(dst->tensors[k]);
        dst->tensors[k] = src->tensors[i];
    }
    for (int i = 0; i < src->n_meta; i++) {
        int k = meta_find(dst, src->meta_keys[i]);
        if (k < 0) {
            dst->meta_keys[dst->n_meta] = src->meta_keys[i];
            dst->meta_values[dst->n_meta++] = src->meta_values[i];
            continue;
        }
        free(src->meta_keys[i]);
        free(dst->meta_values[k]);
        dst->meta_values[k] = src->meta_values[i];
    }
    src->n = src->n_meta = 0;
    return 0;
}

/* Non-empty well-formed UTF-8, and (for tensor names) not the reserved key. */
static int check_name(const char *fn, int arg, const char *what, const char *name,
                      bool tensor_name) {
    if (!name) return mt_error_set(MT_ERR_NULL, "%s: arg %d: %s is NULL", fn, arg, what);
    if (!*name) return mt_error_set(MT_ERR_INVALID, "%s: arg %d: %s is empty", fn, arg, what);
    if (!mt_utf8_valid(name))
        return mt_error_set(MT_ERR_INVALID, "%s: arg %d: %s is not valid UTF-8", fn, arg, what);
    if (tensor_name && strcmp(name, META_KEY) == 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg %d: '%s' is reserved for the metadata in safetensors files",
                            fn, arg, META_KEY);
    return 0;
}

int mt_state_put(mt_state *s, const char *name, mt_tensor *t) {
    static const char fn[] = "mt_state_put";
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 1: state is NULL", fn);
    int rc = check_name(fn, 2, "name", name, true);
    if (rc) return rc;
    if (!t) return mt_error_set(MT_ERR_NULL, "%s: arg 3: tensor for '%s' is NULL", fn, name);
    int i = mt_state_find(s, name);
    if (i < 0) return mt_state_append(s, fn, name, t);
    mt_tensor_ref(t);
    mt_tensor_unref(s->tensors[i]);
    s->tensors[i] = t;
    return 0;
}

mt_tensor *mt_state_get(mt_state *s, const char *name) {
    static const char fn[] = "mt_state_get";
    mt_api_enter();
    mt_tensor *r = NULL;
    if (!s)
        mt_error_set(MT_ERR_NULL, "%s: arg 1: state is NULL", fn);
    else if (!name)
        mt_error_set(MT_ERR_NULL, "%s: arg 2: name is NULL", fn);
    else {
        int i = mt_state_find(s, name);
        if (i < 0)
            mt_error_set(MT_ERR_INVALID, "%s: no entry named '%s' (the state has %d entries)", fn,
                         name, s->n);
        else
            r = mt_tensor_ref(s->tensors[i]);
    }
    return mt_api_exit(r);
}

bool mt_state_contains(const mt_state *s, const char *name) {
    return s && name && mt_state_find(s, name) >= 0;
}

int mt_state_count(const mt_state *s) {
    return s ? s->n : -1;
}

const char *mt_state_name(const mt_state *s, int i) {
    return s && i >= 0 && i < s->n ? s->names[i] : NULL;
}

int mt_state_meta_put(mt_state *s, const char *fn, const char *key, const char *value) {
    for (int i = 0; i < s->n_meta; i++)
        if (strcmp(s->meta_keys[i], key) == 0) {
            char *v = mt_heap_strdup(value);
            if (!v)
                return mt_error_set(MT_ERR_OOM, "%s: out of memory storing metadata '%s'", fn, key);
            free(s->meta_values[i]);
            s->meta_values[i] = v;
            return 0;
        }
    return mt_state_meta_append(s, fn, key, value);
}

int mt_state_meta_append(mt_state *s, const char *fn, const char *key, const char *value) {
    char *v = mt_heap_strdup(value);
    if (!v) return mt_error_set(MT_ERR_OOM, "%s: out of memory storing metadata '%s'", fn, key);
    char *k = NULL;
    if (reserve((void ***)&s->meta_keys, (void ***)&s->meta_values, s->n_meta + 1, &s->cap_meta) <
            0 ||
        !(k = mt_heap_strdup(key))) {
        free(v);
        return mt_error_set(MT_ERR_OOM, "%s: out of memory storing metadata '%s'", fn, key);
    }
    s->meta_keys[s->n_meta] = k;
    s->meta_values[s->n_meta++] = v;
    return 0;
}

int mt_state_set_meta(mt_state *s, const char *key, const char *value) {
    static const char fn[] = "mt_state_set_meta";
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 1: state is NULL", fn);
    int rc = check_name(fn, 2, "key", key, false);
    if (rc) return rc;
    if (!value) return mt_error_set(MT_ERR_NULL, "%s: arg 3: value for '%s' is NULL", fn, key);
    if (!mt_utf8_valid(value))
        return mt_error_set(MT_ERR_INVALID, "%s: arg 3: value for '%s' is not valid UTF-8", fn,
                            key);
    return mt_state_meta_put(s, fn, key, value);
}

const char *mt_state_get_meta(const mt_state *s, const char *key) {
    if (!s || !key) return NULL;
    for (int i = 0; i < s->n_meta; i++)
        if (strcmp(s->meta_keys[i], key) == 0) return s->meta_values[i];
    return NULL;
}

int mt_state_meta_count(const mt_state *s) {
    return s ? s->n_meta : -1;
}

const char *mt_state_meta_key(const mt_state *s, int i) {
    return s && i >= 0 && i < s->n_meta ? s->meta_keys[i] : NULL;
}

/* ------------------------------------------------------------------ load_into */

/* Appends ", name" to a bounded list of names for a message ("..." once it is full). */
static void list_add(char *buf, size_t cap, const char *name) {
    size_t len = strlen(buf);
    if (len + 8 >= cap) return;
    if (len + strlen(name) + 8 >= cap) {
        if (!strstr(buf, "...")) snprintf(buf + len, cap - len, "%s...", len ? ", " : "");
        return;
    }
    snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", name);
}

/* Validates every pair; fills idx[i] with the entry index for names[i] (or -1 when missing
   and not strict). */
static int load_into_check(const char *fn, mt_state *s, const char *prefix,
                           mt_tensor *const *params, const char *const *names, int n, bool strict,
                           int *idx, char *key, size_t key_cap) {
    size_t plen = strlen(prefix);
    char missing[256] = "";
    int n_missing = 0;
    for (int i = 0; i < n; i++) {
        if (!params[i]) return mt_error_set(MT_ERR_NULL, "%s: arg 3: params[%d] is NULL", fn, i);
        if (!names[i]) return mt_error_set(MT_ERR_NULL, "%s: arg 4: names[%d] is NULL", fn, i);
        if (mt_check_no_self_overlap(fn, 3, params[i]) < 0) return mt_last_status();
        snprintf(key, key_cap, "%s%s", prefix, names[i]);
        for (int j = 0; j < i; j++)
            if (strcmp(names[j], names[i]) == 0)
                return mt_error_set(MT_ERR_INVALID,
                                    "%s: arg 4: names[%d] and names[%d] are both '%s'", fn, j, i,
                                    names[i]);
        idx[i] = mt_state_find(s, key);
        if (idx[i] < 0) {
            n_missing++;
            list_add(missing, sizeof missing, key);
            continue;
        }
        const mt_tensor *src = s->tensors[idx[i]], *p = params[i];
        if (src->dtype != p->dtype || src->ndim != p->ndim ||
            memcmp(src->shape, p->shape, (size_t)p->ndim * sizeof *p->shape) != 0) {
            char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
            return mt_error_set(src->dtype != p->dtype ? MT_ERR_DTYPE : MT_ERR_SHAPE,
                                "%s: entry '%s' is %s %s but params[%d] is %s %s", fn, key,
                                mt_dtype_name(src->dtype), mt_shape_str(src, b1, sizeof b1), i,
                                mt_dtype_name(p->dtype), mt_shape_str(p, b2, sizeof b2));
        }
    }
    char unexpected[256] = "";
    int n_unexpected = 0;
    for (int j = 0; strict && j < s->n; j++) {
        if (strncmp(s->names[j], prefix, plen) != 0) continue;
        bool claimed = false;
        for (int i = 0; i < n && !claimed; i++) claimed = idx[i] == j;
        if (!claimed) {
            n_unexpected++;
            list_add(unexpected, sizeof unexpected, s->names[j]);
        }
    }
    if (strict && (n_missing || n_unexpected))
        return mt_error_set(MT_ERR_INVALID,
                            "%s: strict load under prefix '%s': %d missing entr%s%s%s; %d "
                            "unexpected entr%s%s%s",
                            fn, prefix, n_missing, n_missing == 1 ? "y" : "ies",
                            n_missing ? ": " : "", missing, n_unexpected,
                            n_unexpected == 1 ? "y" : "ies", n_unexpected ? ": " : "", unexpected);
    return 0;
}

int mt_state_load_into(mt_state *s, const char *prefix, mt_tensor *const *params,
                       const char *const *names, int n, bool strict) {
    static const char fn[] = "mt_state_load_into";
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 1: state is NULL", fn);
    if (!params) return mt_error_set(MT_ERR_NULL, "%s: arg 3: params is NULL", fn);
    if (!names) return mt_error_set(MT_ERR_NULL, "%s: arg 4: names is NULL", fn);
    if (n < 0) return mt_error_set(MT_ERR_INVALID, "%s: arg 5: n is %d", fn, n);
    if (!prefix) prefix = "";
    /* room for prefix + the longest name: state names have no length limit */
    size_t longest = 0;
    for (int i = 0; i < n; i++)
        if (names[i] && strlen(names[i]) > longest) longest = strlen(names[i]);
    size_t key_cap = strlen(prefix) + longest + 1;
    int *idx = mt_heap_alloc((size_t)(n ? n : 1) * sizeof *idx);
    char *key = mt_heap_alloc(key_cap);
    if (!idx || !key) {
        free(idx);
        free(key);
        return mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
    }
    int rc = load_into_check(fn, s, prefix, params, names, n, strict, idx, key, key_cap);
    free(key);
    if (rc) {
        free(idx);
        return rc;
    }
    /* Move every source to its parameter's device first, so that a failure there (device
       out of memory) leaves every parameter as it was. */
    mt_tensor **moved = mt_heap_calloc((size_t)(n ? n : 1), sizeof *moved);
    if (!moved) rc = mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    for (int i = 0; i < n && !rc; i++) {
        if (idx[i] < 0) continue;
        mt_tensor *m = mt_to(s->tensors[idx[i]], params[i]->device);
        if (m && m->storage == params[i]->storage) { /* the parameter itself, or a view of it */
            mt_tensor *c = mt_clone(m);
            mt_tensor_unref(m);
            m = c;
        }
        if (!(moved[i] = m)) rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    }
    /* the writes: the backend's copy between tensors of one shape and dtype on one device
       allocates nothing, so they cannot stop half way */
    for (int i = 0; i < n && !rc; i++)
        if (moved[i]) rc = mt_tensor_overwrite(params[i], moved[i]);
    mt_set_grad_enabled(prev);
    for (int i = 0; moved && i < n; i++) mt_tensor_unref(moved[i]);
    free(moved);
    free(idx);
    return mt_api_exit_status(rc);
}
