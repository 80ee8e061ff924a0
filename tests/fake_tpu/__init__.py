"""A local, stateful fake of the Cloud TPU REST API for tests (see state.py and server.py)."""

from tests.fake_tpu.server import FakeTpuServer
from tests.fake_tpu.state import FakeTpu, Faults

__all__ = ["FakeTpu", "FakeTpuServer", "Faults"]
