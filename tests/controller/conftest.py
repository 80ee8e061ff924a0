"""Two real vLLM CPU servers on the controller, started once for the accuracy and bench tests.

Two random tiny models (evidence/_tiny.py, seeds 3 and 4): the same architecture, different
weights, which is what the accuracy tool's paired comparison needs, and greedy output that streams
as text, which is what the bench client counts (the rig's tiny model, untrained, greedily emits
special tokens, which stream as no text). The bench reads the first server's log file.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from evidence import _tiny
from tests.vllm_server import serve


@dataclass(frozen=True)
class Served:
    """One server: its URL and port, the model it serves (name and directory) and its log."""

    url: str
    name: str
    model: Path
    log: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@pytest.fixture(scope="package")
def servers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Served, Served]:
    root = tmp_path_factory.mktemp("controller-vllm")
    with ExitStack() as stack:
        served = []
        for name, seed in (("tiny-a", 3), ("tiny-b", 4)):
            model = _tiny.build(root / name, seed=seed)
            log = root / f"{name}.log"
            served.append(Served(stack.enter_context(serve(model, name, log)), name, model, log))
        yield tuple(served)
