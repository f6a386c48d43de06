# Reading msgpack from a bytes buffer, for the compiled frame readers: the buffer (`Buf`),
# `need`, the lengths of arrays, maps and strs, and the scalar values, each as msgpack's
# unpacker builds it. Included (`include`, Cython pastes the text in) by
# `client/_deliver.pyx` (a delivery frame), `router/wire/_publishes.pyx` (a publish frame)
# and `router/eventlog/_columns.pyx` (a chunk of logged rows: `Buf`, `need`, `be` and the
# lengths only; it reads its values into Arrow's buffers, not as Python objects); the hash
# that says whether their extensions are fresh covers this file (`aa.mesh._pyx_source`).
#
# A reader stops at the first thing it does not read with `_Other` (bytes that are no
# msgpack, a str that is not UTF-8, a buffer that ends early): its caller then gives the frame
# to the reference path, which says what is wrong. `Buf.odd` is set when a length or a value
# was not in the form msgpack's packer writes it (a longer form than needed, a 32-bit float,
# a signed form of a positive int): the publish reader keeps an event's bytes only when
# nothing in them was; the delivery reader does not look at it.

from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcmp, memcpy
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t


class _Other(Exception):
    """Not the usual frame: the reference path reads it."""


#: What `read_scalar` gives for a value it does not build (a list, a map, an extension): a
#: marker, not an exception, as it is looked for once per value.
cdef object NESTED = object()


cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


cdef struct Buf:
    const unsigned char* p
    Py_ssize_t pos
    Py_ssize_t end
    Py_ssize_t items  # items of the lists and maps counted so far (by the reader)
    bint odd  # something read was not in the form msgpack's packer gives it


cdef inline int need(Buf* b, Py_ssize_t n) except -1:
    if n < 0 or b.end - b.pos < n:
        raise _Other()
    return 0


cdef inline uint64_t be(const unsigned char* p, int n):
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


cdef Py_ssize_t array_len(Buf* b) except -1:
    need(b, 1)
    cdef unsigned char c = b.p[b.pos]
    b.pos += 1
    if 0x90 <= c <= 0x9f:
        return c & 0x0f
    if c == 0xdc:
        need(b, 2)
        b.pos += 2
        return <Py_ssize_t>be(b.p + b.pos - 2, 2)
    if c == 0xdd:
        need(b, 4)
        b.pos += 4
        return <Py_ssize_t>be(b.p + b.pos - 4, 4)
    raise _Other()


cdef Py_ssize_t map_len(Buf* b) except -1:
    need(b, 1)
    cdef unsigned char c = b.p[b.pos]
    b.pos += 1
    if 0x80 <= c <= 0x8f:
        return c & 0x0f
    cdef Py_ssize_t n
    if c == 0xde:
        need(b, 2)
        b.pos += 2
        n = <Py_ssize_t>be(b.p + b.pos - 2, 2)
        b.odd |= n < 16
        return n
    if c == 0xdf:
        need(b, 4)
        b.pos += 4
        n = <Py_ssize_t>be(b.p + b.pos - 4, 4)
        b.odd |= n < 65536
        return n
    raise _Other()


cdef object text(Buf* b, Py_ssize_t n):
    need(b, n)
    try:
        s = PyUnicode_DecodeUTF8(<char*>(b.p + b.pos), n, NULL)
    except UnicodeDecodeError:
        raise _Other()
    b.pos += n
    return s


cdef Py_ssize_t str_len(Buf* b, unsigned char c) except -2:
    """The length of the str whose first byte *c* was just read, or -1 if it is no str."""
    if 0xa0 <= c <= 0xbf:
        return c & 0x1f
    cdef Py_ssize_t n
    if c == 0xd9:
        need(b, 1)
        b.pos += 1
        n = b.p[b.pos - 1]
        b.odd |= n < 32
        return n
    if c == 0xda:
        need(b, 2)
        b.pos += 2
        n = <Py_ssize_t>be(b.p + b.pos - 2, 2)
        b.odd |= n < 256
        return n
    if c == 0xdb:
        need(b, 4)
        b.pos += 4
        n = <Py_ssize_t>be(b.p + b.pos - 4, 4)
        b.odd |= n < 65536
        return n
    return -1


cdef object read_str(Buf* b):
    need(b, 1)
    cdef unsigned char c = b.p[b.pos]
    b.pos += 1
    cdef Py_ssize_t n = str_len(b, c)
    if n < 0:
        raise _Other()
    return text(b, n)


cdef object read_id(Buf* b, Py_ssize_t max_id):
    """An event's id: nil (None) or a str of 1 to *max_id* characters; `_Other` for else."""
    need(b, 1)
    if b.p[b.pos] == 0xc0:
        b.pos += 1
        return None
    eid = read_str(b)
    if not 0 < len(<str>eid) <= max_id:
        raise _Other()
    return eid


cdef object slot_text(Buf* b, Py_ssize_t n, list slots, Py_ssize_t j):
    """`text(b, n)`, the str kept in *slots[j]* when it is these bytes (an ASCII str is its
    UTF-8 bytes, so the decoded text would equal it), else decoded and kept there; plain
    `text` when *slots* is None or has no place *j*. The events of a frame mostly carry the
    same keys, and often the same text values, in the same places: each is decoded and
    hashed once per frame, not once per event."""
    if slots is None or j >= len(slots):
        return text(b, n)
    need(b, n)
    s = slots[j]
    if (
        s is not None
        and PyUnicode_GET_LENGTH(s) == n
        and PyUnicode_IS_COMPACT_ASCII(s)
        and memcmp(PyUnicode_DATA(s), b.p + b.pos, n) == 0
    ):
        b.pos += n
        return s
    s = text(b, n)
    slots[j] = s
    return s


cdef object read_scalar(Buf* b, list slots, Py_ssize_t j):
    """A str, int, float, bool, None or bytes, as msgpack builds it (a str through *slots*,
    `slot_text`); `NESTED` for a list, a map or an extension (the position is then
    undefined), `_Other` for bytes no msgpack."""
    need(b, 1)
    cdef unsigned char c = b.p[b.pos]
    cdef uint32_t f32
    cdef float f
    cdef uint64_t u
    cdef int64_t i
    cdef double d
    cdef Py_ssize_t n
    b.pos += 1
    if c <= 0x7f:
        return <long>c
    if c >= 0xe0:
        return <long>(<int8_t>c)
    n = str_len(b, c)
    if n >= 0:
        return slot_text(b, n, slots, j)
    if c == 0xc0:
        return None
    if c == 0xc2:
        return False
    if c == 0xc3:
        return True
    if c == 0xcb:
        need(b, 8)
        u = be(b.p + b.pos, 8)
        b.pos += 8
        memcpy(&d, &u, 8)
        return d
    if c == 0xca:
        need(b, 4)
        f32 = <uint32_t>be(b.p + b.pos, 4)
        b.pos += 4
        memcpy(&f, &f32, 4)
        b.odd = True  # the packer writes every float in 64 bits
        return <double>f
    # Each int is checked for the packer's form: the shortest, unsigned when not negative.
    if c == 0xcc:
        need(b, 1)
        b.pos += 1
        b.odd |= b.p[b.pos - 1] < 128
        return <long>b.p[b.pos - 1]
    if c == 0xcd:
        need(b, 2)
        b.pos += 2
        u = be(b.p + b.pos - 2, 2)
        b.odd |= u < 256
        return <long>u
    if c == 0xce:
        need(b, 4)
        b.pos += 4
        u = be(b.p + b.pos - 4, 4)
        b.odd |= u < 65536
        return <long long>u
    if c == 0xcf:
        need(b, 8)
        b.pos += 8
        u = be(b.p + b.pos - 8, 8)
        b.odd |= u < 4294967296
        return u
    if c == 0xd0:
        need(b, 1)
        b.pos += 1
        i = <int8_t>b.p[b.pos - 1]
        b.odd |= i >= -32
        return <long>i
    if c == 0xd1:
        need(b, 2)
        b.pos += 2
        i = <int16_t>be(b.p + b.pos - 2, 2)
        b.odd |= i >= -128
        return <long>i
    if c == 0xd2:
        need(b, 4)
        b.pos += 4
        i = <int32_t>be(b.p + b.pos - 4, 4)
        b.odd |= i >= -32768
        return <long long>i
    if c == 0xd3:
        need(b, 8)
        b.pos += 8
        i = <int64_t>be(b.p + b.pos - 8, 8)
        b.odd |= i >= -2147483648
        return <long long>i
    if 0xc4 <= c <= 0xc6:  # bin 8, 16, 32
        n = 1 if c == 0xc4 else 2 if c == 0xc5 else 4
        need(b, n)
        b.pos += n
        u = be(b.p + b.pos - n, <int>n)
        b.odd |= c == 0xc5 and u < 256 or c == 0xc6 and u < 65536
        n = <Py_ssize_t>u
        need(b, n)
        b.pos += n
        return PyBytes_FromStringAndSize(<const char*>(b.p + b.pos - n), n)
    return NESTED
