"""What this CPU computes natively, from the flags line of /proc/cpuinfo (empty off Linux)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def cpu_flags() -> str:
    """The flags line of /proc/cpuinfo, or "" where there is none (not Linux: nothing assumed native)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def has_any(names: tuple[str, ...], flags: str | None = None) -> bool:
    """Whether ``flags`` (default: this CPU's) name any of ``names``."""
    return any(name in (cpu_flags() if flags is None else flags).split() for name in names)


# int8 dot products in hardware (VNNI, AMX): without them torch._int_mm on a CPU is several times slower
# than a float32 product (a 2-core AVX2 AMD EPYC: the detector's memory search took 11.7 s per 400x300
# image in int8 against 1.6-1.8 s in float32)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# bf16 arithmetic in hardware; elsewhere bf16 is emulated (OAG in bf16 ran several times slower than fp32
# on a 2-core AVX2 CPU)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
