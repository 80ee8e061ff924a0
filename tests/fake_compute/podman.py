"""A fake instance backed by a podman container: how the local platform plays the cloud's story.

``python -m tests.fake_compute --podman rig-1=rig-1`` serves instance rig-1 whose status follows
the container (running: RUNNING, anything else: TERMINATED); instances.start runs ``podman start``,
instances.stop ``podman stop``, so a client of the Compute API (the gateway's rig-waker) starts a
real local rig.
"""

from __future__ import annotations

import subprocess


class PodmanBacking:
    """One container behind one fake instance (state.Backing)."""

    def __init__(self, container: str, podman: str = "podman") -> None:
        if not container or container.startswith("-"):
            raise ValueError(f"not a container name: {container!r}")
        self.container = container
        self.podman = podman

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.podman, *args], capture_output=True, text=True, check=False, timeout=120)

    def running(self) -> bool:
        """Whether the container runs now (a missing container is not running)."""
        done = self._run("inspect", "--format", "{{.State.Running}}", "--", self.container)
        return done.returncode == 0 and done.stdout.strip() == "true"

    def start(self) -> None:
        """podman start; a failure is raised (the operation then ends in an error)."""
        done = self._run("start", "--", self.container)
        if done.returncode != 0:
            raise RuntimeError(f"podman start {self.container}: {done.stderr.strip()}")

    def stop(self) -> None:
        """podman stop."""
        done = self._run("stop", "--", self.container)
        if done.returncode != 0:
            raise RuntimeError(f"podman stop {self.container}: {done.stderr.strip()}")


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """``INSTANCE=CONTAINER`` arguments -> {instance: container}; anything else is a ValueError."""
    out: dict[str, str] = {}
    for pair in pairs:
        instance, sep, container = pair.partition("=")
        if not sep or not instance or not container:
            raise ValueError(f"--podman takes INSTANCE=CONTAINER, got {pair!r}")
        out[instance] = container
    return out
