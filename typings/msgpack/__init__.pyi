# Types for the part of msgpack that Aa uses (msgpack ships none). Decoded data is `Any`:
# it comes off the wire unchecked, and the code that receives it checks it.
from collections.abc import Callable
from typing import Any, NamedTuple

version: tuple[int, int, int]

class UnpackException(Exception): ...
class BufferFull(UnpackException): ...
class OutOfData(UnpackException): ...
class FormatError(ValueError, UnpackException): ...
class StackError(ValueError, UnpackException): ...

class ExtraData(UnpackException):
    unpacked: Any
    extra: bytes

class ExtType(NamedTuple):
    code: int
    data: bytes

class Packer:
    def __init__(
        self,
        *,
        default: Callable[[Any], Any] | None = ...,
        use_single_float: bool = ...,
        autoreset: bool = ...,
        use_bin_type: bool = ...,
        strict_types: bool = ...,
        datetime: bool = ...,
        unicode_errors: str | None = ...,
    ) -> None: ...
    def pack(self, obj: object) -> bytes: ...
    def pack_map_header(self, n: int) -> bytes: ...
    def pack_array_header(self, n: int) -> bytes: ...
    def bytes(self) -> bytes: ...
    def reset(self) -> None: ...

class Unpacker:
    def __init__(
        self,
        file_like: object = ...,
        *,
        read_size: int = ...,
        use_list: bool = ...,
        raw: bool = ...,
        timestamp: int = ...,
        strict_map_key: bool = ...,
        object_hook: Callable[[dict[Any, Any]], Any] | None = ...,
        object_pairs_hook: Callable[[list[tuple[Any, Any]]], Any] | None = ...,
        list_hook: Callable[[list[Any]], Any] | None = ...,
        unicode_errors: str | None = ...,
        max_buffer_size: int = ...,
        ext_hook: Callable[[int, bytes], Any] = ...,
        max_str_len: int = ...,
        max_bin_len: int = ...,
        max_array_len: int = ...,
        max_map_len: int = ...,
        max_ext_len: int = ...,
    ) -> None: ...
    def feed(self, next_bytes: bytes | bytearray | memoryview) -> None: ...
    def unpack(self) -> Any: ...
    def tell(self) -> int: ...
    def __iter__(self) -> Unpacker: ...
    def __next__(self) -> Any: ...

def packb(o: object, **kwargs: Any) -> bytes: ...
def unpackb(packed: bytes | bytearray | memoryview, **kwargs: Any) -> Any: ...
