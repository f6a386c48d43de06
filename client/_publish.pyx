# cython: language_level=3, boundscheck=False, wraparound=False
"""Checking and packing a published event, compiled (no I/O): `pack`.

`pack(id, etype, values, meta, max_id)` returns the bytes the reference path makes of the same event
(`aa.client.outbox.packed_publish`: the value model's checks, then msgpack's `pack` of
``[id, type, values, meta]`` by the codec's packer), in one pass over the values. It packs the
usual event only — flat maps of str keys and values whose type is exactly str, int, float,
bool, None or bytes, a str id of 1 to `max_id` characters, a str or no type, under
`MAX_BYTES` bytes in all — and returns None for anything else, which the reference path then
checks and packs, with its errors. `tests/test_compiled_publish.py` holds the bytes equal.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from cpython.long cimport PyLong_AsUnsignedLongLong
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.string cimport memcpy
from libc.stdint cimport int64_t, uint64_t

__all__ = ["pack", "MAX_BYTES"]

cdef enum:
    CAP = 2048  # the buffer on the stack: larger events go the reference way

#: Events of more bytes than this are packed by the reference path.
MAX_BYTES = CAP


class _Other(Exception):
    """Not the usual event: the reference path packs it."""


cdef struct W:
    unsigned char* p
    Py_ssize_t n


cdef inline int room(W* w, Py_ssize_t k) except -1:
    if w.n + k > CAP:
        raise _Other()
    return 0


cdef inline int put_be(W* w, unsigned char head, uint64_t v, int size) except -1:
    room(w, 1 + size)
    w.p[w.n] = head
    cdef int i
    for i in range(size):
        w.p[w.n + size - i] = <unsigned char>(v >> (8 * i))
    w.n += 1 + size
    return 0


cdef inline int put_byte(W* w, unsigned char c) except -1:
    room(w, 1)
    w.p[w.n] = c
    w.n += 1
    return 0


cdef int put_str(W* w, str s) except -1:
    cdef Py_ssize_t size
    cdef const char* data
    try:
        data = PyUnicode_AsUTF8AndSize(s, &size)
    except UnicodeEncodeError:
        raise _Other()
    if size < 32:
        put_byte(w, 0xa0 | <unsigned char>size)
    elif size < 256:
        put_be(w, 0xd9, size, 1)
    elif size < 65536:
        put_be(w, 0xda, size, 2)
    else:
        put_be(w, 0xdb, size, 4)
    room(w, size)
    memcpy(w.p + w.n, data, size)
    w.n += size
    return 0


cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1


cdef int put_int(W* w, object o) except -1:
    cdef int overflow = 0
    cdef long long d = PyLong_AsLongLongAndOverflow(o, &overflow)
    cdef uint64_t u
    if overflow < 0:
        raise _Other()  # under the value model's range
    if overflow > 0:
        u = PyLong_AsUnsignedLongLong(o)  # OverflowError past it: the reference says so
        return put_be(w, 0xcf, u, 8)
    if d < 0:
        if d >= -32:
            return put_byte(w, <unsigned char>(d & 0xff))
        if d >= -128:
            return put_be(w, 0xd0, <uint64_t>d, 1)
        if d >= -32768:
            return put_be(w, 0xd1, <uint64_t>d, 2)
        if d >= -2147483648:
            return put_be(w, 0xd2, <uint64_t>d, 4)
        return put_be(w, 0xd3, <uint64_t>d, 8)
    u = <uint64_t>d
    if u < 128:
        return put_byte(w, <unsigned char>u)
    if u < 256:
        return put_be(w, 0xcc, u, 1)
    if u < 65536:
        return put_be(w, 0xcd, u, 2)
    if u < 4294967296:
        return put_be(w, 0xce, u, 4)
    return put_be(w, 0xcf, u, 8)


cdef int put_map(W* w, dict m) except -1:
    cdef Py_ssize_t n = len(m)
    cdef Py_ssize_t pos = 0
    cdef PyObject* keyp
    cdef PyObject* valuep
    cdef double f
    cdef uint64_t bits
    cdef Py_ssize_t size
    if n < 16:
        put_byte(w, 0x80 | <unsigned char>n)
    elif n < 65536:
        put_be(w, 0xde, n, 2)
    else:
        put_be(w, 0xdf, n, 4)
    while PyDict_Next(m, &pos, &keyp, &valuep):
        key = <object>keyp
        value = <object>valuep
        if type(key) is not str:
            raise _Other()
        put_str(w, <str>key)
        t = type(value)
        if t is str:
            put_str(w, <str>value)
        elif t is float:
            f = <double>value
            memcpy(&bits, &f, 8)
            put_be(w, 0xcb, bits, 8)
        elif t is int:
            put_int(w, value)
        elif value is None:
            put_byte(w, 0xc0)
        elif t is bool:
            put_byte(w, 0xc3 if value is True else 0xc2)
        elif t is bytes:
            size = PyBytes_GET_SIZE(value)
            if size < 256:
                put_be(w, 0xc4, size, 1)
            elif size < 65536:
                put_be(w, 0xc5, size, 2)
            else:
                put_be(w, 0xc6, size, 4)
            room(w, size)
            memcpy(w.p + w.n, PyBytes_AS_STRING(value), size)
            w.n += size
        else:
            raise _Other()
    return 0


def pack(id, etype, values, meta, Py_ssize_t max_id):
    """The bytes of ``[id, type, values, meta]`` as the codec packs them, the event checked
    as the value model checks it; None when the reference path is to check and pack it."""
    cdef unsigned char buf[CAP]
    cdef W w
    w.p = buf
    w.n = 0
    if (
        type(id) is not str
        or not 0 < len(<str>id) <= max_id
        or not (etype is None or type(etype) is str)
        or type(values) is not dict
        or type(meta) is not dict
    ):
        return None
    try:
        put_byte(&w, 0x94)
        put_str(&w, <str>id)
        if etype is None:
            put_byte(&w, 0xc0)
        else:
            put_str(&w, <str>etype)
        put_map(&w, <dict>values)
        put_map(&w, <dict>meta)
    except (_Other, OverflowError):
        return None
    return PyBytes_FromStringAndSize(<char*>buf, w.n)

