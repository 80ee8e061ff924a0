"""vLLM general plugin: the CPU build's engine process by fork, when GEMMA_RIG_ENGINE_START=fork."""

from __future__ import annotations

import logging
import os

__all__ = ["ENV", "register"]
__version__ = "1.0.0"

ENV = "GEMMA_RIG_ENGINE_START"
_MARK = "_rig_fork_engine"
log = logging.getLogger(__name__)


def register() -> bool:
    """Entry point (``vllm.general_plugins``): wrap the CPU platform's config step.

    Returns True when the wrap is in place (made now or before), False when it was not asked for
    or this vLLM's CPU platform is not the one the plugin was written for.
    """
    if os.environ.get(ENV) != "fork":
        return False
    from vllm.platforms.cpu import CpuPlatform

    current = CpuPlatform.__dict__.get("check_and_update_config")
    if getattr(getattr(current, "__func__", None), _MARK, False):
        return True
    if not isinstance(current, classmethod):
        log.warning(
            "vllm_cpu_fork_engine: CpuPlatform.check_and_update_config is not a classmethod; not wrapping"
        )
        return False
    configure = current.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        configure(cls, vllm_config)
        # The platform just forced spawn; the engine process is the only one it starts here
        # (distributed-executor-backend uni), and it is safe to fork.
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    setattr(check_and_update_config, _MARK, True)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    log.info("vllm_cpu_fork_engine: the engine process starts by fork (%s=fork)", ENV)
    return True
