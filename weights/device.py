"""Which device a `--device auto|cpu|cuda` setting means, the same way for every role and bench.

`auto` is the GPU where torch sees one, else the CPU (a generator, the GRPO trainer, pass@k and the benches
all choose so); `cuda` where torch sees none is refused with what to do, never silently run on the CPU (a
bench that measured the CPU on a GPU box reported CPU numbers as the GPU's). torch is imported when asked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEVICES = ("auto", "cpu", "cuda")


class NoDevice(RuntimeError):
    """The device asked for is not here; the message says what to do."""


def resolve(asked: str, flag: str = "--device") -> str:
    """ "cpu" or "cuda" for `asked` (auto, cpu, cuda); `flag` names the setting in the refusal."""
    import torch

    if asked not in DEVICES:
        raise NoDevice(f"{flag} {asked!r}: use one of {', '.join(DEVICES)}")
    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise NoDevice(
            f"{flag} cuda, but torch {torch.__version__} ({built}) sees no CUDA device here; use "
            f"{flag} cpu, or auto to take a GPU when there is one"
        )
    return asked


def describe(device: str) -> dict[str, Any]:
    """What a result measured on `device` should say about it: the device, the GPU's name and memory, torch
    and CUDA versions, or the CPU's threads."""
    import torch

    out: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        out.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            gpus=torch.cuda.device_count(),
        )
    else:
        out.update(cpu_threads=torch.get_num_threads(), cpus=os.cpu_count())
    return out


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether /proc/cpuinfo's flags (x86: avx512_bf16, amx_bf16; Arm: bf16) say the CPU computes in bf16."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: nothing known, fp32
            return False
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
