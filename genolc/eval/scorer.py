"""Scorers: anything that maps token ids ``[B, T]`` to the log-probability of each next token ``[B, T-1]``.

The statistics in :mod:`genolc.eval.buckets` never see a model, only these numbers, so they are tested with
oracle scorers and used unchanged with :class:`ModelScorer`, which wraps a :class:`genolc.model.GenomeLM`.

Window scoring (one window of ``L`` tokens, targets ``1..L-1``, target ``i`` has ``i`` tokens before it):

* full context — one forward over the whole window;
* truncated context ``K`` (the control) — targets ``i <= K`` see at most ``K`` tokens anyway and keep their
  full-context score; later targets are scored in blocks of ``M`` (default ``max(1, K // 4)``): the block of
  targets ``s..s+M-1`` is scored in one forward over tokens ``s-K .. s+M-1``, so target ``s+j`` sees ``K + j``
  tokens (between ``K`` and ``K + M - 1``: at most 25% more than ``K`` by default). Cost: ``(K + M) / M`` forward
  tokens per target, 5x a full-context pass at the default; ``--context-block 1`` gives exactly ``K`` at ``K + 1``x.
  Unlike the full window, no target sees anything beyond ``K + M - 1`` tokens back, which is the point.
* reverse-complement average — the window's reverse complement is scored the same way and its score for each
  token is mapped back (token ``i`` of the window is token ``L-1-i`` of its reverse complement); the two strands'
  log-probabilities are averaged per target. The last target of the window is the first token of the reverse
  strand, which has no prediction there, so it is left out (NaN) under RC averaging. A target keeps its
  forward-strand position for bucketing; its reverse-strand half is predicted from the tokens after it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from genolc.errors import ConfigError, InputError


class Scorer(Protocol):
    """``scorer(ids) -> logp``: ids int64 ``[B, T]`` -> natural-log probability of ``ids[:, 1:]``, ``[B, T-1]``.

    ``batch_tokens`` bounds ``B * T`` per call (the driver groups rows of equal length up to it).
    """

    batch_tokens: int

    def __call__(self, ids: np.ndarray) -> np.ndarray: ...


def check_scores(ids: np.ndarray, logp: np.ndarray) -> np.ndarray:
    """Validate a scorer's answer: shape ``[B, T-1]``, finite, at most 0 (it is a log-probability)."""
    logp = np.asarray(logp, dtype=np.float64)
    expected = (ids.shape[0], ids.shape[1] - 1)
    if logp.shape != expected:
        raise ValueError(f"scorer returned shape {logp.shape}, expected [B, T-1] = {expected}")
    if not np.all(np.isfinite(logp)):
        raise ValueError("scorer returned non-finite log-probabilities")
    if np.any(logp > 1e-6):
        raise ValueError(f"scorer returned log-probabilities above 0 (max {logp.max():.3g})")
    return np.minimum(logp, 0.0)


def score_rows(scorer: Scorer, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Score 1-D id rows (any lengths >= 2), batching rows of equal length up to ``scorer.batch_tokens``."""
    out: list[np.ndarray | None] = [None] * len(rows)
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        if len(row) < 2:
            raise ValueError(f"a row needs at least 2 tokens (one input, one target), got {len(row)}")
        by_length.setdefault(len(row), []).append(i)
    for length, members in by_length.items():
        per_call = max(1, int(scorer.batch_tokens) // length)
        for start in range(0, len(members), per_call):
            group = members[start:start + per_call]
            ids = np.stack([np.asarray(rows[i], dtype=np.int64) for i in group])
            logp = check_scores(ids, scorer(ids))
            for i, row_logp in zip(group, logp):
                out[i] = row_logp
    return out  # type: ignore[return-value]


def score_full(scorer: Scorer, ids: np.ndarray) -> np.ndarray:
    """float64 [L-1]: log-probability of targets 1..L-1 with the whole window as context."""
    return score_rows(scorer, [ids])[0]


def default_context_block(context: int) -> int:
    return max(1, context // 4)


def score_truncated(scorer: Scorer, ids: np.ndarray, context: int, full: np.ndarray,
                    block: int | None = None) -> np.ndarray:
    """float64 [L-1]: log-probability of targets 1..L-1 with at most ``context + block - 1`` tokens visible.

    ``full`` is the window's full-context score, reused for targets with at most ``context`` tokens before them.
    """
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    block = default_context_block(context) if block is None else int(block)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    length = len(ids)
    out = np.array(full, dtype=np.float64, copy=True)
    starts = list(range(context, length, block))
    if not starts:
        return out
    rows = [ids[s - context:min(s + block, length)] for s in starts]
    for s, row_logp in zip(starts, score_rows(scorer, rows)):
        # row target j (0-based) is window token s - context + 1 + j; keep those at window index >= s
        kept = row_logp[context - 1:]
        out[s - 1:s - 1 + len(kept)] = kept
    return out


def rc_check(tokenizer: Any, ids: np.ndarray) -> np.ndarray:
    """The window's reverse-complement ids, after checking they map one-to-one onto the window's tokens."""
    rc = np.asarray(tokenizer.reverse_complement(np.asarray(ids)), dtype=np.int64)
    if len(rc) != len(ids) or not np.array_equal(tokenizer.token_lengths(rc), tokenizer.token_lengths(ids)[::-1]):
        raise ConfigError(
            f"--rc-average needs a tokenizer whose reverse complement maps token to token; the {tokenizer.kind} "
            "tokenizer re-segments the reverse strand",
            fix="drop --rc-average, or evaluate a model with a char, byte or k-mer tokenizer",
        )
    return rc


def rc_to_forward(rc_logp: np.ndarray) -> np.ndarray:
    """Map reverse-strand target scores [L-1] onto forward targets 1..L-1 ([L-1], NaN for the last target)."""
    return np.concatenate([rc_logp[::-1][1:], [np.nan]])


def score_window(scorer: Scorer, ids: np.ndarray, *, contexts: Sequence[int] = (), context_block: int | None = None,
                 rc_tokenizer: Any | None = None) -> dict[str, np.ndarray]:
    """Scores of one window's targets: ``{'full': [L-1], 'ctx:K': [L-1] for each K}``.

    With ``rc_tokenizer`` each entry is the per-target mean of both strands' log-probabilities (NaN for the last
    target, which the reverse strand cannot score).
    """
    ids = np.asarray(ids, dtype=np.int64)
    strands = [(ids, False)]
    if rc_tokenizer is not None:
        strands.append((rc_check(rc_tokenizer, ids), True))
    totals: dict[str, np.ndarray] = {}
    for strand_ids, is_rc in strands:
        full = score_full(scorer, strand_ids)
        scores = {"full": full}
        for k in contexts:
            scores[f"ctx:{k}"] = score_truncated(scorer, strand_ids, k, full, context_block)
        for name, value in scores.items():
            value = rc_to_forward(value) if is_rc else value
            totals[name] = value if name not in totals else totals[name] + value
    return {name: value / len(strands) for name, value in totals.items()}


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is visible", fix="use --device cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {device!r}", fix="choose auto, cpu or cuda")
    return device


# Windows longer than this run chunk by chunk (memory: one chunk's activations plus the window's caches). 64k keeps
# the per-chunk overhead small against the work of a chunk on a GPU.
DEFAULT_WINDOW_CHUNK = 1 << 16


class ModelScorer:
    """Scores with a GenomeLM (or any module whose ``forward(ids).logits`` is ``[B, T, V]``), under no_grad.

    Logits are never log-softmaxed whole: target log-probabilities are taken ``logits_chunk`` positions at a time
    in float32. When the vocabulary is wider than the hidden size and the model has an ``lm_head`` Linear, the
    head is bypassed for the forward (``forward`` then returns the final hidden states ``[B, T, H]``) and applied
    chunk by chunk, so a 512k–1M-token window never holds its full ``[T, V]`` logits: peak extra memory is one
    ``[chunk, V]`` float32 slice. A GenomeLM window longer than ``window_chunk`` tokens runs chunk by chunk
    (:func:`chunked_target_logprobs`; None: always whole). A model may instead offer ``target_logprobs(input_ids, chunk) -> [B, T-1]``,
    which is then used as is. The model is used in whatever dtype it was loaded in (bfloat16 on CUDA by
    :func:`load_model_scorer`).
    """

    def __init__(self, model: Any, *, device: str = "auto", batch_tokens: int = 1 << 16,
                 logits_chunk: int = 1 << 14, window_chunk: int | None = DEFAULT_WINDOW_CHUNK) -> None:
        self.device = _resolve_device(device)
        self.model = model.to(self.device).eval()
        self.batch_tokens = int(batch_tokens)
        self.logits_chunk = int(logits_chunk)
        self.window_chunk = window_chunk

    def _head_bypass(self) -> Any | None:
        import torch

        head = getattr(self.model, "lm_head", None)
        if not isinstance(head, torch.nn.Linear):
            return None
        return head if head.out_features > head.in_features else None

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        import torch

        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] < 2:
            raise ValueError(f"ids must be [B, T] with T >= 2, got shape {ids.shape}")
        x = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)
        with torch.no_grad():
            hook = getattr(self.model, "target_logprobs", None)
            if callable(hook):
                logp = hook(x, self.logits_chunk)
            elif self.window_chunk and x.shape[1] > self.window_chunk and _has_chunk_interface(self.model):
                logp = chunked_target_logprobs(self.model, x, self.window_chunk, self.logits_chunk,
                                               self._head_bypass())
            else:
                logp = span_target_logprobs(self.model, None, x, 0, x.shape[1], None, self.logits_chunk,
                                            self._head_bypass())
        return logp.double().cpu().numpy()


def _has_chunk_interface(model: Any) -> bool:
    from genolc.model import GenomeLM

    return isinstance(model, GenomeLM)


def chunked_target_logprobs(model: Any, ids: Any, window_chunk: int, logits_chunk: int,
                            head: Any | None = None) -> Any:
    """float32 [B, T-1] like ``target_logprobs_from_logits(model(ids).logits, ids)``, the window run in chunks of
    ``window_chunk`` tokens through the model's chunk interface (genolc.model.cache): memory is one chunk's
    activations plus the window's caches, not the whole window's activations. ``head``: see ModelScorer."""
    from genolc.model.cache import WindowCache

    window = WindowCache(model.config.num_hidden_layers, ids.shape[1])
    return span_target_logprobs(model, window, ids, 0, ids.shape[1], window_chunk, logits_chunk, head)


def span_target_logprobs(model: Any, window: Any | None, ids: Any, start: int, stop: int, window_chunk: int | None,
                         logits_chunk: int, head: Any | None = None) -> Any:
    """float32 ``[B, min(stop, L-1) - start]``: the log-probabilities of targets ``start+1 .. min(stop, L-1)`` of
    the rows ``ids [B, L]``, positions ``start .. stop-1`` run by :func:`forward_chunks` (``window``, ``window_chunk``
    and ``head`` as there); each chunk's output is turned into log-probabilities ``logits_chunk`` positions at a
    time."""
    import torch

    batch, length = ids.shape
    out = torch.empty(batch, max(0, min(stop, length - 1) - start), dtype=torch.float32, device=ids.device)

    def take(a: int, b: int, logits: Any) -> None:
        if logits.ndim != 3 or tuple(logits.shape[:2]) != (batch, b - a):
            raise ValueError(f"logits {tuple(logits.shape)} must be [B, T, V] for ids {(batch, b - a)}")
        last = min(b, length - 1)
        if last > a:
            out[:, a - start:last - start] = logprobs_of_targets(logits[:, :last - a], ids[:, a + 1:last + 1],
                                                                 logits_chunk, head)

    forward_chunks(model, window, ids, start, stop, window_chunk, head, take)
    return out


def forward_chunks(model: Any, window: Any | None, ids: Any, start: int, stop: int, window_chunk: int | None,
                   head: Any | None, each: Callable[[int, int, Any], None]) -> None:
    """Run positions ``start .. stop-1`` of the rows ``ids [B, L]`` through ``model`` and hand each piece's output to
    ``each(a, b, output [B, b - a, …])``, under no_grad as the caller arranges.

    With a :class:`genolc.model.cache.WindowCache` ``window`` (holding what positions ``0 .. start-1`` left) the
    positions run through the model's chunk interface ``window_chunk`` tokens at a time (None: one chunk), so memory
    is one chunk's activations plus the window's caches; with ``window`` None, ``ids`` run whole in one plain
    forward (``start`` must be 0). ``head``: the model's ``lm_head``, replaced by Identity while the model runs so
    that the outputs are hidden states (the [T, V] logits are never formed whole; ``each`` applies the head itself,
    or never needs logits); None keeps the head and the outputs are logits.
    """
    import torch

    if head is not None:
        model.lm_head = torch.nn.Identity()
    try:
        if window is None:
            if start != 0 or stop != ids.shape[1]:
                raise ValueError("a forward without a window cache runs whole rows")
            each(0, stop, model(ids).logits)
            return
        chunk = window_chunk or (stop - start)
        for a in range(start, stop, chunk):
            b = min(a + chunk, stop)
            cache = window.chunk(a)
            output = model(ids[:, a:b], cache=cache).logits
            window.commit(cache, b)
            each(a, b, output)
            del output, cache
    finally:
        if head is not None:
            model.lm_head = head


def logprobs_of_targets(logits: Any, targets: Any, chunk: int = 1 << 14, head: Any | None = None) -> Any:
    """float32 [B, N]: ``log_softmax(logits[:, t]) [targets[:, t]]`` for logits [B, N, V] (hidden states [B, N, H]
    with ``head``), ``chunk`` positions at a time."""
    import torch

    batch, length = targets.shape
    out = torch.empty(batch, length, dtype=torch.float32, device=logits.device)
    for start in range(0, length, chunk):
        stop = min(length, start + chunk)
        piece = logits[:, start:stop] if head is None else head(logits[:, start:stop])
        part = torch.log_softmax(piece.float(), dim=-1)
        out[:, start:stop] = part.gather(-1, targets[:, start:stop, None]).squeeze(-1)
    return out


def target_logprobs_from_logits(logits: Any, ids: Any, chunk: int = 1 << 14, head: Any | None = None) -> Any:
    """float32 [B, T-1]: ``log_softmax(logits[:, t]) [ids[:, t+1]]``, computed ``chunk`` positions at a time.

    logits: [B, T, V] (any float dtype); ids: int64 [B, T]. With ``head`` (a module), ``logits`` are hidden states
    [B, T, H] and each chunk's logits are ``head(hidden[:, chunk])``.
    """
    if logits.ndim != 3 or logits.shape[:2] != ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be [B, T, V] for ids {tuple(ids.shape)}")
    return logprobs_of_targets(logits[:, :-1], ids[:, 1:], chunk, head)


def check_checkpoint_tokenizer(checkpoint: Path, tokenizer: Any, what: str = "checkpoint") -> None:
    """InputError unless ``checkpoint/tokenizer.json`` describes the same tokenizer as the dataset's."""
    from genolc.tokenize import load_tokenizer

    path = Path(checkpoint) / "tokenizer.json"
    if not path.is_file():
        from genolc.model.checkpoint import refuse_run_directory

        refuse_run_directory(Path(checkpoint))
        raise InputError(f"the {what} has no tokenizer.json, so its token ids cannot be checked against the dataset's",
                         where=str(checkpoint),
                         fix="save it with save_pretrained(path, tokenizer=...) or copy the training dataset's "
                             "tokenizer.json beside its weights")
    theirs = load_tokenizer(path)
    if theirs.to_dict() != tokenizer.to_dict():
        raise InputError(
            f"the {what}'s tokenizer ({_describe(theirs)}) differs from the dataset's ({_describe(tokenizer)}); "
            "its token ids would mean different bases",
            where=str(path),
            fix="evaluate on a dataset prepared with the checkpoint's tokenizer (genolc prepare --tokenizer "
                f"{path})",
        )


def _describe(tokenizer: Any) -> str:
    d = tokenizer.to_dict()
    extra = {k: v for k, v in d.items() if k in ("k", "vocab_size", "version")}
    return f"{d.get('kind')} " + ", ".join(f"{k}={v}" for k, v in extra.items())


def load_model_scorer(checkpoint: Path, tokenizer: Any, *, what: str = "checkpoint", device: str = "auto",
                      dtype: str = "auto", batch_tokens: int = 1 << 16) -> ModelScorer:
    """Load a checkpoint (save_pretrained or trainer layout) as a scorer after checking its tokenizer."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise InputError(f"the {what} directory does not exist", where=str(checkpoint),
                         fix="pass a directory written by save_pretrained or genolc finetune")
    check_checkpoint_tokenizer(checkpoint, tokenizer, what)
    import torch

    from genolc.model import load_pretrained

    device = _resolve_device(device)
    if dtype not in ("auto", "float32", "bfloat16"):
        raise ConfigError(f"unknown dtype {dtype!r}", fix="choose auto, float32 or bfloat16")
    use_bf16 = dtype == "bfloat16" or (dtype == "auto" and device == "cuda")
    model = load_pretrained(checkpoint, device=device, dtype=torch.bfloat16 if use_bf16 else None)
    if not use_bf16:
        model = model.float()
    vocab = _model_vocab(model)
    if vocab is not None and vocab < tokenizer.vocab_size:
        raise InputError(f"the {what}'s vocabulary has {vocab} ids but the tokenizer has {tokenizer.vocab_size}",
                         where=str(checkpoint), fix="evaluate with the dataset the model was trained on")
    return ModelScorer(model, device=device, batch_tokens=batch_tokens)


def _model_vocab(model: Any) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "vocab_size", None)
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None


def forward_tokens(length: int, contexts: Sequence[int], context_block: int | None, rc: bool) -> int:
    """Tokens run through the model to score one window of ``length`` tokens (for cost reports)."""
    total = length
    for k in contexts:
        block = default_context_block(k) if context_block is None else context_block
        n_blocks = max(0, math.ceil((length - k) / block))
        total += n_blocks * (k + block)
    return total * (2 if rc else 1)
