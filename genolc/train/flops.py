"""FLOPs of a training step, counted once: the trainer's MFU, `genolc plan` and the benchmarks use these.

Per token of a window of ``T`` tokens (forward; a training step is forward + backward, 3x)::

    dense       2 N_active                    every matrix the token passes through (routed experts: its top-k only)
    DSA core    4 H R k(T) per DSA layer      the absorbed latent attention as it runs: scores q_lat . latent and
                                              the output P . latent over the R = kv_lora_rank latent dims, for the
                                              k(T) keys a query reads on average (all causal keys below the index
                                              width W, W once past it): sparse, never counted as dense
    indexer     2 Hi Di T / (2 kpool)         per layer with an indexer: each query scores every earlier pool (its
                                              selection takes no gradient, so it counts in the forward only)

Model FLOPs (MFU's numerator) count one forward and one backward of the dense part and the DSA core, and the
indexer's forward. Hardware FLOPs (HFU) add what the step strategy runs again: one more forward with per-layer
recompute, and with the chunked step its no-grad fill pass over every chunk but the last (:func:`fill_fraction`
of a forward; every chunk on a context-parallel shard). The indexer's scoring counts among them only where it
runs again (a chunked step that keeps its first pass's pools chooses once), and the DSA core's only where its
forward is not kept (genolc/train/kept_attention.py): kept, only the last chunk's recompute runs it again. MFU
divides by the
device's dense bf16 peak from the vendor's table (:func:`device_peak_flops`); on devices not in it MFU is not
reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from genolc.model import ModelConfig, parameter_counts

# Dense bf16 tensor-core peak per GPU (vendor data sheets, without sparsity), matched against the device name.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "B200": 2250e12, "B300": 2250e12,
                   "A100": 312e12, "A800": 312e12, "L40S": 362e12}


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs per token of one training step (module docstring)."""

    dense_forward: float
    attention_forward: float
    indexer_forward: float
    extra_forwards: float               # forwards the step strategy runs again (recompute, chunk fill)
    extra_indexer_forwards: float       # of those, the ones that score the indexer's pools again
    extra_attention_forwards: float     # of those, the ones that run the DSA core's forward again

    @property
    def model(self) -> float:
        return 3 * (self.dense_forward + self.attention_forward) + self.indexer_forward

    @property
    def hardware(self) -> float:
        return (self.model + self.extra_forwards * self.dense_forward
                + self.extra_attention_forwards * self.attention_forward
                + self.extra_indexer_forwards * self.indexer_forward)


def average_keys_per_query(seq_len: int, index_width: int) -> float:
    """Mean over the window's queries of the keys each reads: ``min(t + 1, W)`` for the query at position ``t``."""
    if seq_len <= index_width:
        return (seq_len + 1) / 2
    below = index_width * (index_width + 1) / 2            # positions 0 .. W - 1 read t + 1 keys
    return (below + (seq_len - index_width) * index_width) / seq_len


def fill_fraction(seq_len: int, chunk: int | None, *, sharded: bool = False) -> float:
    """The share of a window's tokens whose forward the chunked step's fill pass runs before their forward with
    grad (genolc/train/chunked.py): every chunk of ``chunk`` tokens but the last, or all of them on a process that
    holds a shard of each chunk; 0 for a step that is not chunked (``chunk`` None)."""
    if chunk is None:
        return 0.0
    if chunk < 1 or seq_len < 1:
        raise ValueError(f"seq_len ({seq_len}) and chunk ({chunk}) must be positive")
    if sharded:
        return 1.0
    return (seq_len - 1) // chunk * chunk / seq_len


def token_flops(config: ModelConfig, seq_len: int, *, recompute: bool = False, chunk_fill: float = 0.0,
                selections_kept: bool = False, attention_kept: bool = False) -> TokenFlops:
    """FLOPs per token of a step over windows of ``seq_len`` tokens (module docstring). ``chunk_fill``: for the
    chunked step, the :func:`fill_fraction` of the window its first pass runs (0: not chunked); ``selections_kept``:
    a chunked step that keeps its first pass's pools (the indexer scores once); ``attention_kept``: one that keeps
    its first pass's DSA forwards (the DSA core's forward runs once, again only in the last chunk's recompute)."""
    if not 0.0 <= chunk_fill <= 1.0:
        raise ValueError(f"chunk_fill must be in [0, 1], got {chunk_fill}")
    c = config
    dense = 2.0 * parameter_counts(c).active
    keys = average_keys_per_query(seq_len, c.index_width)
    attention = sum(4.0 * c.num_attention_heads * c.kv_lora_rank * keys for _ in c.dsa_layers)
    indexer_layers = sum(1 for i in c.dsa_layers if c.indexer_types[i] == "full")
    indexer = indexer_layers * 2.0 * c.index_n_heads * c.index_head_dim * seq_len / (2 * c.index_kpool)
    chunked = chunk_fill > 0
    extra = int(recompute) + chunk_fill
    return TokenFlops(dense, attention, indexer, extra, 0.0 if chunked and selections_kept else extra,
                      int(recompute) * (1.0 - chunk_fill) if chunked and attention_kept else extra)


def device_peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device named like ``NVIDIA H200``, or None when it is not in the table."""
    upper = device_name.upper()
    for name, peak in PEAK_BF16_FLOPS.items():
        if name in upper:
            return peak
    return None
