"""Does a build fit a rig? Disk, host memory and accelerator memory against the build's size.

Each term is a headroom in bytes (what the rig has minus what the build needs); the build fits
when every headroom is 0 or more, and the smallest one is the binding term.

- disk: free bytes on the filesystem that holds the models directory - the build's size.
- memory: host memory + swap - the build's size - 1 GiB for the runtime (vLLM reads the weights
  through host memory; on the CPU build the KV cache lives there too, so it is subtracted as well).
- accelerator (a GPU rig): total x gpu_memory_utilization - the build's size - 1 GiB (activations
  and the CUDA context); what is left is the KV cache's room. A CPU rig has no such term.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

from rig_mcp.playbooks import ROOT

GIB = 1024**3
RUNTIME_RESERVE_BYTES = GIB


@dataclass
class Term:
    name: str
    have_bytes: int
    need_bytes: int

    @property
    def headroom_bytes(self) -> int:
        return self.have_bytes - self.need_bytes


def _load_rig_flags():
    """The roles' own merge of the flags, the rig_flags filter plugin, loaded from its file.

    plugins/ is Ansible's folder, not a Python package (nor one the project installs), so it is
    loaded by path from the repository this package sits in, as the playbooks are.
    """
    spec = importlib.util.spec_from_file_location(
        "gemma_rig_filter_rig_flags", ROOT / "plugins" / "filter" / "rig_flags.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rig_flags


rig_flags = _load_rig_flags()


def vllm_memory_flags(hostvars: dict) -> tuple[float, int]:
    """gpu-memory-utilization and kv-cache-memory-bytes as the rig's unit gets them.

    The flags are merged by ``rig_flags``, the filter tpu.env and the unit are rendered with;
    vLLM's defaults apply to a flag that is not there: 0.9, and no fixed KV cache size.
    """
    flags = rig_flags(hostvars.get("rig_vllm_flags") or {}, hostvars.get("rig_vllm_host_flags") or {})
    utilization = flags.get("gpu-memory-utilization")
    kv_bytes = flags.get("kv-cache-memory-bytes")
    return float(0.9 if utilization is None else utilization), int(kv_bytes or 0)


def terms(facts: dict, size_bytes: int, gpu_memory_utilization: float, cpu_kv_cache_bytes: int) -> list[Term]:
    """The capacity terms for a build of ``size_bytes`` on a rig whose ``facts`` capacity.yml read."""
    out = [Term("disk", int(facts["disk_free_bytes"]), size_bytes)]
    accelerator = facts.get("accelerator_total_bytes")
    host_need = size_bytes + RUNTIME_RESERVE_BYTES + (0 if accelerator else cpu_kv_cache_bytes)
    out.append(Term("memory", int(facts["mem_total_bytes"]) + int(facts["swap_total_bytes"]), host_need))
    if accelerator:
        usable = int(int(accelerator) * gpu_memory_utilization)
        out.append(Term("accelerator memory", usable, size_bytes + RUNTIME_RESERVE_BYTES))
    return out


def verdict(rig: str, model: str, found: list[Term]) -> dict:
    """The check's result: fits or not, the binding term named, every term's figures."""
    binding = min(found, key=lambda t: t.headroom_bytes)
    fits = binding.headroom_bytes >= 0
    gib = binding.headroom_bytes / GIB
    summary = (
        f"{model} fits {rig}; binding term: {binding.name} ({gib:.2f} GiB to spare)"
        if fits
        else f"{model} does not fit {rig}: {binding.name} is short by {-gib:.2f} GiB"
    )
    return {
        "fits": fits,
        "binding": binding.name,
        "summary": summary,
        "terms": [{**asdict(t), "headroom_bytes": t.headroom_bytes} for t in found],
    }
