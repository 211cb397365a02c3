"""Ops: a pure-torch reference per op (``ops/<op>/reference.py``), fast kernels beside it (``fast.py``)."""
