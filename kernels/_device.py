"""Where a call runs: the interpreter switch, the GPU's SM count and compute capability, CUDA-graph
capture; and two integer helpers. Shared by the checks, the planner and the launchers."""

from __future__ import annotations

import functools
import os

import torch

from kernels.config import NOMINAL_NUM_SMS

__all__: list[str] = []


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _cuda_num_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@functools.cache
def _cuda_sm_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _sm_major(device: torch.device) -> int | None:
    """Compute capability major of a CUDA device; ``None`` elsewhere (the interpreter, and ROCm,
    whose devices report their own architecture numbers: every rule measured on NVIDIA GPUs
    stays off there)."""
    if device.type != "cuda" or _interpreting() or torch.version.hip is not None:
        return None
    return _cuda_sm_major(device.index if device.index is not None else
                          torch.cuda.current_device())


@functools.cache
def _cuda_device_slug(index: int) -> str:
    from kernels.tuned import device_slug

    return device_slug(torch.cuda.get_device_name(index))


def _device_slug(device: torch.device) -> str:
    """The running GPU's name as a file name (``nvidia-h200``), ``interpreter`` under the
    Triton interpreter, ``cpu`` elsewhere: which measured table applies (:mod:`kernels.tuned`).
    Host only (cached per device)."""
    if _interpreting():
        return "interpreter"
    if device.type != "cuda":
        return device.type
    return _cuda_device_slug(device.index if device.index is not None else
                             torch.cuda.current_device())


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_num_sms(device.index if device.index is not None else 0)
    return NOMINAL_NUM_SMS


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _is_pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0

