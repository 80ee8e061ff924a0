"""A local, stateful fake of the Compute Engine REST API for tests (see server.py)."""

from tests.fake_compute.server import FakeComputeServer
from tests.fake_compute.state import FakeCompute, Faults

__all__ = ["FakeCompute", "FakeComputeServer", "Faults"]
