"""What the fake knows of the world: machine types, GPUs, images, disk types, networks.

Figures follow Compute Engine's public reference (docs/gce.md says which, in the project's words):
N1 predefined types have 3.75 GB (standard), 6.5 GB (highmem) or 0.9 GB (highcpu) per vCPU; GPUs
attach only to N1 types other than the shared-core f1-micro and g1-small; a T4 VM takes 1, 2 or 4
T4s, with at most 48 vCPUs and 312 GB for 1 or 2 and 96 vCPUs and 624 GB for 4.
"""

from __future__ import annotations

import re

N1_SIZES = {
    "standard": (1, 2, 4, 8, 16, 32, 64, 96),
    "highmem": (2, 4, 8, 16, 32, 64, 96),
    "highcpu": (2, 4, 8, 16, 32, 64, 96),
}
N1_GB_PER_CPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
# Other families the fake accepts, with (vCPUs, GB); GPUs never attach to them.
OTHER_TYPES = {
    "f1-micro": (1, 0.6),
    "g1-small": (1, 1.7),
    "e2-small": (2, 2.0),
    "e2-medium": (2, 4.0),
    "e2-standard-2": (2, 8.0),
    "e2-standard-4": (4, 16.0),
}
# accelerator type -> {count: (max vCPUs, max GB)} on N1 (T4 only: the rig's GPU).
N1_GPU_LIMITS = {"nvidia-tesla-t4": {1: (48, 312.0), 2: (48, 312.0), 4: (96, 624.0)}}
# GPU types the fake's zones offer (other real types exist; the fake does not know their limits).
ACCELERATOR_TYPES = frozenset(N1_GPU_LIMITS)

DISK_TYPES = frozenset({"pd-standard", "pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced"})
MIN_DISK_GB = 10  # AttachedDiskInitializeParams.diskSizeGb: "must be at least 10 GB"
MAX_DISK_GB = 65536  # a Persistent Disk volume is at most 64 TiB
DEFAULT_EMPTY_DISK_GB = 500  # no sourceImage and no size: 500 GB, per the same reference

# project -> {family: (image name, size GB, license)}
IMAGES = {
    "debian-cloud": {
        "debian-13": ("debian-13-trixie-v20261110", 10, "debian-13-trixie"),
        "debian-12": ("debian-12-bookworm-v20261110", 10, "debian-12-bookworm"),
    }
}

_CUSTOM = re.compile(r"^(?:n1-)?custom-(\d+)-(\d+)(?:-ext)?$")


def machine_shape(name: str) -> tuple[str, int, float] | None:
    """(family, vCPUs, memory GB) of a machine type name, None when the fake does not know it."""
    match = re.fullmatch(r"n1-(standard|highmem|highcpu)-(\d+)", name)
    if match and int(match.group(2)) in N1_SIZES[match.group(1)]:
        cpus = int(match.group(2))
        return "n1", cpus, cpus * N1_GB_PER_CPU[match.group(1)]
    match = _CUSTOM.match(name)
    if match:
        return "n1", int(match.group(1)), int(match.group(2)) / 1024
    if name in OTHER_TYPES:
        cpus, memory = OTHER_TYPES[name]
        return name.split("-")[0], cpus, memory
    return None


def image(source: str) -> tuple[str, str, int, str] | None:
    """(project, image name, size GB, license) for a sourceImage URL, None if unknown."""
    match = re.search(r"projects/([^/]+)/global/images/(family/)?([^/]+)$", source)
    if not match:
        return None
    project, is_family, name = match.groups()
    families = IMAGES.get(project, {})
    if is_family:
        if name not in families:
            return None
        image_name, size, license_ = families[name]
        return project, image_name, size, license_
    for image_name, size, license_ in families.values():
        if image_name == name:
            return project, image_name, size, license_
    return None
