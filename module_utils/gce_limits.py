"""Check the module's numbers before any request: disk sizes, GPU counts, timeouts.

The figures are Compute Engine's published limits (docs/gce.md, "Numbers checked before any
request"): a disk created with the VM is at least 10 GB and a Persistent Disk at most 64 TiB;
GPUs attach to N1 machine types only, not to the shared-core f1-micro and g1-small; a T4 VM takes
1, 2 or 4 T4s, with at most 48 vCPUs and 312 GB of memory for 1 or 2 T4s and 96 vCPUs and 624 GB
for 4. Limits of other GPU types are left to the API.
"""

from __future__ import annotations

import re
from typing import Any

MIN_DISK_GB = 10
MAX_DISK_GB = 65536
N1_GB_PER_CPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
# accelerator type -> {count: (max vCPUs, max memory GB)} on N1 machine types.
N1_GPU_LIMITS: dict[str, dict[int, tuple[int, float]]] = {
    "nvidia-tesla-t4": {1: (48, 312.0), 2: (48, 312.0), 4: (96, 624.0)},
}
_PREDEFINED = re.compile(r"^n1-(standard|highmem|highcpu)-(\d+)$")
_CUSTOM = re.compile(r"^(?:n1-)?custom-(\d+)-(\d+)(?:-ext)?$")


def n1_shape(machine_type: str) -> tuple[int, float] | None:
    """(vCPUs, memory GB) of an N1 machine type (predefined or custom), None for any other family."""
    match = _PREDEFINED.match(machine_type)
    if match:
        cpus = int(match.group(2))
        return cpus, cpus * N1_GB_PER_CPU[match.group(1)]
    match = _CUSTOM.match(machine_type)
    if match:
        return int(match.group(1)), int(match.group(2)) / 1024
    return None


def _disk(name: str, size: Any) -> str | None:
    if size is None:
        return None
    if size < MIN_DISK_GB:
        return f"{name}={size} is too small: a disk is at least {MIN_DISK_GB} GB"
    if size > MAX_DISK_GB:
        return f"{name}={size} is too big: a Persistent Disk is at most {MAX_DISK_GB} GB (64 TiB)"
    return None


def gpu_problem(machine_type: str, gpu_type: str, count: int) -> str | None:
    if count < 0:
        return f"accelerator_count={count} is negative: give 0 for no GPU, or the number of GPUs"
    if count == 0:
        return None
    if machine_type in ("f1-micro", "g1-small"):
        return f"accelerator_count={count}: the shared-core machine_type={machine_type} takes no GPU"
    limits = N1_GPU_LIMITS.get(gpu_type)
    if limits is None:
        return None  # a GPU type whose limits the module does not know: the API decides
    allowed = ", ".join(str(n) for n in sorted(limits))
    if count not in limits:
        return f"accelerator_count={count} is not allowed for {gpu_type}: an N1 VM takes {allowed} of them"
    shape = n1_shape(machine_type)
    if shape is None:
        return (
            f"machine_type={machine_type} takes no {gpu_type}: {gpu_type} attaches to N1 machine types only"
        )
    cpus, memory = shape
    max_cpus, max_gb = limits[count]
    if cpus > max_cpus or memory > max_gb:
        fits = [n for n in sorted(limits) if cpus <= limits[n][0] and memory <= limits[n][1]]
        hint = f"use accelerator_count={fits[0]}" if fits else "use a smaller machine type"
        return (
            f"accelerator_count={count} is too few for machine_type={machine_type} ({cpus} vCPUs, "
            f"{memory:g} GB): {count} x {gpu_type} allows at most {max_cpus} vCPUs and {max_gb:g} GB; {hint}"
        )
    return None


def check(params: dict[str, Any]) -> str | None:
    """The first problem with the module's numbers, as a one-line message naming the parameter."""
    for name, value in (
        ("operation_timeout", params.get("operation_timeout")),
        ("retry_deadline", params.get("retry_deadline")),
        ("retry_initial_delay", params.get("retry_initial_delay")),
    ):
        if value is not None and value <= 0:
            return f"{name}={value} must be greater than 0 (seconds)"
    problems = [
        _disk("boot_disk.size_gb", (params.get("boot_disk") or {}).get("size_gb")),
        _disk("data_disk.size_gb", (params.get("data_disk") or {}).get("size_gb")),
        gpu_problem(params["machine_type"], params["accelerator_type"], params.get("accelerator_count") or 0),
    ]
    return next((p for p in problems if p), None)
