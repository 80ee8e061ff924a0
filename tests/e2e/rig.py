"""Talk to a local rig from the tests: its endpoint and its container."""

from __future__ import annotations

import json
import subprocess
import urllib.request


def chat(
    port: int, model: str, prompt: str = "Say hello.", max_tokens: int = 32, timeout: float = 120
) -> dict:
    """Send one chat completion to a rig's endpoint and return the decoded response."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def served_models(port: int) -> list[str]:
    """The model ids /v1/models lists."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
        return [entry["id"] for entry in json.load(response)["data"]]


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    """Run podman (the tests' environment carries CONTAINERS_CONF)."""
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False)


def unit_started_at(container: str) -> str:
    """When the vllm unit last entered the active state, as systemd reports it."""
    result = podman(
        "exec", container, "systemctl", "show", "vllm", "--property=ActiveEnterTimestampMonotonic"
    )
    return result.stdout.strip()


# The containers the e2e inventories name (inventory/local.yml and tests/e2e/fleet.yml). Other
# rigs on the same host (a developer's own, under another name) are neither removed nor counted.
E2E_CONTAINERS = ("gemma-rig", "gemma-rig-b")


def rig_containers() -> list[str]:
    """Names of the e2e inventories' containers, running or not, that the rig playbooks made."""
    result = podman("ps", "-a", "--filter", "label=gemma-rig=true", "--format", "{{.Names}}")
    return [name for name in result.stdout.split() if name in E2E_CONTAINERS]
