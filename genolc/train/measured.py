"""Utilisation measured on the H200 that genolc's estimates use (no imports: the CLI reads it for a default)."""

# Utilisation of the dense part measured on the H200 on 2026-11-30 (chunked steps of `small` at 512k-4M and of `base`
# with recompute at 512k-2M all within 10 % of genolc.train.plan.estimate_step_seconds at this value, the indexer's
# quadratic scoring counted apart at its kernel's rate). `genolc plan`'s default and the step strategy's estimate
# of whether keeping the chosen DSA pools pays.
MEASURED_MFU = 0.034
