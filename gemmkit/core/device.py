"""What gemmkit needs to know about a device: limits for config derivation, peaks for rooflines.

Everything here is read once per device and cached; nothing is queried on the per-call path.
Under the Triton interpreter (``TRITON_INTERPRET=1``, CPU tensors) a Hopper-like profile is used so
that the same config logic and the TMA code paths run on the CPU.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import torch


def interpreter_active() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def normalize_device_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3' (the key of the config files)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


# Datasheet peaks (dense, no sparsity) used only to express benchmark results as % of roofline.
# Keys are normalized device-name prefixes; values: TFLOP/s per operand class and HBM TB/s.
_DATASHEET = {
    "NVIDIA_H100_80GB_HBM3": {"16bit": 989.0, "8bit": 1979.0, "tbps": 3.35},
    "NVIDIA_H100_NVL": {"16bit": 835.0, "8bit": 1671.0, "tbps": 3.9},
    "NVIDIA_H100_PCIe": {"16bit": 756.0, "8bit": 1513.0, "tbps": 2.0},
    "NVIDIA_H200": {"16bit": 989.0, "8bit": 1979.0, "tbps": 4.8},
    "NVIDIA_A100_SXM4_80GB": {"16bit": 312.0, "8bit": 624.0, "tbps": 2.04},
    "NVIDIA_A100_SXM4_40GB": {"16bit": 312.0, "8bit": 624.0, "tbps": 1.56},
}


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # normalized, e.g. NVIDIA_H100_80GB_HBM3; "TRITON_INTERPRETER" on the CPU
    capability: tuple[int, int]
    num_sms: int
    smem_per_block: int  # bytes of shared memory one program may use (opt-in maximum)
    l2_bytes: int
    interpreter: bool = False

    @property
    def has_tma(self) -> bool:
        """Hopper (sm_90) and newer have the tensor memory accelerator; the interpreter emulates it."""
        return self.interpreter or self.capability[0] >= 9

    def peak_tflops(self, operand_bits: int) -> float | None:
        spec = self._datasheet()
        return None if spec is None else spec["8bit" if operand_bits <= 8 else "16bit"]

    def peak_tbps(self) -> float | None:
        spec = self._datasheet()
        return None if spec is None else spec["tbps"]

    def _datasheet(self):
        for prefix, spec in _DATASHEET.items():
            if self.name.startswith(prefix):
                return spec
        return None


INTERPRETER_DEVICE = DeviceInfo(
    name="TRITON_INTERPRETER",
    capability=(9, 0),
    num_sms=4,  # small, so that persistent and split-K schedules are exercised by tiny CPU tests
    smem_per_block=232448,
    l2_bytes=1 << 20,
    interpreter=True,
)


# Profiles of known GPUs, for looking at their configs from another machine (`gemmkit configs show
# --device-name`, gemmkit.tools.codegen): what _cuda_device_info reads on them.
KNOWN_DEVICES = {d.name: d for d in (
    DeviceInfo("NVIDIA_H100_80GB_HBM3", (9, 0), 132, 232448, 50 << 20),  # H100 SXM
    DeviceInfo("NVIDIA_H200", (9, 0), 132, 232448, 60 << 20),
)}


def known_device(name: str) -> DeviceInfo:
    """The profile of a known GPU by (normalized or torch's) device name; the interpreter's for
    "TRITON_INTERPRETER"."""
    key = normalize_device_name(name)
    if key == INTERPRETER_DEVICE.name:
        return INTERPRETER_DEVICE
    if key not in KNOWN_DEVICES:
        raise ValueError(f"unknown device {name!r}; known: {', '.join([*KNOWN_DEVICES, INTERPRETER_DEVICE.name])}")
    return KNOWN_DEVICES[key]


@functools.lru_cache(maxsize=None)
def _cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0)
    if not smem:
        from triton.runtime import driver

        smem = driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return DeviceInfo(
        name=normalize_device_name(props.name),
        capability=(props.major, props.minor),
        num_sms=props.multi_processor_count,
        smem_per_block=int(smem),
        l2_bytes=int(getattr(props, "L2_cache_size", 0)),
    )


def device_info(device: torch.device | int | str | None = None) -> DeviceInfo:
    """DeviceInfo of a CUDA device (default: the current one), or the interpreter profile for CPU."""
    if device is None:
        if interpreter_active() or not torch.cuda.is_available():
            return INTERPRETER_DEVICE
        return _cuda_device_info(torch.cuda.current_device())
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        return INTERPRETER_DEVICE
    if not torch.cuda.is_available():
        raise ValueError(f"device_info({str(device)!r}): this torch build or machine has no CUDA device")
    return _cuda_device_info(device.index if device.index is not None else torch.cuda.current_device())
