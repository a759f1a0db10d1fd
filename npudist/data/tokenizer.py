"""Byte-level tokenizer: every UTF-8 byte is one token, ids 0..255.

No vocabulary file, no training, lossless round trip for any text — and because token ids are the file's
bytes, a dataset can memory-map a text file and use it as the token array directly (see ``TextDataset``).
"""
from __future__ import annotations


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        """Ids outside 0..255 (possible when a model's vocab is padded) are dropped; undecodable byte
        sequences (a model's mistakes) become U+FFFD."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")
