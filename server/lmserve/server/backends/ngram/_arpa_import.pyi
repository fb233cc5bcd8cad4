"""Type stub for the C extension `_arpa_import.c` (ARPA sections -> probing tables)."""

class TooManyFillIns(Exception): ...

class TableBuilder:
    def __init__(self, counts: tuple[int, ...], ln10: float) -> None: ...
    def start_section(self, n: int, /) -> None: ...
    def feed(
        self, buffer: bytes, start: int, first_line: int, at_eof: bool, /
    ) -> tuple[int, int, bool, int]: ...
    def finish(
        self,
    ) -> tuple[
        bytes,
        bytearray,
        bytearray,
        tuple[tuple[bytearray, int], ...],
        tuple[int, ...],
        tuple[bytearray, bytearray] | None,
    ]: ...
