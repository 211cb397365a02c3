"""Python API for notebooks: load a checkpoint, score variants from a DataFrame, embed sequences.

    from genolc.score.api import load
    model = load("runs/hg38-64k")                     # a checkpoint or a finetune run directory
    scored = model.score_variants(df, "hg38.fa.gz", windows=(8192, 65536), rc_average=True)
    vectors = model.embed(["ACGT…", "GGCA…"])       # float32 [n, D] (mean over each sequence's tokens)

The score is defined in :mod:`genolc.score.variants`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from genolc.errors import InputError
from genolc.score.reference import Reference
from genolc.score.variants import ScoreSettings, score_variants
from genolc.score.vcf import site_variants


@dataclass
class LoadedModel:
    """A checkpoint ready to score: its :class:`~genolc.eval.scorer.ModelScorer` and its tokenizer."""

    scorer: Any
    tokenizer: Any
    checkpoint: Path

    @property
    def model(self) -> Any:
        return self.scorer.model

    def score_variants(self, variants: Any, genome: str | Path | Reference, *, windows: Sequence[int] = (8192,),
                       placement: str = "center", rc_average: bool = False, reduce: str = "sum") -> Any:
        """A copy of the DataFrame with ``status`` and one score column per window (``score`` for one window,
        else ``score_<window>``). Columns chrom, pos, ref, alt (any case); pos 1-based as in VCF."""
        table = variants.copy()
        columns = {c.lower(): c for c in table.columns}
        missing = [c for c in ("chrom", "pos", "ref", "alt") if c not in columns]
        if missing:
            raise InputError(f"the DataFrame lacks column(s) {', '.join(missing)}", fix="name them chrom, pos, ref, alt")
        parsed = [variant
                  for i, (_, row) in enumerate(table.iterrows())
                  for variant in site_variants(i + 1, str(row[columns["chrom"]]), row[columns["pos"]],
                                               str(row[columns["ref"]]), [str(row[columns["alt"]])],
                                               where=f"DataFrame row {i}", fix="fix the row")]
        settings = ScoreSettings(windows=tuple(int(w) for w in windows), placement=placement, rc_average=rc_average,
                                 reduce=reduce)
        reference = genome if isinstance(genome, Reference) else Reference(genome)
        try:
            statuses, scores = score_variants(self.scorer, self.tokenizer, reference, parsed, settings)
        finally:
            if reference is not genome:
                reference.close()
        table["status"] = statuses
        for w, window in enumerate(settings.windows):
            table["score" if len(settings.windows) == 1 else f"score_{window}"] = scores[:, w]
        return table

    def embed(self, sequences: Sequence[str | bytes | np.ndarray], *, layer: int | None = None,
              pool: str = "mean") -> Any:
        """Hidden states of each sequence: ``float32 [n, D]`` for pool 'mean', a list of ``[T_i, D]`` for 'none'."""
        from genolc.eval.scorer import DEFAULT_WINDOW_CHUNK
        from genolc.score.embed import HiddenStates, embed_regions

        hidden = HiddenStates(self.model, layer, DEFAULT_WINDOW_CHUNK)
        as_bases = [np.frombuffer(s.encode() if isinstance(s, str) else bytes(s), dtype=np.uint8)
                    if not isinstance(s, np.ndarray) else s for s in sequences]
        out = embed_regions(hidden, self.tokenizer, as_bases, pool)
        return np.stack(out) if pool == "mean" and out else out


def load(checkpoint: str | Path, *, device: str = "auto", dtype: str = "auto", batch_tokens: int = 1 << 16
         ) -> LoadedModel:
    """Load a checkpoint (or a finetune run directory: its newest checkpoint) with the tokenizer saved beside it."""
    from genolc.eval.scorer import load_model_scorer
    from genolc.tokenize import load_tokenizer
    from genolc.train.state import resolve_checkpoint

    path = resolve_checkpoint(Path(checkpoint), "--checkpoint")
    tokenizer_path = path / "tokenizer.json"
    if not tokenizer_path.is_file():
        if not path.is_dir():
            raise InputError("the checkpoint directory does not exist", where=str(path),
                             fix="pass a directory written by save_pretrained or genolc finetune")
        raise InputError("the checkpoint has no tokenizer.json, so sequences cannot be turned into its token ids",
                         where=str(path), fix="copy the training dataset's tokenizer.json beside its weights")
    tokenizer = load_tokenizer(tokenizer_path)
    scorer = load_model_scorer(path, tokenizer, device=device, dtype=dtype, batch_tokens=batch_tokens)
    return LoadedModel(scorer, tokenizer, path)
