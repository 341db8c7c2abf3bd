"""Triton kernels (@triton.jit code only); the host side lives in gemmkit.core and gemmkit.ops."""
