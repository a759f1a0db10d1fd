"""Data: byte-level tokenizer, the default stdlib-docstring corpus, and a dp-sharded text dataset."""
from npudist.data.corpus import build_stdlib_corpus, default_corpus_path
from npudist.data.dataset import TextDataset
from npudist.data.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "TextDataset", "build_stdlib_corpus", "default_corpus_path"]
