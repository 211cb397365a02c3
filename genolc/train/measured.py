"""Utilisation measured on the H200 that genolc's step-time estimates use.

``estimate_step_seconds`` (genolc/train/plan.py) divides the hardware FLOPs of the dense part and the DSA core (two
forwards and a backward for a chunked step) by the device's peak times a utilisation, and adds the indexer's
quadratic scoring and selection at their own measured rate. The utilisation is not a constant of the device: the
per-token work that is not a matrix product (KDA's recurrence, the DSA sparse attention, mHC's streams, norms) weighs
more against a narrow model's GEMMs than against a wide one's. So it is measured per preset, in `genolc finetune`
steps at 512k on one H200 with every default (chunked, the first pass's pools and DSA forwards kept), and
interpolated between the presets by active parameters.
"""

from __future__ import annotations

import math

# (preset, active parameters without the embedding and LM head, utilisation). `base`: finetune steps of 14.67-15.11 s
# at 512k (median 14.74 of seven: three runs on one machine, one on another), git f1608eb/a7cb201, with KDA's
# convolution kernels and the slab order's uint8 sort (benchmarks/results/finetune_sync_slab_2026-12-04/; 15.21-15.81
# s and 0.162 at e89142b, 15.90-16.01 s and 0.156 at ab03f4b). `small`: finetune steps of 6.26-6.36 s at 512k, git
# a7cb201 (the same folder; 6.35-6.51 s and 0.121 at b6e1319, 7.11-7.21 s and 0.104 at e825408, 7.71-7.75 s and 0.095
# before fla kept KDA's intermediates for the backward: a `small` step that has no room to keep them, on a smaller
# GPU, takes about 3.6 % longer than this estimates). At 1M `base`'s bare step took 36.2-36.7 s at e825408, before
# those kernels, against 33.4 estimated (tests/train/test_train_plan.py holds the estimate within 10 % of these runs).
MEASURED_UTILISATION = (("small", 114_658_128, 0.123), ("base", 437_644_272, 0.170))


def measured_utilisation(config) -> float:
    """The utilisation for ``config`` (a ModelConfig): the measured presets' values interpolated linearly in the
    logarithm of active parameters (embedding and LM head left out), and held at the nearest measured preset's
    value outside their range (so ``tiny``, ``mini`` and ``glm-5.3-flash``, which were not measured, get `small`'s
    and `base`'s)."""
    from genolc.model import parameter_counts

    # Without the embedding and the LM head: a tokenizer's larger vocabulary adds parameters, not the per-token work
    # that sets the utilisation.
    counts = parameter_counts(config)
    active = counts.active - counts.embedding
    points = sorted((count, value) for _, count, value in MEASURED_UTILISATION)
    if active <= points[0][0]:
        return points[0][1]
    for (low, low_value), (high, high_value) in zip(points, points[1:]):
        if active <= high:
            share = (math.log(active) - math.log(low)) / (math.log(high) - math.log(low))
            return low_value + share * (high_value - low_value)
    return points[-1][1]
