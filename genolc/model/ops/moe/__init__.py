"""MoE expert ops: the pure-torch reference (``reference.py``), the grouped-GEMM path (``grouped_mm.py``) and GLM's
clamped SwiGLU both use (``swiglu.py``)."""
