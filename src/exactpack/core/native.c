/* exactpack's kernels in C: the "native" engine of exactpack/core/engine.py.
 *
 * Each function here is the C twin of the @kernel of the same name in
 * core/engine.py, core/policies.py, core/stream_packer.py and core/compact.py:
 * the same loops, tie-breaks and integer widths (int64 state,
 * the callers' token dtypes), so both engines give identical results. Arrays
 * arrive through the buffer protocol (C-contiguous; the caller's contract, as
 * are the bounds); every kernel releases the GIL while it loops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int64_t i64;
typedef uint64_t u64;

#define IGNORE_INDEX (-100)
#define MAX_VIEWS 32

/* ------------------------------------------------------------ buffers */

typedef struct {
    Py_buffer views[MAX_VIEWS];
    int n;
} Views;

static void release(Views *v) {
    for (int i = 0; i < v->n; i++) PyBuffer_Release(&v->views[i]);
    v->n = 0;
}

/* Integer kinds by buffer format: 0 unsupported, else one of the T_* below. */
enum { T_NONE, T_I8, T_U8, T_I16, T_U16, T_I32, T_U32, T_I64, T_U64, T_BOOL };

static int kind_of(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (f[0] == '\0' || f[1] != '\0') return T_NONE;
    switch (f[0]) {
    case 'b': return T_I8;
    case 'B': return T_U8;
    case '?': return T_BOOL;
    case 'h': return T_I16;
    case 'H': return T_U16;
    case 'i': return T_I32;
    case 'I': return T_U32;
    case 'l': case 'q': return b->itemsize == 8 ? T_I64 : (b->itemsize == 4 ? T_I32 : T_NONE);
    case 'L': case 'Q': return b->itemsize == 8 ? T_U64 : (b->itemsize == 4 ? T_U32 : T_NONE);
    default: return T_NONE;
    }
}

/* A C-contiguous view of obj; kind T_NONE accepts any integer kind. */
static void *view(Views *v, PyObject *obj, int kind, int writable, Py_ssize_t *len, int *got) {
    if (v->n >= MAX_VIEWS) {
        PyErr_SetString(PyExc_RuntimeError, "too many arrays");
        return NULL;
    }
    Py_buffer *b = &v->views[v->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0) return NULL;
    v->n++;
    int k = kind_of(b);
    if (k == T_NONE || (kind != T_NONE && k != kind)) {
        PyErr_Format(PyExc_TypeError, "unsupported array format '%s' (itemsize %zd)",
                     b->format ? b->format : "?", b->itemsize);
        return NULL;
    }
    if (len) *len = b->len / b->itemsize;
    if (got) *got = k;
    return b->buf;
}

static i64 *ints(Views *v, PyObject *obj, Py_ssize_t *len) {
    return (i64 *)view(v, obj, T_I64, 1, len, NULL);
}

/* An int64 array the kernel only reads (it may be read-only). */
static i64 *inputs(Views *v, PyObject *obj, Py_ssize_t *len) {
    return (i64 *)view(v, obj, T_I64, 0, len, NULL);
}

/* The int64 arrays of tuple ``tup`` (exactly n of them) into ptrs; len of the first. */
static int int_tuple(Views *v, PyObject *tup, int n, i64 **ptrs, Py_ssize_t *len0) {
    if (!PyTuple_Check(tup) || PyTuple_GET_SIZE(tup) != n) {
        PyErr_Format(PyExc_TypeError, "expected a tuple of %d arrays", n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        ptrs[i] = ints(v, PyTuple_GET_ITEM(tup, i), i == 0 ? len0 : NULL);
        if (!ptrs[i]) return -1;
    }
    return 0;
}

static int as_i64(PyObject *obj, i64 *out) {
    long long x = PyLong_AsLongLong(obj);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = (i64)x;
    return 0;
}

#define NARGS(k)                                                                       \
    if (nargs != (k)) {                                                                \
        PyErr_Format(PyExc_TypeError, "expected %d arguments, got %zd", (k), nargs);   \
        return NULL;                                                                   \
    }

/* ------------------------------------------------------------ the search trees */

static void tree_set(i64 *tree, i64 leaves, i64 index, i64 value) {
    i64 node = leaves + index;
    tree[node] = value;
    node /= 2;
    while (node > 0) {
        i64 left = tree[2 * node];
        i64 right = tree[2 * node + 1];
        i64 best = left >= right ? left : right;
        if (tree[node] == best) break; /* unchanged here, so unchanged above */
        tree[node] = best;
        node /= 2;
    }
}

static i64 tree_first_at_least(const i64 *tree, i64 leaves, i64 n) {
    if (tree[1] < n) return -1;
    i64 node = 1;
    while (node < leaves) node = 2 * node + (tree[2 * node] < n);
    return node - leaves;
}

static i64 tree_last_at_most(const i64 *tree, i64 leaves, i64 r) {
    i64 node = leaves + r;
    if (tree[node] > 0) return r;
    while (node > 1) {
        if (node % 2 == 1 && tree[node - 1] > 0) {
            node -= 1;
            while (node < leaves) node = 2 * node + (tree[2 * node + 1] > 0);
            return node - leaves;
        }
        node /= 2;
    }
    return -1;
}

static void bucket_push(i64 *tree, i64 leaves, i64 *head, i64 *tail, i64 *nxt, i64 r, i64 item) {
    nxt[item] = -1;
    if (tail[r] == -1) {
        head[r] = item;
        tree_set(tree, leaves, r, r);
    } else {
        nxt[tail[r]] = item;
    }
    tail[r] = item;
}

static i64 bucket_pop(i64 *tree, i64 leaves, i64 *head, i64 *tail, i64 *nxt, i64 r) {
    i64 item = head[r];
    head[r] = nxt[item];
    if (head[r] == -1) {
        tail[r] = -1;
        tree_set(tree, leaves, r, 0);
    }
    return item;
}

/* ------------------------------------------------------------ policies */

static PyObject *next_fit_loop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4);
    Views v = {.n = 0};
    Py_ssize_t n;
    i64 capacity, rows = 0;
    i64 *lengths = inputs(&v, args[0], &n), *row_of = NULL, *start_of = NULL;
    if (!lengths || as_i64(args[1], &capacity) || !(row_of = ints(&v, args[2], NULL)) ||
        !(start_of = ints(&v, args[3], NULL))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    i64 row = 0, used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        i64 len = lengths[i];
        if (len > capacity - used) {
            row += 1;
            used = 0;
        }
        row_of[i] = row;
        start_of[i] = used;
        used += len;
    }
    rows = n > 0 ? row + 1 : 0;
    Py_END_ALLOW_THREADS
    release(&v);
    return PyLong_FromLongLong(rows);
}

static PyObject *counting_sort(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4);
    Views v = {.n = 0};
    Py_ssize_t n;
    i64 capacity;
    i64 *lengths = inputs(&v, args[0], NULL), *counts = NULL, *order = NULL;
    if (!lengths || as_i64(args[1], &capacity) || !(counts = ints(&v, args[2], NULL)) ||
        !(order = ints(&v, args[3], &n))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) counts[capacity - lengths[i] + 1] += 1;
    for (i64 k = 1; k < capacity + 2; k++) counts[k] += counts[k - 1];
    for (Py_ssize_t i = 0; i < n; i++) {
        i64 k = capacity - lengths[i];
        order[counts[k]] = i;
        counts[k] += 1;
    }
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

static PyObject *first_fit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(6);
    Views v = {.n = 0};
    Py_ssize_t n;
    i64 capacity, leaves, rows = 0;
    i64 *sizes = inputs(&v, args[0], &n), *tree = NULL, *row_of = NULL, *start_of = NULL;
    if (!sizes || as_i64(args[1], &capacity) || !(tree = ints(&v, args[2], NULL)) ||
        as_i64(args[3], &leaves) || !(row_of = ints(&v, args[4], NULL)) ||
        !(start_of = ints(&v, args[5], NULL))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        i64 len = sizes[j];
        i64 row = tree_first_at_least(tree, leaves, len);
        i64 left = tree[leaves + row];
        if (row == rows) rows += 1;
        row_of[j] = row;
        start_of[j] = capacity - left;
        tree_set(tree, leaves, row, left - len);
    }
    Py_END_ALLOW_THREADS
    release(&v);
    return PyLong_FromLongLong(rows);
}

static PyObject *best_fit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(9);
    Views v = {.n = 0};
    Py_ssize_t n;
    i64 capacity, leaves, rows = 0;
    i64 *sizes = inputs(&v, args[0], &n), *tree = NULL, *head = NULL, *tail = NULL, *nxt = NULL;
    i64 *row_of = NULL, *start_of = NULL;
    if (!sizes || as_i64(args[1], &capacity) || !(tree = ints(&v, args[2], NULL)) ||
        as_i64(args[3], &leaves) || !(head = ints(&v, args[4], NULL)) ||
        !(tail = ints(&v, args[5], NULL)) || !(nxt = ints(&v, args[6], NULL)) ||
        !(row_of = ints(&v, args[7], NULL)) || !(start_of = ints(&v, args[8], NULL))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        i64 len = sizes[j], row;
        i64 left = tree_first_at_least(tree, leaves, len);
        if (left >= 0) {
            row = bucket_pop(tree, leaves, head, tail, nxt, left);
        } else {
            row = rows;
            rows += 1;
            left = capacity;
        }
        row_of[j] = row;
        start_of[j] = capacity - left;
        if (left > len) bucket_push(tree, leaves, head, tail, nxt, left - len, row);
    }
    Py_END_ALLOW_THREADS
    release(&v);
    return PyLong_FromLongLong(rows);
}

/* ------------------------------------------------------------ the stream packer */

enum { S_PUSHED, S_ROWS, S_OPEN, S_FREE_ROW, S_FREE_REC, S_LIVE, S_STAMP, S_OUT };

typedef struct {
    i64 *bex, *blen, *bprev, *bnext, *lhead, *ltail, *ltree; /* buf */
    i64 *rrem, *rnext, *rhead, *rtail, *rstamp, *qhead, *qtail, *qtree; /* rows */
    i64 *pex, *pstart, *pnext; /* pool */
    i64 *oex, *orow, *ostart; /* out */
    i64 *sc;
    i64 window, lleaves, qleaves, capacity, max_open;
} Stream;

/* buf, lleaves, rows, qleaves, pool[, out], scalars, capacity[, max_open] from args. */
static int stream_of(Views *v, Stream *s, PyObject *const *a, int with_out, int with_max) {
    i64 *p[8];
    Py_ssize_t window;
    if (int_tuple(v, a[0], 7, p, &window)) return -1;
    s->bex = p[0], s->blen = p[1], s->bprev = p[2], s->bnext = p[3];
    s->lhead = p[4], s->ltail = p[5], s->ltree = p[6], s->window = window;
    if (as_i64(a[1], &s->lleaves) || int_tuple(v, a[2], 8, p, NULL)) return -1;
    s->rrem = p[0], s->rnext = p[1], s->rhead = p[2], s->rtail = p[3];
    s->rstamp = p[4], s->qhead = p[5], s->qtail = p[6], s->qtree = p[7];
    if (as_i64(a[3], &s->qleaves) || int_tuple(v, a[4], 3, p, NULL)) return -1;
    s->pex = p[0], s->pstart = p[1], s->pnext = p[2];
    int k = 5;
    if (with_out) {
        if (int_tuple(v, a[k++], 3, p, NULL)) return -1;
        s->oex = p[0], s->orow = p[1], s->ostart = p[2];
    }
    if (!(s->sc = ints(v, a[k++], NULL)) || as_i64(a[k++], &s->capacity)) return -1;
    if (with_max && as_i64(a[k], &s->max_open)) return -1;
    return 0;
}

static void buffer_insert(Stream *s, i64 slot, i64 ex, i64 n, i64 front) {
    s->bex[slot] = ex;
    s->blen[slot] = n;
    if (s->lhead[n] == -1) {
        s->bprev[slot] = -1;
        s->bnext[slot] = -1;
        s->lhead[n] = slot;
        s->ltail[n] = slot;
        tree_set(s->ltree, s->lleaves, n, n);
    } else if (front) {
        s->bprev[slot] = -1;
        s->bnext[slot] = s->lhead[n];
        s->bprev[s->lhead[n]] = slot;
        s->lhead[n] = slot;
    } else {
        s->bnext[slot] = -1;
        s->bprev[slot] = s->ltail[n];
        s->bnext[s->ltail[n]] = slot;
        s->ltail[n] = slot;
    }
}

static void buffer_remove(Stream *s, i64 slot) {
    i64 n = s->blen[slot], before = s->bprev[slot], after = s->bnext[slot];
    if (before == -1)
        s->lhead[n] = after;
    else
        s->bnext[before] = after;
    if (after == -1)
        s->ltail[n] = before;
    else
        s->bprev[after] = before;
    if (s->lhead[n] == -1) tree_set(s->ltree, s->lleaves, n, 0);
    s->bex[slot] = -1;
}

static void row_close(Stream *s, i64 slot) {
    i64 *sc = s->sc;
    i64 row = sc[S_ROWS];
    sc[S_ROWS] = row + 1;
    i64 k = sc[S_OUT], rec = s->rhead[slot];
    while (rec != -1) {
        s->oex[k] = s->pex[rec];
        s->orow[k] = row;
        s->ostart[k] = s->pstart[rec];
        k += 1;
        i64 following = s->pnext[rec];
        s->pnext[rec] = sc[S_FREE_REC];
        sc[S_FREE_REC] = rec;
        sc[S_LIVE] -= 1;
        rec = following;
    }
    sc[S_OUT] = k;
    s->rnext[slot] = sc[S_FREE_ROW];
    sc[S_FREE_ROW] = slot;
    sc[S_OPEN] -= 1;
}

static i64 row_open(Stream *s) {
    i64 row = s->sc[S_FREE_ROW];
    s->sc[S_FREE_ROW] = s->rnext[row];
    s->sc[S_OPEN] += 1;
    s->rhead[row] = -1;
    s->rtail[row] = -1;
    return row;
}

static void row_append(Stream *s, i64 slot, i64 ex, i64 start) {
    i64 rec = s->sc[S_FREE_REC];
    s->sc[S_FREE_REC] = s->pnext[rec];
    s->sc[S_LIVE] += 1;
    s->pex[rec] = ex;
    s->pstart[rec] = start;
    s->pnext[rec] = -1;
    if (s->rtail[slot] == -1)
        s->rhead[slot] = rec;
    else
        s->pnext[s->rtail[slot]] = rec;
    s->rtail[slot] = rec;
}

static i64 pop_row(Stream *s, i64 left) {
    return bucket_pop(s->qtree, s->qleaves, s->qhead, s->qtail, s->rnext, left);
}

static void place(Stream *s, i64 slot) {
    i64 ex = s->bex[slot], n = s->blen[slot], row, capacity = s->capacity;
    buffer_remove(s, slot);
    i64 left = tree_first_at_least(s->qtree, s->qleaves, n);
    if (left >= 0) {
        row = pop_row(s, left);
    } else {
        if (s->sc[S_OPEN] == s->max_open)
            row_close(s, pop_row(s, tree_first_at_least(s->qtree, s->qleaves, 1)));
        row = row_open(s);
        left = capacity;
    }
    row_append(s, row, ex, capacity - left);
    left -= n;
    while (left > 0) {
        i64 fit = tree_last_at_most(s->ltree, s->lleaves, left);
        if (fit <= 0) break;
        i64 filler = s->lhead[fit];
        row_append(s, row, s->bex[filler], capacity - left);
        buffer_remove(s, filler);
        left -= fit;
    }
    s->rrem[row] = left;
    if (left == 0) {
        row_close(s, row);
    } else {
        s->rstamp[row] = s->sc[S_STAMP];
        s->sc[S_STAMP] += 1;
        bucket_push(s->qtree, s->qleaves, s->qhead, s->qtail, s->rnext, left, row);
    }
}

static PyObject *stream_push(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(11);
    Views v = {.n = 0};
    Stream s;
    Py_ssize_t n;
    i64 *lengths = inputs(&v, args[0], &n), *fronts = NULL;
    if (!lengths || !(fronts = inputs(&v, args[1], NULL)) || stream_of(&v, &s, args + 2, 1, 1)) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    i64 i = s.sc[S_PUSHED], slot = i % s.window;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (s.bex[slot] >= 0) place(&s, slot); /* example i - window's time is up */
        buffer_insert(&s, slot, i, lengths[j], fronts[j]);
        i += 1;
        slot = slot + 1 < s.window ? slot + 1 : 0;
    }
    s.sc[S_PUSHED] = i;
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

static PyObject *stream_drain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(9);
    Views v = {.n = 0};
    Stream s;
    if (stream_of(&v, &s, args, 1, 1)) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    while (s.ltree[1] > 0) place(&s, s.lhead[s.ltree[1]]);
    while (s.sc[S_OPEN] > 0) row_close(&s, pop_row(&s, tree_first_at_least(s.qtree, s.qleaves, 1)));
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

static PyObject *stream_restore(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(13);
    Views v = {.n = 0};
    Stream s;
    Py_ssize_t n, nrows;
    i64 *ex = inputs(&v, args[0], &n), *lengths = NULL, *fronts = NULL;
    i64 *row_sizes = NULL, *row_examples = NULL, *row_lengths = NULL;
    if (!ex || !(lengths = inputs(&v, args[1], NULL)) || !(fronts = inputs(&v, args[2], NULL)) ||
        stream_of(&v, &s, args + 3, 0, 0) || !(row_sizes = inputs(&v, args[10], &nrows)) ||
        !(row_examples = inputs(&v, args[11], NULL)) ||
        !(row_lengths = inputs(&v, args[12], NULL))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) buffer_insert(&s, ex[j] % s.window, ex[j], lengths[j], fronts[j]);
    i64 k = 0;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        i64 row = row_open(&s), start = 0;
        for (i64 m = 0; m < row_sizes[r]; m++) {
            row_append(&s, row, row_examples[k], start);
            start += row_lengths[k];
            k += 1;
        }
        s.rrem[row] = s.capacity - start;
        s.rstamp[row] = s.sc[S_STAMP];
        s.sc[S_STAMP] += 1;
        bucket_push(s.qtree, s.qleaves, s.qhead, s.qtail, s.rnext, s.capacity - start, row);
    }
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ gathers, by dtype
 * FOR_KIND(k, T, body) runs body with T the C type of integer kind k. */

#define FOR_KIND(k, T, body)                                           \
    switch (k) {                                                       \
    case T_I8: { typedef int8_t T; body; } break;                      \
    case T_U8: { typedef uint8_t T; body; } break;                     \
    case T_BOOL: { typedef uint8_t T; body; } break;                   \
    case T_I16: { typedef int16_t T; body; } break;                    \
    case T_U16: { typedef uint16_t T; body; } break;                   \
    case T_I32: { typedef int32_t T; body; } break;                    \
    case T_U32: { typedef uint32_t T; body; } break;                   \
    case T_I64: { typedef int64_t T; body; } break;                    \
    case T_U64: { typedef uint64_t T; body; } break;                   \
    }

#define SCATTER(TS, TD)                                                              \
    for (Py_ssize_t i = 0; i < n; i++) {                                             \
        const TS *from = (const TS *)src + (u64)src_starts[i];                       \
        TD *to = (TD *)out + (u64)out_starts[i];                                     \
        u64 len = (u64)lens[i];                                                      \
        for (u64 j = 0; j < len; j++) to[j] = (TD)from[j];                           \
    }

static PyObject *scatter_loop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(5);
    Views v = {.n = 0};
    Py_ssize_t n;
    int ks, kd;
    void *src = view(&v, args[0], T_NONE, 0, NULL, &ks), *out = NULL;
    i64 *src_starts = NULL, *lens = NULL, *out_starts = NULL;
    if (!src || !(src_starts = inputs(&v, args[1], NULL)) || !(lens = inputs(&v, args[2], &n)) ||
        !(out = view(&v, args[3], T_NONE, 1, NULL, &kd)) ||
        !(out_starts = inputs(&v, args[4], NULL))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t size = v.views[0].itemsize;
    if (ks == kd || (ks == T_BOOL && kd == T_U8)) { /* same items: whole windows at once */
        for (Py_ssize_t i = 0; i < n; i++)
            memcpy((char *)out + (u64)out_starts[i] * size,
                   (const char *)src + (u64)src_starts[i] * size, (u64)lens[i] * size);
    } else if (kd == T_BOOL) {
        FOR_KIND(ks, TS, SCATTER(TS, _Bool));
    } else {
        FOR_KIND(kd, TD, FOR_KIND(ks, TS, SCATTER(TS, TD)));
    }
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

#define LABELS(T)                                                                    \
    {                                                                                \
        const T *tok = (const T *)tokens;                                            \
        u64 p = 0, q = 0;                                                            \
        for (Py_ssize_t i = 0; i < n; i++) {                                         \
            u64 len = (u64)lens[i];                                                  \
            out[p] = IGNORE_INDEX;                                                   \
            for (u64 j = 0; j < len; j++)                                            \
                out[p + 1 + j] = mask[q + j] ? (int32_t)(i64)tok[p + 1 + j] : IGNORE_INDEX; \
            p += len + 1;                                                            \
            q += len;                                                                \
        }                                                                            \
    }

static PyObject *labels_loop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4);
    Views v = {.n = 0};
    Py_ssize_t n;
    int kt;
    void *tokens = view(&v, args[0], T_NONE, 0, NULL, &kt);
    uint8_t *mask = NULL;
    i64 *lens = NULL;
    int32_t *out = NULL;
    if (!tokens || !(mask = view(&v, args[1], T_BOOL, 0, NULL, NULL)) ||
        !(lens = inputs(&v, args[2], &n)) || !(out = view(&v, args[3], T_I32, 1, NULL, NULL))) {
        release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    FOR_KIND(kt, T, LABELS(T));
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

/* Min/max loops, cloned for AVX2 where the compiler can (picked at load time by the CPU:
 * 64-bit compares vectorise only from SSE4.2 on, beyond the x86-64 baseline). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define CLONED __attribute__((target_clones("avx2", "default")))
#else
#define CLONED
#endif

#define RANGE(T, W)                                                                  \
    CLONED static void range_##T(const T *x, Py_ssize_t n, W *out) {                 \
        T lo = x[0], hi = x[0];                                                      \
        for (Py_ssize_t i = 0; i < n; i++) { /* branch-free, so it vectorises */     \
            lo = x[i] < lo ? x[i] : lo;                                              \
            hi = x[i] > hi ? x[i] : hi;                                              \
        }                                                                            \
        out[0] = (W)lo;                                                              \
        out[1] = (W)hi;                                                              \
    }

RANGE(int8_t, i64)
RANGE(int16_t, i64)
RANGE(int32_t, i64)
RANGE(int64_t, i64)
RANGE(uint8_t, u64)
RANGE(uint16_t, u64)
RANGE(uint32_t, u64)
RANGE(uint64_t, u64)

static PyObject *range_loop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2);
    Views v = {.n = 0};
    Py_ssize_t n, m;
    int kv, ko;
    void *values = view(&v, args[0], T_NONE, 0, &n, &kv), *out = NULL;
    if (!values || !(out = view(&v, args[1], T_NONE, 1, &m, &ko))) {
        release(&v);
        return NULL;
    }
    int sign = kv == T_I8 || kv == T_I16 || kv == T_I32 || kv == T_I64;
    if (n == 0 || m < 2 || kv == T_BOOL || ko != (sign ? T_I64 : T_U64)) {
        release(&v);
        PyErr_SetString(PyExc_TypeError, "range_loop: a non-empty integer array, out int64[2]"
                                         " (uint64 for unsigned values)");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    switch (kv) {
    case T_I8: range_int8_t(values, n, out); break;
    case T_I16: range_int16_t(values, n, out); break;
    case T_I32: range_int32_t(values, n, out); break;
    case T_I64: range_int64_t(values, n, out); break;
    case T_U8: range_uint8_t(values, n, out); break;
    case T_U16: range_uint16_t(values, n, out); break;
    case T_U32: range_uint32_t(values, n, out); break;
    case T_U64: range_uint64_t(values, n, out); break;
    }
    Py_END_ALLOW_THREADS
    release(&v);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ the module */

#define KERNEL(name) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, NULL}

static PyMethodDef methods[] = {
    KERNEL(next_fit_loop), KERNEL(counting_sort), KERNEL(first_fit),   KERNEL(best_fit),
    KERNEL(stream_push),   KERNEL(stream_drain),  KERNEL(stream_restore), KERNEL(scatter_loop),
    KERNEL(labels_loop),   KERNEL(range_loop),    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native", "exactpack's kernels in C (see exactpack.core.engine).", -1,
    methods,
};

PyMODINIT_FUNC PyInit_native(void) { return PyModule_Create(&module); }
