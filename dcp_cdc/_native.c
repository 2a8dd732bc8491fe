/* The columnar decoder's compiled pass (issue 17): frames, hot-message fields, Snappy and
 * XATTRs in one pass over a buffer of DCP frames, and one copy of every key and value.
 *
 * It holds no protocol table of its own: dcp_cdc.columnar calls configure() once with the
 * header layout, the hot messages' extras layouts (dcp_cdc.layouts) and the protocol
 * constants (dcp_cdc.protocol), so every layout is still declared once, in Python.
 *
 * It decides nothing the numpy face would decide otherwise: a frame it is not sure of (not a
 * hot message, a stream-id section it does not know, a bad Snappy block or XATTR section) is
 * left "not fast" and goes through the per-frame path, which names what is wrong. The numpy
 * face is the oracle: tests check both give the same table, row for row and byte for byte.
 *
 * Memory safety: every read is checked against the buffer it reads; the caller's arrays are
 * checked for length before anything is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <limits.h>
#include <malloc.h>
#endif

/* --- configuration (configure()) ------------------------------------------------------- */

enum { H_MAGIC, H_OPCODE, H_KEY_LEN, H_EXT_LEN, H_DATATYPE, H_VB_OR_STATUS, H_BODY_LEN,
       H_OPAQUE, H_CAS, H_FIELDS };

/* Output columns with a fixed slot; layout fields come after them (their slot is in the
 * rule). The order is columnar._NATIVE_FIXED. */
enum { C_OFFSET, C_FRAME_LEN, C_MAGIC, C_OPCODE, C_VBUCKET, C_STATUS, C_OPAQUE, C_CAS,
       C_DATATYPE, C_STREAM_ID, C_COLLECTION_ID, C_IS_JSON, C_FIXED };

#define MAX_RULES 16
#define MAX_RULE_FIELDS 8
#define MAX_COLUMNS 64
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define PREFETCH 8
#define WALK_AHEAD 1024

typedef struct { int offset, size, column; } FieldSpec;
typedef struct {
    int opcode, ext_len, has_key, nmeta_at, op_index, nfields;
    FieldSpec fields[MAX_RULE_FIELDS];
} Rule;

static struct {
    int configured;
    int header_len;
    FieldSpec header[H_FIELDS]; /* offset and size; column unused */
    uint8_t known_magic[256], alt_magic[256], response_magic[256], doc_opcode[256];
    int server_request, stream_id_tag, stream_id_frame_len;
    int64_t max_body_len;
    int snappy_bit, xattr_bit, json_bit, unknown_datatype_bits;
    int64_t max_uncompressed, max_ratio, max_ratio_slack;
    int varint_max_bytes;
    int64_t varint_max_value;
    int varint_continuation;
    int max_xattr_pairs;
    int nrules;
    Rule rules[MAX_RULES];
} K;

/* The big-endian unsigned field of size bytes at p (docs/protocol/dcp.md §1.1: every field is big-endian). */
ALWAYS_INLINE uint64_t be(const uint8_t *p, int size) {
    switch (size) {
    case 1: return p[0];
    case 2: { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
    case 4: { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
    case 8: { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
    default: {
        uint64_t v = 0;
        for (int i = 0; i < size; i++) v = (v << 8) | p[i];
        return v;
    }
    }
}

/* The header's field sizes (docs/protocol/dcp.md §1.1), which configure() checks against the layout it is
 * given: with the size a constant, each header read is one load. */
static const int HSIZE[H_FIELDS] = {1, 1, 2, 1, 1, 2, 4, 4, 8};

ALWAYS_INLINE uint64_t hfield(const uint8_t *frame, int f) {
    return be(frame + K.header[f].offset, HSIZE[f]);
}

static int table256(PyObject *obj, uint8_t *out, const char *name) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return -1;
    if (view.len != 256) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "configure: %s must be 256 bytes", name);
        return -1;
    }
    memcpy(out, view.buf, 256);
    PyBuffer_Release(&view);
    return 0;
}

/* Reads ints from a buffer of int32 (native order) written by struct.pack("=...i"). */
static int int32s(PyObject *obj, int32_t **out, Py_ssize_t *count, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    if (view->len % 4) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "configure: tables are int32 arrays");
        return -1;
    }
    *out = (int32_t *)view->buf;
    *count = view->len / 4;
    return 0;
}

PyDoc_STRVAR(configure_doc,
"configure(**tables): the protocol facts the compiled pass works from (see\n"
"dcp_cdc.columnar._configure_native).");

static PyObject *configure(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kw) {
    static char *names[] = {
        "header_len", "header", "known_magic", "alt_magic", "response_magic", "doc_opcode",
        "server_request", "stream_id_tag", "stream_id_frame_len", "max_body_len",
        "snappy_bit", "xattr_bit", "json_bit", "unknown_datatype_bits", "max_uncompressed",
        "max_ratio", "max_ratio_slack", "varint_max_bytes", "varint_max_value",
        "varint_continuation", "max_xattr_pairs", "rules", NULL};
    PyObject *header, *known, *alt, *response, *doc, *rules;
    long long max_body, max_unc, max_ratio, slack, vmax;
    int header_len, server_request, tag, sid_len, snappy, xattr, json, unknown, vbytes, cont;
    int pairs;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "$iOOOOOiiiLiiiiLLLiLiiO", names, &header_len, &header, &known, &alt,
            &response, &doc, &server_request, &tag, &sid_len, &max_body, &snappy, &xattr,
            &json, &unknown, &max_unc, &max_ratio, &slack, &vbytes, &vmax, &cont, &pairs,
            &rules))
        return NULL;
    K.configured = 0;
    if (table256(known, K.known_magic, "known_magic") < 0 ||
        table256(alt, K.alt_magic, "alt_magic") < 0 ||
        table256(response, K.response_magic, "response_magic") < 0 ||
        table256(doc, K.doc_opcode, "doc_opcode") < 0)
        return NULL;
    Py_buffer view;
    int32_t *v;
    Py_ssize_t count;
    if (int32s(header, &v, &count, &view) < 0) return NULL;
    if (count != 2 * H_FIELDS) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "configure: header holds 9 (offset, size) pairs");
        return NULL;
    }
    for (int f = 0; f < H_FIELDS; f++) {
        K.header[f].offset = v[2 * f];
        K.header[f].size = v[2 * f + 1];
        if (K.header[f].size != HSIZE[f] || K.header[f].offset + K.header[f].size > header_len) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "configure: a header field lies outside it");
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    /* rules: per rule opcode, ext_len, has_key, nmeta_at, op_index, nfields, then nfields
     * (offset, size, column) triples. */
    if (int32s(rules, &v, &count, &view) < 0) return NULL;
    Py_ssize_t at = 0;
    int n = 0;
    while (at < count) {
        if (n == MAX_RULES || at + 6 > count) goto bad_rules;
        Rule *r = &K.rules[n++];
        r->opcode = v[at]; r->ext_len = v[at + 1]; r->has_key = v[at + 2];
        r->nmeta_at = v[at + 3]; r->op_index = v[at + 4]; r->nfields = v[at + 5];
        at += 6;
        if (r->nfields < 0 || r->nfields > MAX_RULE_FIELDS || at + 3 * r->nfields > count)
            goto bad_rules;
        if (r->nmeta_at >= 0 && r->nmeta_at + 2 > r->ext_len) goto bad_rules;
        for (int j = 0; j < r->nfields; j++, at += 3) {
            FieldSpec *f = &r->fields[j];
            f->offset = v[at]; f->size = v[at + 1]; f->column = v[at + 2];
            if (f->size < 1 || f->size > 8 || f->offset < 0 || f->offset + f->size > r->ext_len ||
                f->column < C_FIXED || f->column >= MAX_COLUMNS)
                goto bad_rules;
        }
    }
    PyBuffer_Release(&view);
    K.nrules = n;
    K.header_len = header_len;
    K.server_request = server_request;
    K.stream_id_tag = tag;
    K.stream_id_frame_len = sid_len;
    K.max_body_len = max_body;
    K.snappy_bit = snappy; K.xattr_bit = xattr; K.json_bit = json;
    K.unknown_datatype_bits = unknown;
    K.max_uncompressed = max_unc; K.max_ratio = max_ratio; K.max_ratio_slack = slack;
    K.varint_max_bytes = vbytes; K.varint_max_value = vmax; K.varint_continuation = cont;
    K.max_xattr_pairs = pairs;
    K.configured = 1;
    Py_RETURN_NONE;
bad_rules:
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "configure: malformed rules table");
    return NULL;
}

static int need_config(void) {
    if (!K.configured) {
        PyErr_SetString(PyExc_RuntimeError, "dcp_cdc._native: configure() first");
        return -1;
    }
    return 0;
}

/* A writable buffer of size bytes from alloc(size): the caller's allocator (pyarrow's pool,
 * which keeps its pages: a fresh 64 MiB from the system costs more in page faults than the
 * whole decode of it). */
static PyObject *allocate(PyObject *alloc, int64_t size, Py_buffer *view) {
    PyObject *obj = PyObject_CallFunction(alloc, "L", (long long)size);
    if (!obj) return NULL;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    if (view->len < size) {
        PyBuffer_Release(view);
        Py_DECREF(obj);
        PyErr_SetString(PyExc_ValueError, "alloc returned a buffer smaller than asked");
        return NULL;
    }
    return obj;
}

/* --- framing (docs/protocol/dcp.md §1) ------------------------------------------------------------------ */

PyDoc_STRVAR(walk_doc,
"walk(buf, pos, stop) -> (starts, end, halted)\n\n"
"columnar._walk compiled: the starts (int64, native order, as bytes) of the frames from pos\n"
"that start before stop; where the walk ended; whether it halted there (unknown magic,\n"
"impossible length, or a frame that does not fit in buf).");

static PyObject *walk(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, stop;
    if (need_config() < 0) return NULL;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &pos, &stop)) return NULL;
    const uint8_t *b = view.buf;
    const int64_t n = view.len, hl = K.header_len;
    if (pos < 0) pos = 0;
    if (stop > n) stop = n;
    if (stop <= pos) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(y#nO)", "", (Py_ssize_t)0, pos, Py_False);
    }
    Py_ssize_t cap = (stop - pos) / hl + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, cap * 8);
    if (!out) { PyBuffer_Release(&view); return NULL; }
    int64_t *starts = (int64_t *)PyBytes_AS_STRING(out);
    Py_ssize_t count = 0;
    int halted = 0;
    Py_BEGIN_ALLOW_THREADS
    while (pos < stop) {
        if (pos + hl > n) { halted = 1; break; }
        int64_t body = (int64_t)hfield(b + pos, H_BODY_LEN);
        int64_t end = pos + hl + body;
        if (!K.known_magic[b[pos]] || body > K.max_body_len || end > n) { halted = 1; break; }
        starts[count++] = pos;
        __builtin_prefetch(b + end + WALK_AHEAD); /* frames lie one after another */
        pos = end;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, count * 8) < 0) return NULL;
    return Py_BuildValue("(NnO)", out, pos, halted ? Py_True : Py_False);
}

/* --- Snappy raw blocks (docs/protocol/dcp.md §2) --------------------------------------------------------- */

/* The block's declared length, as varint.read_uleb128 reads it; -1 if it reads no varint. */
static int64_t uleb128(const uint8_t *p, int64_t len, int *size) {
    uint64_t value = 0;
    for (int i = 0; i < K.varint_max_bytes; i++) {
        if (i >= len) return -1;
        value |= (uint64_t)(p[i] & 0x7F) << (7 * i);
        if (p[i] < K.varint_continuation) {
            *size = i + 1;
            return value > (uint64_t)K.varint_max_value ? -1 : (int64_t)value;
        }
    }
    return -1;
}

/* snappy.plausible: a block of len bytes can decompress to declared bytes. */
static inline int plausible(int64_t declared, int64_t len) {
    return declared <= K.max_uncompressed && declared <= K.max_ratio * len + K.max_ratio_slack;
}

#define ROUND16(n) (((n) + 15) & ~(int64_t)15)
#define ROUND8(n) (((n) + 7) & ~(int64_t)7)

/* n bytes from src to dst in fixed moves of k bytes (one or two instructions each, where a
 * memcpy of a variable size costs a call or a slow string move): up to k - 1 bytes past n
 * are written too, so the caller has checked there is room for them. */
ALWAYS_INLINE void copy_by(int k, uint8_t *dst, const uint8_t *src, int64_t n) {
    if (k == 16) {
        for (int64_t j = 0; j < n; j += 16) memcpy(dst + j, src + j, 16);
    } else {
        for (int64_t j = 0; j < n; j += 8) memcpy(dst + j, src + j, 8);
    }
}

/* The elements of a raw block (after its preamble) into out[0:size]; the bytes written, or
 * -1 when the elements are not a valid block (a copy before the start or with offset 0, an
 * element past the input or past size, input left over), as the reference decoder judges. */
static int64_t unsnappy(const uint8_t *in, int64_t len, uint8_t *out, int64_t size) {
    int64_t s = 0, d = 0;
    while (s < len) {
        uint8_t tag = in[s++];
        int64_t n, offset;
        switch (tag & 3) {
        case 0:
            n = tag >> 2;
            if (n >= 60) {
                int extra = (int)n - 59;
                if (s + extra > len) return -1;
                n = (int64_t)in[s];
                for (int i = 1; i < extra; i++) n |= (int64_t)in[s + i] << (8 * i);
                s += extra;
            }
            n += 1;
            if (n > len - s || n > size - d) return -1;
            if (ROUND16(n) <= len - s && ROUND16(n) <= size - d) {
                copy_by(16, out + d, in + s, n);
            } else {
                memcpy(out + d, in + s, (size_t)n);
            }
            s += n;
            d += n;
            continue;
        case 1:
            if (s + 1 > len) return -1;
            n = ((tag >> 2) & 7) + 4;
            offset = ((int64_t)(tag >> 5) << 8) | in[s];
            s += 1;
            break;
        case 2:
            if (s + 2 > len) return -1;
            n = (tag >> 2) + 1;
            offset = (int64_t)in[s] | (int64_t)in[s + 1] << 8;
            s += 2;
            break;
        default:
            if (s + 4 > len) return -1;
            n = (tag >> 2) + 1;
            offset = (int64_t)in[s] | (int64_t)in[s + 1] << 8 | (int64_t)in[s + 2] << 16 |
                     (int64_t)in[s + 3] << 24;
            s += 4;
            break;
        }
        if (offset == 0 || offset > d || n > size - d) return -1;
        uint8_t *to = out + d;
        const uint8_t *from = to - offset;
        /* A move of k bytes reads only what is already written when offset >= k. */
        if (offset >= 16 && ROUND16(n) <= size - d) {
            copy_by(16, to, from, n);
        } else if (offset >= 8 && ROUND8(n) <= size - d) {
            copy_by(8, to, from, n);
        } else if (offset >= n) {
            memcpy(to, from, (size_t)n);
        } else { /* overlapping: the run repeats */
            for (int64_t i = 0; i < n; i++) to[i] = from[i];
        }
        d += n;
    }
    return d;
}

/* --- XATTR sections (docs/protocol/dcp.md §2) ------------------------------------------------------------ */

/* Strict UTF-8, as Python's bytes.decode("utf-8") and Arrow's string validation judge it. */
static int utf8(const uint8_t *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c < 0xC2 || c > 0xF4) return 0;
        int more = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        if (i + more >= n) return 0;
        for (int j = 1; j <= more; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        uint8_t c1 = s[i + 1];
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) ||
            (c == 0xF4 && c1 >= 0x90))
            return 0;
        i += more + 1;
    }
    return 1;
}

typedef struct { int64_t *data; Py_ssize_t len, cap; } Entries; /* 5 int64 per entry */

static int entries_push(Entries *e, int64_t row, int64_t ks, int64_t kl, int64_t vs,
                        int64_t vl) {
    if (e->len + 5 > e->cap) {
        Py_ssize_t cap = e->cap ? 2 * e->cap : 5 * 4096;
        int64_t *data = realloc(e->data, (size_t)cap * 8);
        if (!data) return -1;
        e->data = data;
        e->cap = cap;
    }
    int64_t *p = e->data + e->len;
    p[0] = row; p[1] = ks; p[2] = kl; p[3] = vs; p[4] = vl;
    e->len += 5;
    return 0;
}

/* xattrs.split_xattrs over src[*start:][:*len]: 1 and the entries pushed (offsets into src),
 * start and len moved to the body; 0 (nothing pushed) when the section is not exactly what it
 * accepts; -1 out of memory. */
static int split_xattrs(const uint8_t *src, int64_t row, int64_t *start, int64_t *len,
                        Entries *e) {
    int64_t s = *start, l = *len;
    if (l < 4) return 0;
    int64_t end = s + 4 + (int64_t)be(src + s, 4);
    if (end > s + l) return 0;
    Py_ssize_t first = e->len;
    int64_t pos = s + 4;
    int pairs = 0;
    while (pos < end) {
        if (pairs == K.max_xattr_pairs || pos + 4 > end) goto bad;
        int64_t size = (int64_t)be(src + pos, 4);
        int64_t pair = pos + 4;
        if (size < 2 || pair + size > end) goto bad;
        const uint8_t *p = src + pair;
        const uint8_t *nul = memchr(p, 0, (size_t)size);
        int64_t sep = nul ? nul - p : -1;
        if (sep < 1 || sep >= size - 1 || p[size - 1] != 0) goto bad;
        if (memchr(p + sep + 1, 0, (size_t)(size - sep - 2))) goto bad;
        if (!utf8(p, sep) || !utf8(p + sep + 1, size - sep - 2)) goto bad;
        for (Py_ssize_t k = first; k < e->len; k += 5) /* a key twice: the per-frame path */
            if (e->data[k + 2] == sep && !memcmp(src + e->data[k + 1], p, (size_t)sep)) goto bad;
        if (entries_push(e, row, pair, sep, pair + sep + 1, size - sep - 2) < 0) return -1;
        pos = pair + size;
        pairs++;
    }
    *start = end;
    *len = s + l - end;
    return 1;
bad:
    e->len = first;
    return 0;
}

/* --- the hot messages -------------------------------------------------------------------- */

typedef struct {
    Py_buffer view;
    char *data;
    Py_ssize_t itemsize;
} Column;

typedef struct {
    /* per frame */
    const Rule *rule;  /* NULL: not a hot message (or not simple enough): per-frame path */
    int64_t ext_start, doc_key_start, value_start, value_len;
    int collection_id;
    int transform; /* the value is Snappy and/or XATTR */
} Frame;

ALWAYS_INLINE void put(Column *c, Column *valid, Py_ssize_t i, int64_t value) {
    switch (c->itemsize) {
    case 1: ((int8_t *)c->data)[i] = (int8_t)value; break;
    case 2: ((int16_t *)c->data)[i] = (int16_t)value; break;
    case 4: ((int32_t *)c->data)[i] = (int32_t)value; break;
    default: ((int64_t *)c->data)[i] = value; break;
    }
    if (valid->data) valid->data[i] = 1;
}

/* The item sizes of the fixed slots (columnar.COLUMNS' types), checked against the arrays
 * decode() is given: a store to a fixed slot is then one typed store. */
static const int FIXED_SIZE[C_FIXED] = {8, 4, 2, 2, 4, 4, 8, 8, 2, 4, 8, 1};

ALWAYS_INLINE void put_fixed(Column *c, Column *valid, int slot, Py_ssize_t i, int64_t value) {
    switch (FIXED_SIZE[slot]) {
    case 1: ((int8_t *)c[slot].data)[i] = (int8_t)value; break;
    case 2: ((int16_t *)c[slot].data)[i] = (int16_t)value; break;
    case 4: ((int32_t *)c[slot].data)[i] = (int32_t)value; break;
    default: ((int64_t *)c[slot].data)[i] = value; break;
    }
    if (valid[slot].data) valid[slot].data[i] = 1;
}

/* What the numpy face decides for frame i before its value: the header columns always, and
 * whether it is a hot message it decodes for all rows at once. */
ALWAYS_INLINE void classify(const uint8_t *b, int64_t p, int collections, Frame *f,
                            int *stream_id) {
    const uint8_t *h = b + p;
    int magic = h[K.header[H_MAGIC].offset];
    int opcode = (int)hfield(h, H_OPCODE);
    int64_t keylen16 = (int64_t)hfield(h, H_KEY_LEN);
    int64_t ext_len = (int64_t)hfield(h, H_EXT_LEN);
    int datatype = (int)hfield(h, H_DATATYPE);
    int64_t body = (int64_t)hfield(h, H_BODY_LEN);
    int alt = K.alt_magic[magic];
    int64_t fe_len = alt ? keylen16 >> 8 : 0;
    int64_t key_len = alt ? keylen16 & 0xFF : keylen16;
    int64_t frame_end = p + K.header_len + body;
    f->rule = NULL;
    f->transform = 0;
    *stream_id = -1;
    f->ext_start = p + K.header_len + fe_len;
    int64_t key_start = f->ext_start + ext_len;
    f->value_start = key_start + key_len;
    f->value_len = frame_end - f->value_start;
    if (f->value_len < 0) return; /* impossible lengths: the per-frame path says so */
    if (alt) {
        const uint8_t *fe = h + K.header_len;
        if (fe_len != K.stream_id_frame_len || fe[0] != K.stream_id_tag) return;
        *stream_id = (int)be(fe + 1, K.stream_id_frame_len - 1);
    }
    if (K.response_magic[magic] || magic == K.server_request) return;
    const Rule *rule = NULL;
    for (int r = 0; r < K.nrules; r++)
        if (K.rules[r].opcode == opcode && K.rules[r].ext_len == ext_len) {
            rule = &K.rules[r];
            break;
        }
    if (!rule) return;
    if (rule->has_key) {
        if ((datatype & K.unknown_datatype_bits) || key_len == 0) return;
    } else if (key_len != 0 || f->value_len != 0) {
        return;
    }
    if (rule->nmeta_at >= 0 && be(b + f->ext_start + rule->nmeta_at, 2) != 0) return;
    f->doc_key_start = key_start;
    f->collection_id = -1;
    if (rule->has_key && collections) {
        uint8_t first = b[key_start];
        if (first >= K.varint_continuation) return; /* a longer LEB128: per-frame path */
        f->collection_id = first;
        f->doc_key_start = key_start + 1;
    }
    f->rule = rule;
    f->transform = f->value_len > 0 && (datatype & (K.snappy_bit | K.xattr_bit)) &&
                   K.doc_opcode[opcode];
}

/* Output arrays, by name, as columnar._hot_native passes them. */
typedef struct {
    Column cols[MAX_COLUMNS], valid[MAX_COLUMNS];
    int ncols;
    Column op, fast, xattr, key_start, key_len, value_src, value_start, value_len;
} Out;

static int get_column(PyObject *obj, Column *c, Py_ssize_t n, const char *what) {
    c->data = NULL;
    if (obj == Py_None) return 0;
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_WRITABLE) < 0) return -1;
    if (n == 0 || c->view.len % n) {
        c->itemsize = n ? 0 : 1;
    } else {
        c->itemsize = c->view.len / n;
    }
    if (n && c->itemsize != 1 && c->itemsize != 2 && c->itemsize != 4 && c->itemsize != 8) {
        PyBuffer_Release(&c->view);
        PyErr_Format(PyExc_ValueError, "decode: %s does not hold one 1/2/4/8-byte item per frame",
                     what);
        return -1;
    }
    c->data = c->view.buf;
    return 0;
}

static void release(Column *c) {
    if (c->data) PyBuffer_Release(&c->view);
    c->data = NULL;
}

/* A hot frame's fields, op, key and value range: it is decoded (fast). */
ALWAYS_INLINE void commit(Out *out, const uint8_t *b, Py_ssize_t i, const Frame *f, int datatype,
                          int64_t vsrc, int64_t vstart, int64_t vlen, int has_xattrs) {
    const Rule *r = f->rule;
    Column *c = out->cols, *v = out->valid;
    for (int j = 0; j < r->nfields; j++) {
        const FieldSpec *fs = &r->fields[j];
        put(&c[fs->column], &v[fs->column], i, (int64_t)be(b + f->ext_start + fs->offset, fs->size));
    }
    ((int8_t *)out->op.data)[i] = (int8_t)r->op_index;
    out->fast.data[i] = 1;
    if (r->has_key) {
        if (f->collection_id >= 0)
            put_fixed(c, v, C_COLLECTION_ID, i, f->collection_id);
        put_fixed(c, v, C_IS_JSON, i, (datatype & K.json_bit) != 0);
        ((int64_t *)out->key_start.data)[i] = f->doc_key_start;
        ((int64_t *)out->key_len.data)[i] = f->value_start - f->doc_key_start;
        ((int64_t *)out->value_src.data)[i] = vsrc;
        ((int64_t *)out->value_start.data)[i] = vstart;
        ((int64_t *)out->value_len.data)[i] = vlen;
    }
    if (has_xattrs) out->xattr.data[i] = 1;
}

PyDoc_STRVAR(decode_doc,
"decode(buf, starts, base_offset, collections, columns, valid, op, fast, xattr, key_start,\n"
"       key_len, value_src, value_start, value_len, xattr_offsets, alloc)\n"
"    -> (expanded, entries)\n\n"
"The hot path of columnar.decode_frames for the whole frames at starts (int64). Writes the\n"
"header columns of every frame, and for the hot messages it decodes (fast[i] = 1) their\n"
"fields, op index, key and value ranges. A value range is in buf (value_src 0) or in\n"
"expanded (1), the Snappy values decompressed; entries holds (row, key start, key length,\n"
"value start, value length) int64 quintuples of XATTR pairs, in the row's value source, in\n"
"row order; xattr_offsets (int32, n + 1) gets where each row's pairs start among them.\n"
"expanded comes from alloc(size).");

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer bufv, startsv;
    long long base_offset;
    int collections;
    PyObject *columns, *valids, *o_op, *o_fast, *o_xattr, *o_ks, *o_kl, *o_vsrc, *o_vs, *o_vl;
    PyObject *alloc;
    Py_buffer xoffv;
    if (need_config() < 0) return NULL;
    if (!PyArg_ParseTuple(args, "y*y*LpO!O!OOOOOOOOw*O", &bufv, &startsv, &base_offset,
                          &collections, &PyTuple_Type, &columns, &PyTuple_Type, &valids, &o_op,
                          &o_fast, &o_xattr, &o_ks, &o_kl, &o_vsrc, &o_vs, &o_vl, &xoffv,
                          &alloc))
        return NULL;
    PyObject *result = NULL, *expanded = NULL, *entries_bytes = NULL;
    Py_buffer xv = {0};
    int64_t *pending = NULL; /* (row, where its Snappy value expands) of pass 2's frames */
    Entries entries = {0};
    Out out;
    memset(&out, 0, sizeof(out));
    const uint8_t *b = bufv.buf;
    const int64_t blen = bufv.len;
    const int64_t *starts = startsv.buf;
    const Py_ssize_t n = startsv.len / 8;
    if (xoffv.len != (n + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "decode: xattr_offsets must hold n + 1 int32");
        goto done;
    }
    out.ncols = (int)PyTuple_GET_SIZE(columns);
    if (out.ncols > MAX_COLUMNS || PyTuple_GET_SIZE(valids) != out.ncols ||
        out.ncols < C_FIXED) {
        PyErr_SetString(PyExc_ValueError, "decode: columns and valid differ or are too many");
        goto done;
    }
    for (int c = 0; c < out.ncols; c++)
        if (get_column(PyTuple_GET_ITEM(columns, c), &out.cols[c], n, "a column") < 0 ||
            get_column(PyTuple_GET_ITEM(valids, c), &out.valid[c], n, "a validity") < 0)
            goto done;
    for (int r = 0; r < K.nrules; r++)
        for (int j = 0; j < K.rules[r].nfields; j++)
            if (K.rules[r].fields[j].column >= out.ncols || !out.cols[K.rules[r].fields[j].column].data) {
                PyErr_SetString(PyExc_ValueError, "decode: a rule's column was not given");
                goto done;
            }
    for (int c = 0; c < C_FIXED; c++)
        if (!out.cols[c].data || (n && out.cols[c].itemsize != FIXED_SIZE[c])) {
            PyErr_SetString(PyExc_ValueError, "decode: a fixed column is missing or mistyped");
            goto done;
        }
    if (get_column(o_op, &out.op, n, "op") < 0 || get_column(o_fast, &out.fast, n, "fast") < 0 ||
        get_column(o_xattr, &out.xattr, n, "xattr") < 0 ||
        get_column(o_ks, &out.key_start, n, "key_start") < 0 ||
        get_column(o_kl, &out.key_len, n, "key_len") < 0 ||
        get_column(o_vsrc, &out.value_src, n, "value_src") < 0 ||
        get_column(o_vs, &out.value_start, n, "value_start") < 0 ||
        get_column(o_vl, &out.value_len, n, "value_len") < 0)
        goto done;
    if (n && (out.op.itemsize != 1 || out.fast.itemsize != 1 || out.xattr.itemsize != 1 ||
              out.key_start.itemsize != 8 || out.key_len.itemsize != 8 ||
              out.value_src.itemsize != 8 || out.value_start.itemsize != 8 ||
              out.value_len.itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "decode: per-frame outputs have the wrong item size");
        goto done;
    }
    pending = malloc((size_t)(n ? n : 1) * 16);
    if (!pending) { PyErr_NoMemory(); goto done; }

    /* Pass 1: header columns of every frame; the hot ones whose value is used as it is;
     * the others' value transforms planned (where each Snappy value will expand). */
    int64_t total = 0;
    Frame f = {0};
    int sid;
    Py_ssize_t npending = 0, bad_row = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = starts[i];
        /* headers are far apart: ask for the one PREFETCH frames on before it is needed */
        if (i + PREFETCH < n) { /* its header, extras and key: two cache lines */
            __builtin_prefetch(b + starts[i + PREFETCH]);
            __builtin_prefetch(b + starts[i + PREFETCH] + 64);
        }
        bad_row = i;
        if (p < 0 || p + K.header_len > blen) goto not_a_frame; /* starts come from framing */
        const uint8_t *h = b + p;
        int64_t body = (int64_t)hfield(h, H_BODY_LEN);
        if (p + K.header_len + body > blen) goto not_a_frame;
        int magic = h[K.header[H_MAGIC].offset];
        Column *c = out.cols, *v = out.valid;
        put_fixed(c, v, C_OFFSET, i, p + base_offset);
        put_fixed(c, v, C_FRAME_LEN, i, K.header_len + body);
        put_fixed(c, v, C_MAGIC, i, magic);
        put_fixed(c, v, C_OPCODE, i, (int64_t)hfield(h, H_OPCODE));
        put_fixed(c, v, C_OPAQUE, i, (int64_t)hfield(h, H_OPAQUE));
        put_fixed(c, v, C_CAS, i, (int64_t)hfield(h, H_CAS));
        put_fixed(c, v, C_DATATYPE, i, (int64_t)hfield(h, H_DATATYPE));
        int slot = K.response_magic[magic] ? C_STATUS : C_VBUCKET;
        put_fixed(c, v, slot, i, (int64_t)hfield(h, H_VB_OR_STATUS));
        classify(b, p, collections, &f, &sid);
        if (sid >= 0) put_fixed(c, v, C_STREAM_ID, i, sid);
        if (!f.rule) continue;
        if (!f.transform) {
            commit(&out, b, i, &f, (int)hfield(h, H_DATATYPE), 0, f.value_start, f.value_len, 0);
            continue;
        }
        int64_t to = -1; /* where its Snappy value expands; -1: not Snappy */
        if (hfield(h, H_DATATYPE) & K.snappy_bit) {
            int size;
            int64_t declared = uleb128(b + f.value_start, f.value_len, &size);
            if (declared < 0 || !plausible(declared, f.value_len)) continue;
            to = total;
            total += declared;
        }
        pending[2 * npending] = i;
        pending[2 * npending + 1] = to;
        npending++;
    }
    expanded = allocate(alloc, total, &xv);
    if (!expanded) goto done;
    uint8_t *x = xv.buf;

    /* Pass 2: the planned values (Snappy, then XATTRs, the order of docs/protocol/dcp.md §2). */
    for (Py_ssize_t k = 0; k < npending; k++) {
        Py_ssize_t i = pending[2 * k];
        int64_t to = pending[2 * k + 1];
        int64_t p = starts[i];
        if (k + PREFETCH < npending) { /* long gone from the cache: the frame, ahead */
            const uint8_t *ahead = b + starts[pending[2 * (k + PREFETCH)]];
            for (int line = 0; line < 4; line++) __builtin_prefetch(ahead + 64 * line);
        }
        classify(b, p, collections, &f, &sid);
        int datatype = (int)hfield(b + p, H_DATATYPE);
        const uint8_t *src = b;
        int64_t vsrc = 0, vstart = f.value_start, vlen = f.value_len;
        if (to >= 0) {
            int size;
            int64_t declared = uleb128(b + vstart, vlen, &size);
            int64_t written = unsnappy(b + vstart + size, vlen - size, x + to, declared);
            if (written != declared) continue;
            src = x;
            vsrc = 1;
            vstart = to;
            vlen = declared;
        }
        int has_xattrs = (datatype & K.xattr_bit) != 0;
        if (has_xattrs) {
            int ok = split_xattrs(src, i, &vstart, &vlen, &entries);
            if (ok < 0) { PyErr_NoMemory(); goto done; }
            if (!ok) continue;
        }
        commit(&out, b, i, &f, datatype, vsrc, vstart, vlen, has_xattrs);
    }
    /* Where each row's XATTR pairs start among the entries (pass 2 went in row order). */
    int32_t *xoff = xoffv.buf;
    Py_ssize_t e = 0, nentries = entries.len / 5;
    for (Py_ssize_t i = 0; i < n; i++) {
        xoff[i] = (int32_t)e;
        while (e < nentries && entries.data[5 * e] == i) e++;
    }
    xoff[n] = (int32_t)e;
    entries_bytes = PyBytes_FromStringAndSize((const char *)entries.data, entries.len * 8);
    if (!entries_bytes) goto done;
    result = PyTuple_Pack(2, expanded, entries_bytes);
    goto done;
not_a_frame:
    PyErr_Format(PyExc_ValueError, "decode: no whole frame at starts[%zd] (%lld)", bad_row,
                 (long long)starts[bad_row]);
done:
    if (expanded) PyBuffer_Release(&xv);
    Py_XDECREF(expanded);
    Py_XDECREF(entries_bytes);
    free(pending);
    free(entries.data);
    for (int c = 0; c < MAX_COLUMNS; c++) {
        release(&out.cols[c]);
        release(&out.valid[c]);
    }
    release(&out.op); release(&out.fast); release(&out.xattr);
    release(&out.key_start); release(&out.key_len);
    release(&out.value_src); release(&out.value_start); release(&out.value_len);
    PyBuffer_Release(&bufv);
    PyBuffer_Release(&startsv);
    PyBuffer_Release(&xoffv);
    return result;
}

/* --- one copy of many byte ranges -------------------------------------------------------- */

PyDoc_STRVAR(gather_doc,
"gather(sources, src, start, length, offsets, alloc) -> data\n\n"
"Row i's bytes are sources[src[i]][start[i]:][:length[i]] (none where src[i] < 0); they are\n"
"copied side by side into data (from alloc(size)), and offsets (int32, n + 1) gets where\n"
"each row starts: an Arrow binary or string column's two buffers.");

static PyObject *gather(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sources, *alloc;
    Py_buffer srcv, startv, lenv, offv, datav;
    if (!PyArg_ParseTuple(args, "O!y*y*y*w*O", &PyTuple_Type, &sources, &srcv, &startv, &lenv,
                          &offv, &alloc))
        return NULL;
    PyObject *data = NULL;
    Py_ssize_t ns = PyTuple_GET_SIZE(sources), got = 0;
    Py_buffer *views = calloc((size_t)(ns ? ns : 1), sizeof(Py_buffer));
    const Py_ssize_t n = srcv.len / 8;
    const int64_t *src = srcv.buf, *start = startv.buf, *len = lenv.buf;
    int32_t *offsets = offv.buf;
    if (!views) { PyErr_NoMemory(); goto done; }
    for (; got < ns; got++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(sources, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
    if (startv.len != srcv.len || lenv.len != srcv.len || offv.len != (n + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "gather: src, start, length and offsets differ in length");
        goto done;
    }
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        offsets[i] = (int32_t)total;
        if (src[i] < 0) continue;
        if (src[i] >= ns || start[i] < 0 || len[i] < 0 || start[i] + len[i] > views[src[i]].len) {
            PyErr_Format(PyExc_ValueError, "gather: row %zd's range lies outside its source", i);
            goto done;
        }
        total += len[i];
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError,
                            "gather: a column of more than 2 GiB does not fit int32 offsets");
            goto done;
        }
    }
    offsets[n] = (int32_t)total;
    data = allocate(alloc, total, &datav);
    if (!data) goto done;
    char *d = datav.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH < n && src[i + PREFETCH] >= 0) { /* up to 4 lines of a row ahead */
            const char *ahead = (const char *)views[src[i + PREFETCH]].buf + start[i + PREFETCH];
            for (int64_t line = 0; line < len[i + PREFETCH] && line < 4 * 64; line += 64)
                __builtin_prefetch(ahead + line);
        }
        if (src[i] >= 0 && len[i])
            memcpy(d + offsets[i], (const char *)views[src[i]].buf + start[i], (size_t)len[i]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&datav);
done:
    for (Py_ssize_t s = 0; s < got; s++) PyBuffer_Release(&views[s]);
    free(views);
    PyBuffer_Release(&srcv);
    PyBuffer_Release(&startv);
    PyBuffer_Release(&lenv);
    PyBuffer_Release(&offv);
    if (PyErr_Occurred()) { Py_XDECREF(data); return NULL; }
    return data;
}

PyDoc_STRVAR(keep_freed_memory_doc,
"keep_freed_memory() -> bool\n\n"
"Tell glibc's allocator to keep freed memory for reuse (no mmap for large blocks, no trim\n"
"of the heap) instead of handing it back to the system, for the whole process. False where\n"
"the C library is not glibc (nothing is changed).");

static PyObject *keep_freed_memory(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
#ifdef __GLIBC__
    if (mallopt(M_MMAP_MAX, 0) && mallopt(M_TRIM_THRESHOLD, INT_MAX)) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"keep_freed_memory", keep_freed_memory, METH_NOARGS, keep_freed_memory_doc},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     configure_doc},
    {"walk", walk, METH_VARARGS, walk_doc},
    {"decode", decode, METH_VARARGS, decode_doc},
    {"gather", gather, METH_VARARGS, gather_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dcp_cdc._native",
    "The columnar decoder's compiled pass (see dcp_cdc/_native.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
