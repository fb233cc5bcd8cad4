"""Type stub for the C extension `_wordindex.c` (whitespace split + word -> id)."""

from collections.abc import Sequence

class WordIndex:
    unk_id: int
    def __init__(self, words: Sequence[str], unk_id: int) -> None: ...
    def __len__(self) -> int: ...
    def encode(
        self, texts: Sequence[str], /
    ) -> tuple[bytearray, bytearray, bytearray, bytearray]: ...
    def encode_words(
        self, token_lists: Sequence[Sequence[str]], /
    ) -> tuple[bytearray, bytearray, bytearray, bytearray]: ...
