"""Peak tensor memory on CPU: a dispatch mode that adds each new storage's bytes and subtracts them when the storage
is freed (tests/train/test_chunked_memory.py, tests/parallel/test_context_parallel_memory.py)."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakTensorBytes(TorchDispatchMode):
    """The most bytes of tensor storage created inside the mode and alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.current)
        return out
