"""The assets a torchtitan job reads, made without a download: a byte-level tokenizer in the HF layout
torchtitan loads (256 byte tokens + bos/eos, no merges) and a small JSON-lines text dataset."""
from __future__ import annotations

import json
import random
from pathlib import Path


def write_titan_assets(root: Path, words: list[str], lines: int) -> None:
    """Writes ``root/tokenizer`` and ``root/data/train.json`` (``lines`` texts of 60 words drawn from ``words``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    (root / "tokenizer").mkdir()
    (root / "data").mkdir()
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    vocab.update({s: len(vocab) + i for i, s in enumerate(specials)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": specials[0], "eos_token": specials[1]}))
    rnd = random.Random(0)
    with open(root / "data" / "train.json", "w") as f:
        for _ in range(lines):
            f.write(json.dumps({"text": " ".join(rnd.choice(words) for _ in range(60))}) + "\n")
