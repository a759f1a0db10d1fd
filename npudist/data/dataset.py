"""A text file as a stream of fixed-length training windows, sharded by data-parallel rank.

The byte-level tokenizer maps every byte to its own id, so the file *is* the token array: it is memory-mapped,
never copied or tokenized up front, and any file size works. The file is cut into ``num_windows`` windows of
``seq_len + 1`` tokens (stride ``seq_len``); each epoch visits them in a seeded permutation.

Sharding: global sample ``g`` of the run is window ``perm[g % num_windows]``. A global batch is
``dp_degree * batch_size`` consecutive samples and data-parallel rank ``r`` takes the ``r``-th slice of
``batch_size``. Concatenating all ranks' batches in rank order gives exactly the batch a single device with
``dp_degree * batch_size`` would see — which is what makes the parity tests possible.

Resume: the whole position is one integer (global samples consumed), saved by ``state_dict``. It does not
depend on ``dp_degree`` or ``batch_size``, so a run may resume under another data-parallel layout.
"""
from __future__ import annotations

import os

import numpy as np
import torch


class TextDataset:
    def __init__(self, path: str, seq_len: int, batch_size: int, dp_rank: int = 0, dp_degree: int = 1,
                 seed: int = 0, shuffle: bool = True):
        if not os.path.isfile(path):
            raise ValueError(f"data.path={path!r} does not exist or is not a file; point it at a text file "
                             "or leave it empty to use the built-in stdlib-docstring corpus")
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be >= 1")
        if not 0 <= dp_rank < dp_degree:
            raise ValueError(f"dp_rank={dp_rank} is outside [0, dp_degree={dp_degree})")
        self.path, self.seq_len, self.batch_size = path, seq_len, batch_size
        self.dp_rank, self.dp_degree, self.seed, self.shuffle = dp_rank, dp_degree, seed, shuffle
        size = os.path.getsize(path)
        self.num_windows = (size - 1) // seq_len if size > 1 else 0
        if self.num_windows < dp_degree * batch_size:
            raise ValueError(
                f"{path} ({size} bytes) holds {self.num_windows} windows of seq_len={seq_len}, fewer than one "
                f"global batch ({dp_degree} dp ranks x batch_size {batch_size}); use a larger file or smaller "
                "data.seq_len / training.batch_size")
        self._tokens = np.memmap(path, dtype=np.uint8, mode="r")
        self.position = 0  # global samples consumed; the only state needed to resume
        self._perm_epoch, self._perm = -1, None

    def _window_index(self, sample: int) -> int:
        epoch, offset = divmod(sample, self.num_windows)
        if not self.shuffle:
            return offset
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.num_windows, generator=gen), epoch
        return int(self._perm[offset])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next (inputs, labels), each [batch_size, seq_len] int64 on CPU."""
        first = self.position + self.dp_rank * self.batch_size
        rows = []
        for sample in range(first, first + self.batch_size):
            start = self._window_index(sample) * self.seq_len
            rows.append(np.asarray(self._tokens[start:start + self.seq_len + 1], dtype=np.int64))
        self.position += self.dp_degree * self.batch_size
        window = torch.from_numpy(np.stack(rows))
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()

    def __iter__(self):
        while True:
            yield self.next_batch()

    @property
    def epoch(self) -> int:
        return self.position // self.num_windows

    def state_dict(self) -> dict:
        """The layout-independent position: global samples consumed, plus what gives a sample its meaning
        (shuffling seed, window length, number of windows in the file). No per-rank or per-layout value."""
        return {"position": self.position, "seed": self.seed, "seq_len": self.seq_len,
                "num_windows": self.num_windows}

    def load_state_dict(self, state: dict) -> None:
        """Resume at a saved position, under any dp degree and micro-batch size (the position counts global
        samples). A different seed, window length or file size would make the same position name other
        windows, so those are refused."""
        for key, what in (("seed", "data.seed"), ("seq_len", "data.seq_len"),
                          ("num_windows", "number of windows in the data file")):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"cannot resume: the checkpoint's {what} is {int(state[key])} but this run's is "
                                 f"{getattr(self, key)}; the saved data position would name other samples")
        self.position = int(state["position"])
