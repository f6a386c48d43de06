# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The event log's Arrow table straight from the router's msgpack (compiled; no I/O).

`build_table` of the same rows, for the rows the router logs almost always, built without a
Python object per row or per value: the msgpack of each chunk (``[[id, type, values,
meta], ...]``, `aa.router.caches.meshcache.encode_events`) is read byte by byte and each
column written into Arrow's buffers as it goes — the values' text, their type names, the
meta's JSON. `table_from_chunks` returns None for anything it does not write exactly as
`aa.router.eventlog.table.build_table` would (a bytes value, a datetime among the values, a
non-finite float in JSON, a key that starts with ``$``, a ``time`` that is no msgpack
Timestamp, a non-str key, invalid UTF-8, bytes that are not one whole array of rows): the
writer then takes the reference path, `unpack` and `build_table`, for those rows, with
its errors as they were. `tests/test_eventlog_columns.py` holds the two tables equal.

Its msgpack primitives (`Buf`, `need`, `be`, the lengths of strs, arrays and maps) are those
of `mesh/_msgpack_read.pxi`, shared with the client's and the router's frame readers; bytes
that end early or are no msgpack raise its `_Other`, refused like `_Refused`. Its own: the
item kinds (a str's bytes in place, no Python object), the JSON, int and float writers.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport floor, isinf, isnan
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

import pyarrow as pa

include "../../mesh/_msgpack_read.pxi"

cdef extern from "Python.h":
    char* PyOS_double_to_string(
        double val, char format_code, int precision, int flags, int* ptype
    ) except NULL
    int Py_DTSF_ADD_DOT_0

__all__ = ["table_from_chunks"]

#: Deepest list or map in a value or the meta the fast path writes; deeper ones go the
#: reference way.
DEF MAX_DEPTH = 32
#: Keys of a map compared one by one for a repeat; a larger map's go in a set.
DEF FEW_KEYS = 16
#: Bytes a string column may hold (Arrow's string offsets are int32).
DEF MAX_COLUMN_BYTES = 2147483647

# The range of datetime (years 1 to 9999) in seconds since the epoch: a Timestamp outside it
# is refused by the reference decoder.
DEF MIN_SECONDS = -62135596800
DEF MAX_SECONDS = 253402300799

cdef enum Kind:
    K_NIL
    K_FALSE
    K_TRUE
    K_UINT
    K_INT
    K_FLOAT
    K_STR
    K_BIN
    K_ARRAY
    K_MAP
    K_EXT


cdef struct Item:
    int kind
    uint64_t u  # an unsigned int; a str's, bin's or ext's length; an array's or map's count
    int64_t i  # a negative int
    double f
    const char* s  # a str's, bin's or ext's bytes
    int ext  # an ext's type


class _Refused(Exception):
    """Rows the fast path does not write: the reference path does."""


cdef class _Buf:
    """A growing byte buffer."""

    cdef char* p
    cdef Py_ssize_t n, cap

    def __cinit__(self):
        self.cap = 4096
        self.n = 0
        self.p = <char*>PyMem_Malloc(self.cap)
        if self.p == NULL:
            raise MemoryError()

    def __dealloc__(self):
        PyMem_Free(self.p)

    cdef int reserve(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t cap = self.cap
        cdef char* p
        if self.n + more <= cap:
            return 0
        while cap < self.n + more:
            cap *= 2
        p = <char*>PyMem_Realloc(self.p, cap)
        if p == NULL:
            raise MemoryError()
        self.p, self.cap = p, cap
        return 0

    cdef inline int put(self, const char* s, Py_ssize_t k) except -1:
        if self.n + k > self.cap:
            self.reserve(k)
        memcpy(self.p + self.n, s, k)
        self.n += k
        return 0

    cdef inline int byte(self, char c) except -1:
        if self.n + 1 > self.cap:
            self.reserve(1)
        self.p[self.n] = c
        self.n += 1
        return 0

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.p, self.n, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    cdef object buffer(self):
        """The bytes written, as an Arrow buffer over this one's memory (no copy): nothing
        is written here after."""
        return pa.py_buffer(self)


cdef class _Col:
    """A string column being written: its bytes, int32 offsets and validity bits."""

    cdef _Buf data, offsets, bits
    cdef Py_ssize_t length, nulls

    def __cinit__(self):
        cdef int32_t zero = 0
        self.data = _Buf()
        self.offsets = _Buf()
        self.bits = _Buf()
        self.length = self.nulls = 0
        self.offsets.put(<char*>&zero, 4)

    cdef int end(self, bint valid) except -1:
        """Close the value written into `data` since the last `end`."""
        cdef int32_t off
        if self.data.n > MAX_COLUMN_BYTES:
            raise _Refused()
        off = <int32_t>self.data.n
        self.offsets.put(<char*>&off, 4)
        if self.length % 8 == 0:
            self.bits.byte(0)
        if valid:
            self.bits.p[self.length // 8] |= <char>(1 << (self.length % 8))
        else:
            self.nulls += 1
        self.length += 1
        return 0

    cdef inline int add(self, const char* s, Py_ssize_t k) except -1:
        self.data.put(s, k)
        return self.end(True)

    cdef inline int add_null(self) except -1:
        return self.end(False)

    cdef object array(self):
        validity = self.bits.buffer() if self.nulls else None
        return pa.Array.from_buffers(
            pa.string(),
            self.length,
            [validity, self.offsets.buffer(), self.data.buffer()],
            null_count=self.nulls,
        )


cdef inline const unsigned char* take(Buf* b, Py_ssize_t k) except NULL:
    """The next *k* bytes of *b*, skipped over (`need`: `_Other` when fewer are left)."""
    need(b, k)
    b.pos += k
    return b.p + b.pos - k


cdef int next_item(Buf* b, Item* it) except -1:
    """The next msgpack item of *b* into *it*: a scalar whole, a str's, bin's or ext's bytes
    in place (no copy), an array's or map's count (its contents are the items that follow)."""
    cdef unsigned char c = take(b, 1)[0]
    cdef Py_ssize_t n
    if c <= 0x7F:
        it.kind, it.u = K_UINT, c
        return 0
    if c >= 0xE0:
        it.kind, it.i = K_INT, <int8_t>c
        return 0
    n = str_len(b, c)
    if n >= 0:
        it.kind, it.u = K_STR, <uint64_t>n
        it.s = <const char*>take(b, n)
        return 0
    if c <= 0x8F:  # fixmap
        it.kind, it.u = K_MAP, c & 0x0F
    elif c <= 0x9F:  # fixarray
        it.kind, it.u = K_ARRAY, c & 0x0F
    elif c == 0xC0:
        it.kind = K_NIL
    elif c == 0xC2:
        it.kind = K_FALSE
    elif c == 0xC3:
        it.kind = K_TRUE
    elif c == 0xCA:
        it.kind, it.f = K_FLOAT, <double>_f32(take(b, 4))
    elif c == 0xCB:
        it.kind, it.f = K_FLOAT, _f64(take(b, 8))
    # A branch for each form of int, so that each `be` has a constant count (unrolled).
    elif c == 0xCC:
        it.kind, it.u = K_UINT, take(b, 1)[0]
    elif c == 0xCD:
        it.kind, it.u = K_UINT, be(take(b, 2), 2)
    elif c == 0xCE:
        it.kind, it.u = K_UINT, be(take(b, 4), 4)
    elif c == 0xCF:
        it.kind, it.u = K_UINT, be(take(b, 8), 8)
    elif c == 0xD0:
        it.kind, it.i = K_INT, <int8_t>take(b, 1)[0]
    elif c == 0xD1:
        it.kind, it.i = K_INT, <int16_t>be(take(b, 2), 2)
    elif c == 0xD2:
        it.kind, it.i = K_INT, <int32_t>be(take(b, 4), 4)
    elif c == 0xD3:
        it.kind, it.i = K_INT, <int64_t>be(take(b, 8), 8)
    elif 0xC4 <= c <= 0xC6:  # bin 8, 16, 32
        n = 1 << (c - 0xC4)
        it.kind, it.u = K_BIN, be(take(b, n), <int>n)
        it.s = <const char*>take(b, <Py_ssize_t>it.u)
    elif c == 0xDC or c == 0xDD:  # array 16, 32: `array_len` reads them from their first byte
        b.pos -= 1
        it.kind, it.u = K_ARRAY, <uint64_t>array_len(b)
    elif c == 0xDE or c == 0xDF:  # map 16, 32
        b.pos -= 1
        it.kind, it.u = K_MAP, <uint64_t>map_len(b)
    elif 0xD4 <= c <= 0xD8:  # fixext 1, 2, 4, 8, 16
        it.kind, it.u = K_EXT, 1 << (c - 0xD4)
        it.ext = <int8_t>take(b, 1)[0]
        it.s = <const char*>take(b, <Py_ssize_t>it.u)
    elif 0xC7 <= c <= 0xC9:  # ext 8, 16, 32
        n = 1 << (c - 0xC7)
        it.kind, it.u = K_EXT, be(take(b, n), <int>n)
        it.ext = <int8_t>take(b, 1)[0]
        it.s = <const char*>take(b, <Py_ssize_t>it.u)
    else:  # 0xC1, never used
        raise _Refused()
    return 0


cdef int skip(Buf* b, Item* it, int depth) except -1:
    """Skip the contents of the array or map *it* opened (nothing for other items), at
    nesting *depth*: deeper than `MAX_DEPTH` is refused (each level is a C call)."""
    cdef Item sub
    cdef uint64_t k, count
    if it.kind == K_ARRAY or it.kind == K_MAP:
        if depth >= MAX_DEPTH:
            raise _Refused()
        count = it.u * (2 if it.kind == K_MAP else 1)
        for k in range(count):
            next_item(b, &sub)
            skip(b, &sub, depth + 1)
    return 0


cdef struct Keys:
    const char* s[FEW_KEYS]
    uint64_t u[FEW_KEYS]
    int n


cdef object _once(Keys* ks, object seen, Item* key):
    """Refuse the str *key* when the map being read had it already (msgpack may hold a key
    twice; the reference's dict keeps the last value, and a map column or a JSON object with
    a key twice reads differently elsewhere): its first `FEW_KEYS` keys are compared one by
    one, the rest looked up in *seen*, a set made once there are more. Returns *seen*."""
    cdef int j
    cdef bytes b
    if seen is None:
        for j in range(ks.n):
            if ks.u[j] == key.u and memcmp(ks.s[j], key.s, key.u) == 0:
                raise _Refused()
        if ks.n < FEW_KEYS:
            ks.s[ks.n] = key.s
            ks.u[ks.n] = key.u
            ks.n += 1
            return None
        seen = {PyBytes_FromStringAndSize(ks.s[j], ks.u[j]) for j in range(ks.n)}
    b = PyBytes_FromStringAndSize(key.s, key.u)
    if b in seen:
        raise _Refused()
    seen.add(b)
    return seen


cdef inline float _f32(const unsigned char* q) noexcept:
    cdef uint32_t bits = <uint32_t>be(q, 4)
    cdef float f
    memcpy(&f, &bits, 4)
    return f


cdef inline double _f64(const unsigned char* q) noexcept:
    cdef uint64_t bits = be(q, 8)
    cdef double f
    memcpy(&f, &bits, 8)
    return f


cdef int _decimal(_Buf out, Item* it) except -1:
    """An int's decimal digits, as ``str(int)`` writes them."""
    cdef char tmp[24]
    cdef int k = 24
    cdef uint64_t v
    cdef bint negative = it.kind == K_INT and it.i < 0
    if negative:
        v = <uint64_t>(-(it.i + 1)) + 1  # no overflow at INT64_MIN
    elif it.kind == K_INT:
        v = <uint64_t>it.i
    else:
        v = it.u
    while True:
        k -= 1
        tmp[k] = <char>(48 + v % 10)
        v //= 10
        if v == 0:
            break
    if negative:
        k -= 1
        tmp[k] = b'-'
    return out.put(&tmp[k], 24 - k)


cdef extern from *:
    ctypedef unsigned long long u128 "unsigned __int128"


cdef u128 _POW10[22]
_POW10[0] = 1
for _k in range(1, 22):
    _POW10[_k] = _POW10[_k - 1] * 10


cdef inline int _nearest(uint64_t mant, int t, int d, u128* m, u128* diff) noexcept:
    """*m*: mant * 2**-t * 10**d rounded to the nearest integer, and *diff*: how far it is
    from that exactly, in units of 2**-t (0 when t is 0). 0 when it is half way."""
    cdef u128 x = <u128>mant * _POW10[d]
    cdef u128 q = x >> t
    cdef u128 r = x - (q << t)
    cdef u128 half = ((<u128>1) << t) >> 1
    if t > 0 and r == half:
        return 0
    if t > 0 and r > half:
        q += 1
        diff[0] = (q << t) - x
    else:
        diff[0] = r
    m[0] = q
    return 1


cdef int _short_float(_Buf out, double f) except -1:
    """Write *f* as ``repr(float)`` does and return 1, by exact integer arithmetic, for the
    usual reading (normal, not a power of two, from 2**-14 to 2**53, written without an
    exponent); return 0, having written nothing, for any other float, which `_float` gives
    to Python's own conversion.

    repr writes the fewest digits that read back as *f*, and of those the nearest to it.
    With *f* = mant * 2**-t exactly (mant of 53 bits), the numbers that read back as *f*
    are those within half a unit (2**-t / 2) of it, the ends included when mant is even
    (reading rounds half to even). A decimal of at most 15 significant digits that reads
    back as *f* is the only one (any two such decimals read back as different doubles), so
    it is *f* rounded to 15 digits, trailing zeros dropped; failing that, *f* rounded to 16
    digits if that reads back, else to 17, which always does. Exact in 128 bits:
    mant * 10**d < 2**53 * 10**21."""
    cdef uint64_t bits, mant
    cdef int exponent, t, d, k, length, point, tries
    cdef u128 m = 0, diff = 0
    cdef char digits[24]
    cdef char tmp[24]
    memcpy(&bits, &f, 8)
    exponent = <int>((bits >> 52) & 0x7FF)
    mant = bits & 0xFFFFFFFFFFFFF
    if exponent == 0 or exponent == 0x7FF or mant == 0:  # zero, subnormal, inf, nan, 2**k
        return 0
    mant |= (<uint64_t>1) << 52
    t = 1075 - exponent  # f = mant * 2**-t
    if t < 0 or t > 66:  # beyond 2**53, or below 2**-14: Python's conversion
        return 0
    # d: fractional digits that give 15 significant ones, from the binary exponent's
    # estimate of the decimal one (off by one at most), then corrected on m itself.
    d = 14 - <int>floor((exponent - 1023) * 0.30102999566398114)
    for tries in range(3):
        if d < 0 or d > 19 or not _nearest(mant, t, d, &m, &diff):
            return 0
        if m >= _POW10[15]:
            d -= 1
        elif m < _POW10[14]:
            d += 1
        else:
            break
    else:
        return 0
    for tries in range(3):  # 15, 16, 17 digits: within half a unit, i.e. 2 * diff <= 10**d
        if 2 * diff < _POW10[d] or (2 * diff == _POW10[d] and mant % 2 == 0):
            break
        d += 1
        if d > 21 or not _nearest(mant, t, d, &m, &diff):
            return 0
    else:
        return 0
    while d > 0 and m % 10 == 0:
        m //= 10
        d -= 1
    length = 0
    while True:
        tmp[length] = <char>(48 + <int>(m % 10))
        m //= 10
        length += 1
        if m == 0:
            break
    for k in range(length):
        digits[k] = tmp[length - 1 - k]
    point = length - d  # digits before the decimal point; <= 0: zeros after it
    if point <= -4 or point > 16:  # repr writes an exponent there
        return 0
    if bits >> 63:
        out.byte(b'-')
    if point > 0:
        out.put(digits, point)
        out.byte(b'.')
        if point < length:
            out.put(digits + point, length - point)
        else:
            out.byte(b'0')
    else:
        out.put(b"0.", 2)
        for k in range(-point):
            out.byte(b'0')
        out.put(digits, length)
    return 1


cdef int _float(_Buf out, double f) except -1:
    """A finite float as ``repr(float)`` writes it (shortest round-trip text)."""
    cdef char* digits
    if _short_float(out, f):
        return 0
    digits = PyOS_double_to_string(f, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
    cdef Py_ssize_t k = 0
    while digits[k] != 0:
        k += 1
    try:
        out.put(digits, k)
    finally:
        PyMem_Free(digits)
    return 0


cdef const char* _HEX = b"0123456789abcdef"


cdef int _json_str(_Buf out, const char* s, Py_ssize_t k) except -1:
    """A string as the C JSON encoder writes it with ``ensure_ascii=False``."""
    cdef Py_ssize_t i, start = 0
    cdef unsigned char c
    out.byte(b'"')
    for i in range(k):
        c = <unsigned char>s[i]
        if c >= 0x20 and c != 0x22 and c != 0x5C:
            continue
        out.put(s + start, i - start)
        start = i + 1
        out.byte(b'\\')
        if c == 0x22:
            out.byte(b'"')
        elif c == 0x5C:
            out.byte(b'\\')
        elif c == 0x0A:
            out.byte(b'n')
        elif c == 0x0D:
            out.byte(b'r')
        elif c == 0x09:
            out.byte(b't')
        elif c == 0x08:
            out.byte(b'b')
        elif c == 0x0C:
            out.byte(b'f')
        else:
            out.put(b"u00", 3)
            out.byte(_HEX[c >> 4])
            out.byte(_HEX[c & 0x0F])
    out.put(s + start, k - start)
    out.byte(b'"')
    return 0


cdef int _json_key(_Buf out, Item* key) except -1:
    """A map key: a str not starting with ``$`` (which typed JSON escapes)."""
    if key.kind != K_STR or (key.u > 0 and key.s[0] == b'$'):
        raise _Refused()
    _json_str(out, key.s, key.u)
    return out.byte(b':')


cdef int _json(Buf* r, _Buf out, Item* it, int depth) except -1:
    """The JSON text of the item *it* (and its contents), as `codec.encode_json` writes it
    when nothing needs a tag."""
    cdef Item sub
    cdef uint64_t k
    cdef Keys ks
    seen = None
    if it.kind == K_STR:
        return _json_str(out, it.s, it.u)
    if it.kind == K_UINT or it.kind == K_INT:
        return _decimal(out, it)
    if it.kind == K_FLOAT:
        if isnan(it.f) or isinf(it.f):
            raise _Refused()
        return _float(out, it.f)
    if it.kind == K_NIL:
        return out.put(b"null", 4)
    if it.kind == K_TRUE:
        return out.put(b"true", 4)
    if it.kind == K_FALSE:
        return out.put(b"false", 5)
    if depth >= MAX_DEPTH:
        raise _Refused()
    if it.kind == K_ARRAY:
        out.byte(b'[')
        for k in range(it.u):
            if k:
                out.byte(b',')
            next_item(r, &sub)
            _json(r, out, &sub, depth + 1)
        return out.byte(b']')
    if it.kind == K_MAP:
        ks.n = 0
        out.byte(b'{')
        for k in range(it.u):
            if k:
                out.byte(b',')
            next_item(r, &sub)
            _json_key(out, &sub)
            seen = _once(&ks, seen, &sub)
            next_item(r, &sub)
            _json(r, out, &sub, depth + 1)
        return out.byte(b'}')
    raise _Refused()  # bytes, an extension (a datetime): tagged in typed JSON


cdef class _Table:
    """The columns of one table being written."""

    cdef _Col ids, types, routers, clients, logged_by, keys, texts, names, metas
    cdef _Buf times, map_offsets
    cdef int64_t pairs
    cdef bytes by

    def __cinit__(self, bytes by):
        cdef int32_t zero = 0
        self.ids, self.types, self.routers, self.clients = _Col(), _Col(), _Col(), _Col()
        self.logged_by, self.keys, self.texts, self.names = _Col(), _Col(), _Col(), _Col()
        self.metas = _Col()
        self.times, self.map_offsets = _Buf(), _Buf()
        self.pairs = 0
        self.by = by
        self.map_offsets.put(<char*>&zero, 4)

    cdef int row(self, Buf* r, double logged, bytes hop_ttl, bytes hop_path) except -1:
        cdef Item it
        if array_len(r) != 4:
            raise _Refused()
        next_item(r, &it)  # id: an absent one is written empty
        if it.kind == K_STR:
            self.ids.add(it.s, it.u)
        elif it.kind == K_NIL:
            self.ids.add(b"", 0)
        else:
            raise _Refused()
        next_item(r, &it)  # type
        if it.kind == K_STR:
            self.types.add(it.s, it.u)
        elif it.kind == K_NIL:
            self.types.add_null()
        else:
            raise _Refused()
        self.values(r)
        self.meta(r, logged, hop_ttl, hop_path)
        self.logged_by.add(PyBytes_AS_STRING(self.by), PyBytes_GET_SIZE(self.by))
        return 0

    cdef int values(self, Buf* r) except -1:
        cdef Item it
        cdef Py_ssize_t k, count
        cdef int32_t end
        cdef Keys ks
        ks.n = 0
        seen = None
        count = map_len(r)
        for k in range(count):
            next_item(r, &it)
            if it.kind != K_STR:
                raise _Refused()
            seen = _once(&ks, seen, &it)
            self.keys.add(it.s, it.u)
            next_item(r, &it)
            if it.kind == K_STR:
                self.texts.add(it.s, it.u)
                self.names.add(b"str", 3)
            elif it.kind == K_UINT or it.kind == K_INT:
                _decimal(self.texts.data, &it)
                self.texts.end(True)
                self.names.add(b"int", 3)
            elif it.kind == K_FLOAT:
                if isnan(it.f):
                    self.texts.add(b"NaN", 3)
                elif isinf(it.f):
                    if it.f > 0:
                        self.texts.add(b"Infinity", 8)
                    else:
                        self.texts.add(b"-Infinity", 9)
                else:
                    _float(self.texts.data, it.f)
                    self.texts.end(True)
                self.names.add(b"float", 5)
            elif it.kind == K_NIL:
                self.texts.add_null()
                self.names.add(b"null", 4)
            elif it.kind == K_TRUE:
                self.texts.add(b"true", 4)
                self.names.add(b"bool", 4)
            elif it.kind == K_FALSE:
                self.texts.add(b"false", 5)
                self.names.add(b"bool", 4)
            elif it.kind == K_ARRAY:
                _json(r, self.texts.data, &it, 1)
                self.texts.end(True)
                self.names.add(b"list", 4)
            elif it.kind == K_MAP:
                _json(r, self.texts.data, &it, 1)
                self.texts.end(True)
                self.names.add(b"map", 3)
            else:
                raise _Refused()
            self.pairs += 1
        if self.pairs > 2147483647:
            raise _Refused()
        end = <int32_t>self.pairs
        self.map_offsets.put(<char*>&end, 4)
        return 0

    cdef int meta(self, Buf* r, double logged, bytes hop_ttl, bytes hop_path) except -1:
        """The meta's JSON, router, client and time; with a hop (*hop_ttl* and *hop_path*,
        their JSON text, or None), its ttl and path in place of the meta's, or after the
        meta's keys when it has none, as `aa.mesh.protocol.FloodGroup.decode` sets them."""
        cdef Item it, key
        cdef Py_ssize_t k, count
        cdef bint first = True, timed = False, routed = False, clienty = False
        cdef bint hopped = hop_ttl is not None, ttl_set = False, path_set = False
        cdef int64_t micros = 0, seconds
        cdef uint64_t word
        cdef uint32_t nanos
        cdef _Buf out = self.metas.data
        cdef Keys ks
        ks.n = 0
        seen = None
        count = map_len(r)
        out.byte(b'{')
        for k in range(count):
            next_item(r, &key)
            if key.kind != K_STR:
                raise _Refused()
            seen = _once(&ks, seen, &key)
            if key.u == 4 and memcmp(key.s, b"time", 4) == 0:  # its own column, not in the JSON
                next_item(r, &it)
                if it.kind != K_EXT or it.ext != -1 or timed:
                    raise _Refused()
                if it.u == 4:
                    seconds, nanos = <int64_t>be(<const unsigned char*>it.s, 4), 0
                elif it.u == 8:
                    word = be(<const unsigned char*>it.s, 8)
                    seconds, nanos = <int64_t>(word & 0x3FFFFFFFF), <uint32_t>(word >> 34)
                elif it.u == 12:
                    nanos = <uint32_t>be(<const unsigned char*>it.s, 4)
                    seconds = <int64_t>be(<const unsigned char*>it.s + 4, 8)
                else:
                    raise _Refused()
                if nanos >= 1000000000 or not MIN_SECONDS <= seconds <= MAX_SECONDS:
                    raise _Refused()
                micros = seconds * 1000000 + nanos // 1000
                timed = True
                continue
            if not first:
                out.byte(b',')
            first = False
            _json_key(out, &key)
            next_item(r, &it)
            if hopped and key.u == 3 and memcmp(key.s, b"ttl", 3) == 0:
                if ttl_set:
                    raise _Refused()
                skip(r, &it, 1)
                out.put(PyBytes_AS_STRING(hop_ttl), PyBytes_GET_SIZE(hop_ttl))
                ttl_set = True
                continue
            if hopped and key.u == 4 and memcmp(key.s, b"path", 4) == 0:
                if path_set:
                    raise _Refused()
                skip(r, &it, 1)
                out.put(PyBytes_AS_STRING(hop_path), PyBytes_GET_SIZE(hop_path))
                path_set = True
                continue
            if key.u == 6 and it.kind == K_STR and memcmp(key.s, b"router", 6) == 0:
                if routed:
                    raise _Refused()
                self.routers.add(it.s, it.u)
                routed = True
            elif key.u == 6 and it.kind == K_STR and memcmp(key.s, b"client", 6) == 0:
                if clienty:
                    raise _Refused()
                self.clients.add(it.s, it.u)
                clienty = True
            _json(r, out, &it, 1)
        if hopped and not ttl_set:
            if not first:
                out.byte(b',')
            first = False
            out.put(b'"ttl":', 6)
            out.put(PyBytes_AS_STRING(hop_ttl), PyBytes_GET_SIZE(hop_ttl))
        if hopped and not path_set:
            if not first:
                out.byte(b',')
            out.put(b'"path":', 7)
            out.put(PyBytes_AS_STRING(hop_path), PyBytes_GET_SIZE(hop_path))
        out.byte(b'}')
        self.metas.end(True)
        if not routed:
            self.routers.add_null()
        if not clienty:
            self.clients.add_null()
        if not timed:
            micros = <int64_t>(logged * 1000000.0)  # as int() truncates it
        self.times.put(<char*>&micros, 8)
        return 0

    cdef object table(self, object schema):
        n = self.ids.length
        offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, self.map_offsets.buffer()])
        keys = self.keys.array()
        map_type = schema.field("values").type
        table = pa.Table.from_arrays(
            [
                self.ids.array(),
                self.types.array(),
                pa.Array.from_buffers(schema.field("time").type, n, [None, self.times.buffer()]),
                self.routers.array(),
                self.clients.array(),
                self.logged_by.array(),
                pa.MapArray.from_arrays(offsets, keys, self.texts.array(), type=map_type),
                pa.MapArray.from_arrays(offsets, keys, self.names.array(), type=map_type),
                self.metas.array(),
            ],
            schema=schema,
        )
        table.validate(full=True)  # valid UTF-8 in every string, as the reference checks
        return table


cdef bytes _hop_path(object path):
    """The JSON text of a hop's path (a sequence of str)."""
    cdef _Buf out = _Buf()
    cdef bytes b
    out.byte(b'[')
    for k, name in enumerate(path):
        if type(name) is not str:
            raise _Refused()
        if k:
            out.byte(b',')
        b = (<str>name).encode()
        _json_str(out, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
    out.byte(b']')
    return PyBytes_FromStringAndSize(out.p, out.n)


def table_from_chunks(chunks, str logged_by, schema):
    """The *schema* table (`aa.router.eventlog.table.SCHEMA`) of the rows of *chunks*
    (``(logged, count, msgpack, hop)``, `aa.router.eventlog.writer.Chunk`), exactly as
    `build_table` makes it of the same rows decoded (and given the hop's ttl and path);
    None when some row needs the reference path."""
    cdef _Table t = _Table(logged_by.encode())
    cdef Buf r
    cdef Py_ssize_t k, rows
    cdef bytes data
    cdef bytes hop_ttl, hop_path
    cdef double logged
    try:
        for chunk in chunks:
            logged, _, data, hop = chunk  # unpacking checks the length (no bounds checks here)
            hop_ttl = hop_path = None
            if hop is not None:
                if type(hop[0]) is not int:
                    raise _Refused()
                hop_ttl = str(hop[0]).encode()
                hop_path = _hop_path(hop[1])
            r.p = <const unsigned char*>PyBytes_AS_STRING(data)
            r.pos, r.end, r.items, r.odd = 0, PyBytes_GET_SIZE(data), 0, False
            rows = array_len(&r)
            for k in range(rows):
                t.row(&r, logged, hop_ttl, hop_path)
            if r.pos != r.end:
                raise _Refused()
        return t.table(schema)
    except (_Refused, _Other, pa.ArrowInvalid):
        return None
