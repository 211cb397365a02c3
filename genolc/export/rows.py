"""A training window as a row for an external trainer: token ids plus a 0/1 loss mask of the same length.

Row ``i`` is the window genolc's :class:`~genolc.data.sampler.TrainSampler` draws for step ``i`` (micro-batch 0,
one data-parallel rank): the window ``genolc finetune --micro-batch 1 --grad-accum 1`` trains on at step ``i``.

Loss mask, per position: 0 for the first token (nothing precedes it, so it is never a target; SkyRL and Megatron
both score token ``t`` from tokens ``< t``), 0 where the token is ambiguous (N / IUPAC / BED-excluded, the tokens
genolc's own loss weights 0: :func:`genolc.data.targets.window_targets`, which genolc's trainer reads too), 1
otherwise. Soft-masked (repeat) bases keep 1: a 0/1 mask cannot carry genolc's
fractional ``--softmask-weight``.

Two tokenizations:

- genome (default): the dataset's own token ids, exactly the ids genolc trains on (``seq_len + 1`` per row);
- text: the window's bases decoded and re-encoded with a checkpoint's own ``tokenizers`` JSON; a token is masked
  when any base it covers is ambiguous, and the row is cut at ``seq_len + 1`` text tokens (a text tokenizer packs
  several bases per token, so rows are usually shorter).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from genolc.data.sampler import TrainSampler, Window
from genolc.data.targets import window_targets
from genolc.errors import ConfigError, InputError
from genolc.fsutil import file_md5

# Bases a text tokenizer sees that are not ambiguous; anything else (N, IUPAC codes) masks the tokens covering it.
_PLAIN_BASES = np.zeros(256, dtype=bool)
_PLAIN_BASES[np.frombuffer(b"ACGTacgt", dtype=np.uint8)] = True


@dataclass(frozen=True)
class Row:
    index: int
    window: Window
    input_ids: np.ndarray   # int64[n]
    loss_mask: np.ndarray   # int8[n], 0/1


class TextTokenizer:
    """A checkpoint's own text tokenizer (a ``tokenizers`` JSON file), applied to a window's bases."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        self.path = Path(path).expanduser().absolute()
        if not self.path.is_file():
            raise InputError("text tokenizer file not found", where=str(self.path),
                             fix="give the checkpoint's tokenizer.json (a `tokenizers` JSON file)")
        try:
            self._tok = HFTokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises a bare Exception for any malformed file
            raise InputError(f"not a `tokenizers` JSON file ({str(exc).splitlines()[0][:200]})", where=str(self.path),
                             fix="give the checkpoint's tokenizer.json") from None
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def describe(self) -> dict[str, Any]:
        return {"kind": "text", "file": str(self.path), "md5": file_md5(self.path), "vocab_size": self.vocab_size}

    def encode_bases(self, bases: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids int64[n], ambiguous bool[n])`` for uint8 ASCII ``bases``, at most ``max_tokens`` tokens."""
        encoding = self._tok.encode(bases.tobytes().decode("ascii"), add_special_tokens=False)
        ids = np.asarray(encoding.ids[:max_tokens], dtype=np.int64)
        spans = np.asarray(encoding.offsets[:max_tokens], dtype=np.int64).reshape(-1, 2)
        # A prefix sum of ambiguous bases answers "does this token's span hold one" for every token at once.
        bad = np.concatenate([[0], np.cumsum(~_PLAIN_BASES[bases], dtype=np.int64)])
        return ids, bad[spans[:, 1]] > bad[spans[:, 0]]


class RowBuilder:
    """Rows from a prepared dataset's sampler windows, with the genome tokenizer or a text tokenizer."""

    def __init__(self, dataset: Any, sampler: TrainSampler, text_tokenizer: TextTokenizer | None = None):
        self.dataset = dataset
        self.sampler = sampler
        self.text_tokenizer = text_tokenizer

    @property
    def vocab_size(self) -> int:
        if self.text_tokenizer is not None:
            return self.text_tokenizer.vocab_size
        return int(self.dataset.tokenizer.vocab_size)

    def describe_tokenizer(self) -> dict[str, Any]:
        if self.text_tokenizer is not None:
            return self.text_tokenizer.describe()
        return {"kind": "genome", "vocab_size": self.vocab_size, "spec": self.dataset.manifest["tokenizer"]}

    def row(self, index: int) -> Row:
        window = self.sampler.window(index, 0)
        ids, weights = window_targets(self.dataset, window)
        if self.text_tokenizer is None:
            mask = np.concatenate([[0], weights > 0]).astype(np.int8)
        else:
            bases = np.asarray(self.dataset.tokenizer.decode(ids), dtype=np.uint8)
            ids, ambiguous = self.text_tokenizer.encode_bases(bases, self.sampler.window_tokens)
            mask = (~ambiguous).astype(np.int8)
            if mask.size:
                mask[0] = 0
        if not mask.any():
            raise ConfigError(f"window {index} ({window.key}:{window.start}-{window.stop} tokens) has no token to "
                              f"train on (every target is ambiguous)", where=str(getattr(self.dataset, "path", "")),
                              fix="lower --max-n-fraction so windows this ambiguous are redrawn")
        return Row(index, window, ids, mask)

    def rows(self, count: int) -> Iterator[Row]:
        for index in range(count):
            yield self.row(index)
