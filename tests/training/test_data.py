"""Tokenizer, default corpus and the dp-sharded, resumable text dataset."""
from __future__ import annotations

import argparse

import pytest
import torch

from npudist.data import ByteTokenizer, TextDataset, build_stdlib_corpus, default_corpus_path


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "naïve café — ∑ 数据\n"
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode([104, 105, 300]) == "hi"   # padded-vocab ids are dropped


def test_default_corpus_is_deterministic_and_cached(tmp_path):
    text = build_stdlib_corpus(max_bytes=50_000)
    assert text == build_stdlib_corpus(max_bytes=50_000)
    assert 20_000 < len(text.encode()) <= 50_000 and "Return" in text
    path = default_corpus_path(cache_dir=str(tmp_path), max_bytes=50_000)
    assert default_corpus_path(cache_dir=str(tmp_path), max_bytes=50_000) == path
    cached = open(path, encoding="utf-8").read()
    assert 20_000 < len(cached.encode()) <= 50_000 and "Return" in cached


def test_default_corpus_does_not_depend_on_what_the_caller_imported(tmp_path, monkeypatch):
    # Packages add or replace methods on standard-library classes; gathered in the caller's process, such a
    # method's docstring would enter the text and change every loss trained on it.
    before = open(default_corpus_path(cache_dir=str(tmp_path / "a"), max_bytes=50_000), encoding="utf-8").read()

    def added_by_a_package():
        """Docstring of a method some package patched into argparse."""

    monkeypatch.setattr(argparse.ArgumentParser, "added_by_a_package", added_by_a_package, raising=False)
    assert "patched into argparse" in build_stdlib_corpus(max_bytes=50_000)   # the hazard is real
    after = open(default_corpus_path(cache_dir=str(tmp_path / "b"), max_bytes=50_000), encoding="utf-8").read()
    assert after == before


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(bytes(torch.randint(0, 256, (10240,), generator=torch.Generator().manual_seed(0)).tolist()))
    return str(path)


def test_windows_are_shifted_bytes_of_the_file(corpus):
    ds = TextDataset(corpus, seq_len=8, batch_size=3, shuffle=False)
    x, y = ds.next_batch()
    data = open(corpus, "rb").read()
    assert x.dtype == torch.int64 and x.shape == (3, 8)
    for row in range(3):
        assert x[row].tolist() == list(data[row * 8: row * 8 + 8])
        assert y[row].tolist() == list(data[row * 8 + 1: row * 8 + 9])


def test_dp_shards_concatenate_to_the_single_rank_batch(corpus):
    single = TextDataset(corpus, seq_len=16, batch_size=6, seed=5)
    shards = [TextDataset(corpus, seq_len=16, batch_size=2, dp_rank=r, dp_degree=3, seed=5) for r in range(3)]
    for _ in range(4):
        x, y = single.next_batch()
        parts = [ds.next_batch() for ds in shards]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
        # different ranks never see the same window in one step
        assert len({tuple(r.tolist()) for p in parts for r in p[0]}) == 6


def test_resume_continues_exactly_and_epochs_reshuffle(corpus):
    a = TextDataset(corpus, seq_len=32, batch_size=4, seed=1)
    for _ in range(3):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch()[0] for _ in range(200)]   # crosses several epochs (318 windows)
    b = TextDataset(corpus, seq_len=32, batch_size=4, seed=1)
    b.load_state_dict(state)
    assert all(torch.equal(b.next_batch()[0], e) for e in expected)
    assert a.epoch >= 2
    with pytest.raises(ValueError, match="seq_len"):
        TextDataset(corpus, seq_len=16, batch_size=4, seed=1).load_state_dict(state)


def test_bad_inputs_name_the_problem(tmp_path, corpus):
    with pytest.raises(ValueError, match="data.path"):
        TextDataset(str(tmp_path / "missing.txt"), seq_len=8, batch_size=1)
    small = tmp_path / "small.txt"
    small.write_text("tiny")
    with pytest.raises(ValueError, match="fewer than one global batch"):
        TextDataset(str(small), seq_len=8, batch_size=1)
    with pytest.raises(ValueError, match="dp_rank"):
        TextDataset(corpus, seq_len=8, batch_size=1, dp_rank=2, dp_degree=2)
