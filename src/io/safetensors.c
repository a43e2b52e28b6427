/* safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
   header length N, N bytes of UTF-8 JSON, then the data buffer. The header maps each name to
   {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data buffer) and
   may hold "__metadata__": {string: string}. The data buffer is exactly covered by the
   tensors, with no gap and no overlap. Saving is atomic; loading maps the file and validates
   every field before it allocates anything, so a hostile file costs no more than its header.
   Host byte order is little-endian (x86-64, AArch64): the data is copied as is. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../tensor/backend.h"
#include "state_impl.h"

/* safetensors data is little-endian and is copied as is */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors I/O needs a little-endian host");

#define META_KEY     "__metadata__"
#define MAX_HEADER   ((uint64_t)100000000) /* the reference implementation's limit */
#define MAX_JSON_INT 9007199254740992.0    /* 2^53: larger integers are not exact in JSON */

static const char *const st_dtype_names[MT_DTYPE_COUNT] = {
    [MT_F32] = "F32", [MT_F16] = "F16", [MT_BF16] = "BF16", [MT_F64] = "F64",
    [MT_I64] = "I64", [MT_I32] = "I32", [MT_BOOL] = "BOOL"};

static int dtype_from_name(const char *s, mt_dtype *out) {
    for (int i = 0; i < MT_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtype_names[i]) == 0) {
            *out = (mt_dtype)i;
            return 0;
        }
    return -1;
}

/* ------------------------------------------------------------------ save */

/* The header JSON for s, padded with spaces so that the data starts 8-byte aligned (as the
   reference writer does); *len is its length. NULL with the error set. */
static char *build_header(const mt_state *s, const char *fn, const char *path, size_t *len,
                          size_t *max_bytes) {
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && s->n_meta) {
        cJSON *meta = cJSON_AddObjectToObject(root, META_KEY);
        ok = meta != NULL;
        for (int i = 0; ok && i < s->n_meta; i++)
            ok = cJSON_AddStringToObject(meta, s->meta_keys[i], s->meta_values[i]) != NULL;
    }
    uint64_t offset = 0;
    *max_bytes = 0;
    for (int i = 0; ok && i < s->n; i++) {
        const mt_tensor *t = s->tensors[i];
        size_t nbytes = (size_t)t->numel * mt_dtype_size(t->dtype);
        if (nbytes > *max_bytes) *max_bytes = nbytes;
        cJSON *e = cJSON_AddObjectToObject(root, s->names[i]);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = offs && cJSON_AddStringToObject(e, "dtype", st_dtype_names[t->dtype]);
        for (int d = 0; ok && d < t->ndim; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + nbytes)));
        offset += nbytes;
    }
    if (ok && (double)offset > MAX_JSON_INT) {
        cJSON_Delete(root);
        mt_error_set(MT_ERR_INVALID, "%s: %s: %llu bytes of data do not fit the format", fn, path,
                     (unsigned long long)offset);
        return NULL;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) {
        mt_error_set(MT_ERR_OOM, "%s: %s: out of memory building the header", fn, path);
        return NULL;
    }
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    char *out = mt_heap_realloc(json, padded + 1);
    if (!out) {
        free(json);
        mt_error_set(MT_ERR_OOM, "%s: %s: out of memory building the header", fn, path);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len = padded;
    return out;
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Opens a new temporary file in the directory of path: "<dir>/.mt_state.<pid>.<k>.tmp", a
   name short enough for any directory whatever the length of path's own name. private: made
   0600 (the caller then gives it the permissions of the file it replaces), so that nobody
   can open it while a private checkpoint is being written; else 0666 less the umask. */
static int open_temp(const char *path, char *tmp, size_t cap, bool private) {
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) + 1 : 0; /* with the slash */
    for (unsigned k = 0; k < 1000; k++) {
        if ((size_t)snprintf(tmp, cap, "%.*s.mt_state.%ld.%u.tmp", dir_len, path, (long)getpid(),
                             k) >= cap) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, private ? 0600 : 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* What a save to path replaces: nothing, a regular file (whose permissions *mode receives,
   to keep), or a symbolic link, which is replaced by the file like any name and never
   followed: following it would let whoever made the link choose what gets overwritten (a
   link in /tmp to someone's ~/.bashrc). A directory, device, FIFO or socket is refused: a
   rename would replace it. *mode is -1 when there are no permissions to keep. */
static int save_target(const char *fn, const char *path, int *mode) {
    struct stat st;
    *mode = -1;
    if (lstat(path, &st) < 0 || S_ISLNK(st.st_mode)) return 0; /* the open says why, if any */
    if (!S_ISREG(st.st_mode))
        return mt_error_set(MT_ERR_INVALID,
                            "%s: %s: exists and is not a regular file (a directory, device, FIFO "
                            "or socket); refused",
                            fn, path);
    *mode = (int)(st.st_mode & 07777);
    return 0;
}

/* fsync of the directory that holds path, so that the rename itself is durable. */
static int sync_dir(const char *path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    /* some file systems cannot fsync a directory; the rename is done either way */
    if (rc < 0 && (errno == EINVAL || errno == EBADF)) rc = 0;
    close(fd);
    return rc;
}

/* Writes the header and every tensor's bytes to fd. */
static int write_body(const mt_state *s, const char *fn, const char *path, int fd,
                      const char *header, size_t hlen, size_t max_bytes) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (write_all(fd, len8, 8) < 0 || write_all(fd, header, hlen) < 0)
        return mt_error_set(MT_ERR_INVALID, "%s: %s: write failed: %s", fn, path, strerror(errno));
    void *buf = max_bytes ? mt_heap_alloc(max_bytes) : NULL;
    if (max_bytes && !buf)
        return mt_error_set(MT_ERR_OOM, "%s: %s: out of memory (%zu bytes) staging a tensor", fn,
                            path, max_bytes);
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        const mt_tensor *t = s->tensors[i];
        size_t nbytes = (size_t)t->numel * mt_dtype_size(t->dtype);
        if (!nbytes) continue;
        rc = mt_copy_to_host(t, buf, nbytes);
        if (!rc && write_all(fd, buf, nbytes) < 0)
            rc =
                mt_error_set(MT_ERR_INVALID, "%s: %s: write failed: %s", fn, path, strerror(errno));
    }
    free(buf);
    return rc;
}

int mt_state_save(const mt_state *s, const char *path) {
    static const char fn[] = "mt_state_save";
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 1: state is NULL", fn);
    if (!path) return mt_error_set(MT_ERR_NULL, "%s: arg 2: path is NULL", fn);
    if (mt_last_status() != MT_OK) /* the tensors may hold half-made values */
        return mt_error_set(MT_ERR_STATE, "%s: %s: an earlier error is pending (%s)", fn, path,
                            mt_last_error());
    size_t hlen = 0, max_bytes = 0;
    char *header = build_header(s, fn, path, &hlen, &max_bytes);
    if (!header) return mt_last_status();
    char tmp[PATH_MAX];
    int mode;
    if (save_target(fn, path, &mode) < 0) {
        free(header);
        return mt_last_status();
    }
    int fd = open_temp(path, tmp, sizeof tmp, mode >= 0);
    if (fd < 0) {
        free(header);
        return mt_error_set(MT_ERR_INVALID, "%s: %s: cannot create a temporary file: %s", fn, path,
                            strerror(errno));
    }
    /* a file replaced keeps its permissions (a private checkpoint stays private), given
       before any byte is written */
    int rc = 0;
    if (mode >= 0 && fchmod(fd, (mode_t)mode) < 0)
        rc = mt_error_set(MT_ERR_INVALID, "%s: %s: cannot keep the file's permissions: %s", fn,
                          path, strerror(errno));
    if (!rc) rc = write_body(s, fn, path, fd, header, hlen, max_bytes);
    free(header);
    if (!rc && fsync(fd) < 0)
        rc = mt_error_set(MT_ERR_INVALID, "%s: %s: fsync failed: %s", fn, path, strerror(errno));
    if (close(fd) < 0 && !rc)
        rc = mt_error_set(MT_ERR_INVALID, "%s: %s: close failed: %s", fn, path, strerror(errno));
    if (!rc && rename(tmp, path) < 0)
        rc = mt_error_set(MT_ERR_INVALID, "%s: %s: rename from %s failed: %s", fn, path, tmp,
                          strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    if (sync_dir(path) < 0)
        return mt_error_set(MT_ERR_INVALID, "%s: %s: fsync of the directory failed: %s", fn, path,
                            strerror(errno));
    return 0;
}

/* ------------------------------------------------------------------ load */

typedef struct {
    const char *name; /* inside the parsed JSON */
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    uint64_t begin, end;
} entry;

typedef struct {
    const char *fn, *path;
    const unsigned char *data; /* the data buffer inside the mapping */
    uint64_t data_len;
    cJSON *root;
    entry *entries;
    int n;
} loader;

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= MAX_JSON_INT) || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

#define LOAD_ERR(L, st, ...) load_err((L), (st), __VA_ARGS__)
static int load_err(const loader *L, mt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int load_err(const loader *L, mt_status st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mt_error_set(st, "%s: %s: %s", L->fn, L->path, msg);
}

/* Fills e from the JSON object j (the entry named j->string). */
static int parse_entry(const loader *L, const cJSON *j, entry *e) {
    const char *name = j->string;
    if (!cJSON_IsObject(j))
        return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s' is not a JSON object", name);
    if (!mt_utf8_valid(name))
        return LOAD_ERR(L, MT_ERR_INVALID, "an entry name is not valid UTF-8");
    if (!*name) /* mt_state_put refuses one too: no name for it to be loaded under */
        return LOAD_ERR(L, MT_ERR_INVALID, "an entry has an empty name");
    e->name = name;
    const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = j->child; f; f = f->next) {
        const cJSON **slot = strcmp(f->string, "dtype") == 0          ? &dt
                             : strcmp(f->string, "shape") == 0        ? &shape
                             : strcmp(f->string, "data_offsets") == 0 ? &offs
                                                                      : NULL;
        if (!slot)
            return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s' has an unknown field '%s'", name,
                            f->string);
        if (*slot)
            return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s' has field '%s' twice", name, f->string);
        *slot = f;
    }
    if (!dt || !shape || !offs)
        return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s' lacks its '%s' field", name,
                        !dt      ? "dtype"
                        : !shape ? "shape"
                                 : "data_offsets");
    if (!cJSON_IsString(dt) || dtype_from_name(dt->valuestring, &e->dtype) < 0)
        return LOAD_ERR(L, MT_ERR_DTYPE,
                        "entry '%s' has dtype %s%s%s: supported are F32 F16 BF16 F64 I64 I32 BOOL",
                        name, cJSON_IsString(dt) ? "'" : "(not a string)",
                        cJSON_IsString(dt) ? dt->valuestring : "", cJSON_IsString(dt) ? "'" : "");
    if (!cJSON_IsArray(shape))
        return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s': shape is not an array", name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > MT_MAX_DIMS)
        return LOAD_ERR(L, MT_ERR_UNSUPPORTED, "entry '%s' has %d dimensions (at most %d)", name,
                        nd, MT_MAX_DIMS);
    e->ndim = nd;
    uint64_t bytes = mt_dtype_size(e->dtype), d = 0;
    int k = 0;
    for (const cJSON *x = shape->child; x; x = x->next, k++) {
        if (!json_uint(x, &d))
            return LOAD_ERR(L, MT_ERR_SHAPE,
                            "entry '%s': shape[%d] is not a non-negative integer below 2^53", name,
                            k);
        e->shape[k] = (int64_t)d;
        if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > (uint64_t)INT64_MAX)
            return LOAD_ERR(L, MT_ERR_SHAPE, "entry '%s': the shape's byte size overflows", name);
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_uint(offs->child, &e->begin) || !json_uint(offs->child->next, &e->end))
        return LOAD_ERR(L, MT_ERR_INVALID,
                        "entry '%s': data_offsets is not [begin, end] of non-negative integers",
                        name);
    if (e->begin > e->end)
        return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s': data_offsets [%llu, %llu] are out of order",
                        name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > L->data_len)
        return LOAD_ERR(L, MT_ERR_INVALID,
                        "entry '%s': data_offsets [%llu, %llu] run past the %llu bytes of data",
                        name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)L->data_len);
    if (e->end - e->begin != bytes)
        return LOAD_ERR(L, MT_ERR_SHAPE,
                        "entry '%s': shape and dtype %s make %llu bytes but data_offsets [%llu, "
                        "%llu] hold %llu",
                        name, st_dtype_names[e->dtype], (unsigned long long)bytes,
                        (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)(e->end - e->begin));
    if (e->dtype == MT_BOOL) /* torch and numpy store bool as one byte, 0 or 1 */
        for (uint64_t b = e->begin; b < e->end; b++)
            if (L->data[b] > 1)
                return LOAD_ERR(L, MT_ERR_INVALID, "entry '%s': BOOL byte %llu is %u, not 0 or 1",
                                name, (unsigned long long)(b - e->begin), L->data[b]);
    return 0;
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

static int cmp_entry_offset(const void *a, const void *b) {
    const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Unique names; offsets that tile the data buffer exactly (no gap, no overlap). */
static int check_layout(const loader *L) {
    if (L->n == 0) {
        if (L->data_len)
            return LOAD_ERR(L, MT_ERR_INVALID, "%llu bytes of data follow a header with no tensor",
                            (unsigned long long)L->data_len);
        return 0;
    }
    const entry **by = mt_heap_alloc((size_t)L->n * sizeof *by);
    if (!by) return LOAD_ERR(L, MT_ERR_OOM, "out of memory checking %d entries", L->n);
    for (int i = 0; i < L->n; i++) by[i] = &L->entries[i];
    qsort(by, (size_t)L->n, sizeof *by, cmp_entry_name);
    int rc = 0;
    for (int i = 1; i < L->n && !rc; i++)
        if (strcmp(by[i]->name, by[i - 1]->name) == 0)
            rc = LOAD_ERR(L, MT_ERR_INVALID, "entry '%s' appears twice", by[i]->name);
    if (!rc) qsort(by, (size_t)L->n, sizeof *by, cmp_entry_offset);
    uint64_t at = 0;
    for (int i = 0; i < L->n && !rc; i++) {
        if (by[i]->begin != at)
            rc = LOAD_ERR(L, MT_ERR_INVALID,
                          "entry '%s' starts at data offset %llu, expected %llu (%s)", by[i]->name,
                          (unsigned long long)by[i]->begin, (unsigned long long)at,
                          by[i]->begin < at ? "it overlaps the entry before" : "a gap before it");
        at = by[i]->end;
    }
    if (!rc && at != L->data_len)
        rc = LOAD_ERR(L, MT_ERR_INVALID, "the tensors cover %llu of the %llu bytes of data",
                      (unsigned long long)at, (unsigned long long)L->data_len);
    free(by);
    return rc;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Metadata keys are unique (sorted, so a header of many keys costs n log n). */
static int check_meta_unique(const loader *L, const cJSON *meta) {
    int n = cJSON_GetArraySize(meta), k = 0, rc = 0;
    if (n < 2) return 0;
    const char **keys = mt_heap_alloc((size_t)n * sizeof *keys);
    if (!keys) return LOAD_ERR(L, MT_ERR_OOM, "out of memory checking %d metadata keys", n);
    for (const cJSON *m = meta->child; m; m = m->next) keys[k++] = m->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_str_ptr);
    for (int i = 1; i < n && !rc; i++)
        if (strcmp(keys[i], keys[i - 1]) == 0)
            rc = LOAD_ERR(L, MT_ERR_INVALID, "metadata '%s' appears twice", keys[i]);
    free(keys);
    return rc;
}

/* What cJSON lets through but JSON (and Python's safetensors) refuses, or what a C string
   cannot hold: a raw control byte (JSON allows only tab, newline and carriage return, and
   only between tokens), and a \u0000 escape in a string (cJSON would cut the name or the
   value short there). */
static int check_header_bytes(const loader *L, const char *json, size_t len) {
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)json[i];
        if (c < 0x20 && (in_string || (c != '\t' && c != '\n' && c != '\r')))
            return LOAD_ERR(L, MT_ERR_INVALID,
                            "the JSON header has a raw control byte 0x%02x at byte %zu", c, i);
        if (c == '"') {
            in_string = !in_string;
        } else if (in_string && c == '\\' && i + 1 < len) {
            if (json[i + 1] == 'u' && i + 5 < len && memcmp(json + i + 2, "0000", 4) == 0)
                return LOAD_ERR(L, MT_ERR_INVALID,
                                "the JSON header has a \\u0000 (NUL) in a string at byte %zu", i);
            i++; /* the escaped character: an escaped quote does not end the string */
        }
    }
    return 0;
}

/* Parses and validates the header; fills L->root and L->entries. */
static int parse_header(loader *L, const char *json, size_t len, const cJSON **meta) {
    const char *end = NULL;
    int bad = check_header_bytes(L, json, len);
    if (bad) return bad;
    L->root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!L->root)
        return LOAD_ERR(L, MT_ERR_INVALID, "malformed JSON header at byte %lld of %zu",
                        end ? (long long)(end - json) : -1LL, len);
    for (const char *p = end; p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return LOAD_ERR(L, MT_ERR_INVALID,
                            "unexpected bytes after the JSON header at byte %lld",
                            (long long)(p - json));
    if (!cJSON_IsObject(L->root))
        return LOAD_ERR(L, MT_ERR_INVALID, "the JSON header is not an object");
    int count = 0;
    *meta = NULL;
    for (const cJSON *j = L->root->child; j; j = j->next) {
        if (strcmp(j->string, META_KEY) != 0) {
            count++;
            continue;
        }
        if (*meta) return LOAD_ERR(L, MT_ERR_INVALID, "'%s' appears twice", META_KEY);
        if (!cJSON_IsObject(j))
            return LOAD_ERR(L, MT_ERR_INVALID, "'%s' is not an object", META_KEY);
        for (const cJSON *m = j->child; m; m = m->next) {
            if (!cJSON_IsString(m) || !mt_utf8_valid(m->string) || !mt_utf8_valid(m->valuestring))
                return LOAD_ERR(L, MT_ERR_INVALID, "metadata '%s' is not a UTF-8 string",
                                m->string);
        }
        int rc = check_meta_unique(L, j);
        if (rc) return rc;
        *meta = j;
    }
    L->entries = mt_heap_calloc(count ? (size_t)count : 1, sizeof *L->entries);
    if (!L->entries) return LOAD_ERR(L, MT_ERR_OOM, "out of memory for %d entries", count);
    for (const cJSON *j = L->root->child; j; j = j->next) {
        if (strcmp(j->string, META_KEY) == 0) continue;
        int rc = parse_entry(L, j, &L->entries[L->n]);
        if (rc) return rc;
        L->n++;
    }
    return check_layout(L);
}

/* Builds the state from the validated entries, copying each tensor to dev. */
static mt_state *build_state(const loader *L, const cJSON *meta, mt_device dev) {
    mt_state *s = mt_state_new();
    if (!s) return NULL;
    for (const cJSON *m = meta ? meta->child : NULL; m; m = m->next)
        if (mt_state_meta_append(s, L->fn, m->string, m->valuestring) < 0) goto fail;
    for (int i = 0; i < L->n; i++) {
        const entry *e = &L->entries[i];
        const unsigned char *src = L->data + e->begin;
        size_t nbytes = (size_t)(e->end - e->begin), align = mt_dtype_size(e->dtype);
        void *staged = NULL;
        /* the kernels read whole elements: stage a misaligned tensor in aligned memory */
        if (nbytes && (uintptr_t)src % align) {
            if (!(staged = mt_heap_alloc(nbytes))) {
                LOAD_ERR(L, MT_ERR_OOM, "out of memory staging '%s'", e->name);
                goto fail;
            }
            memcpy(staged, src, nbytes);
            src = staged;
        }
        mt_tensor *t = mt_from_data(src, e->dtype, e->ndim, e->shape, dev);
        free(staged);
        int rc = t ? mt_state_append(s, L->fn, e->name, t) : -1;
        mt_tensor_unref(t);
        if (rc) goto fail;
    }
    return s;
fail:
    mt_state_free(s);
    return NULL;
}

mt_state *mt_state_load(const char *path, mt_device dev) {
    loader L = {.fn = "mt_state_load", .path = path};
    if (!path) {
        mt_error_set(MT_ERR_NULL, "mt_state_load: arg 1: path is NULL");
        return NULL;
    }
    if (!mt_backend_for(L.fn, dev)) return NULL;
    /* O_NONBLOCK: opening a FIFO would otherwise wait for a writer before fstat refuses it
       (reads of a regular file ignore the flag) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        LOAD_ERR(&L, MT_ERR_INVALID, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    void *map = MAP_FAILED;
    mt_state *s = NULL;
    const cJSON *meta = NULL;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        LOAD_ERR(&L, MT_ERR_INVALID, "not a regular file");
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        LOAD_ERR(&L, MT_ERR_INVALID, "truncated: %llu bytes, less than the 8-byte header length",
                 (unsigned long long)size);
        goto out;
    }
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        LOAD_ERR(&L, MT_ERR_INVALID, "cannot map: %s", strerror(errno));
        goto out;
    }
    const unsigned char *base = map;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)base[i] << (8 * i);
    if (hlen > size - 8 || hlen > MAX_HEADER || hlen < 2) {
        LOAD_ERR(&L, MT_ERR_INVALID, "header length %llu does not fit the file of %llu bytes%s",
                 (unsigned long long)hlen, (unsigned long long)size,
                 hlen > MAX_HEADER ? " (limit 100000000)" : "");
        goto out;
    }
    L.data = base + 8 + hlen;
    L.data_len = size - 8 - hlen;
    /* The parser reads a heap copy of exactly the header's bytes: a read past them would be
       a heap overflow that the sanitizers catch (the fuzz test runs under ASan), where a
       read past the header inside the mapping would go unnoticed. */
    char *header = mt_heap_alloc((size_t)hlen);
    if (!header) {
        LOAD_ERR(&L, MT_ERR_OOM, "out of memory for the %llu-byte header",
                 (unsigned long long)hlen);
        goto out;
    }
    memcpy(header, base + 8, (size_t)hlen);
    if (parse_header(&L, header, (size_t)hlen, &meta) == 0) {
        mt_api_enter(); /* the tensors belong to the state, not to an open scope */
        s = build_state(&L, meta, dev);
        mt_api_exit_status(0);
    }
    free(header);
out:
    cJSON_Delete(L.root);
    free(L.entries);
    if (map != MAP_FAILED) munmap(map, (size_t)st.st_size);
    close(fd);
    return s;
}
