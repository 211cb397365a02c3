"""MoE expert ops: the pure-torch reference (``reference.py``) and the grouped-GEMM path (``fast.py``)."""
