"""Triton ``@triton.jit`` code. Launchers and validation live one level up (``kernels/*.py``)."""
