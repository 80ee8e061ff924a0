"""Free and total space of the rig's data directory and of /, read at each scrape of /metrics.

The data directory is ``GEMMA_RIG_DATA_DIR`` when set, else the parent of ``HOME``: the rig's unit
(roles/vllm_service) sets ``HOME=<data dir>/home``. A path that cannot be read (gone, no
permission) is left out of that scrape, never an error in /metrics.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DATA_DIR_ENV = "GEMMA_RIG_DATA_DIR"


def watched_paths() -> list[str]:
    """The data directory (when known) and /, each once."""
    data = os.environ.get(DATA_DIR_ENV, "")
    home = os.environ.get("HOME", "")
    if not data and os.path.isabs(home):
        data = os.path.dirname(os.path.normpath(home))
    paths = [os.path.normpath(data)] if os.path.isabs(data) else []
    return list(dict.fromkeys([*paths, "/"]))


class FilesystemCollector(Collector):
    """gemma_rig_filesystem_{avail,size}_bytes{path} from os.statvfs at scrape time."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        avail = GaugeMetricFamily(
            "gemma_rig_filesystem_avail_bytes",
            "Bytes free to an unprivileged user on the filesystem holding path.",
            labels=["path"],
        )
        size = GaugeMetricFamily(
            "gemma_rig_filesystem_size_bytes",
            "Size in bytes of the filesystem holding path.",
            labels=["path"],
        )
        for path in self.paths:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            avail.add_metric([path], st.f_bavail * st.f_frsize)
            size.add_metric([path], st.f_blocks * st.f_frsize)
        yield avail
        yield size


_registered: FilesystemCollector | None = None


def register() -> FilesystemCollector:
    """Register the collector in the default registry once per process (the guard may be built again)."""
    global _registered
    if _registered is None:
        _registered = FilesystemCollector(watched_paths())
        REGISTRY.register(_registered)
    return _registered
