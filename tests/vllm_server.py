"""Start vLLM's CPU build from this interpreter on a model directory, the local rig's way; yield its URL.

Shared by the tests that need a real server on the controller (tests/repack/test_vllm.py, the
evidence tests). The flags and environment are the local platform profile's, read from
inventory/group_vars/local.yml; prefix caching is off so benchmark repeats cannot hit it. ``dtype``
replaces the profile's where a test needs another datapath (float16, the T4's). ``RIG_TEST_PORTS=LOW-HIGH`` keeps the servers' ports in a range
(for runs that share the host with another test run); otherwise the OS picks a free port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import yaml

from repack.make_tiny_qat import build as build_qat
from repack.pipeline import run as run_steps
from repack.steps import STEPS

START_TIMEOUT_S = 900  # a loaded 2-core CI box takes minutes to start vLLM
LOCAL_PROFILE = Path(__file__).resolve().parents[1] / "inventory" / "group_vars" / "local.yml"


def _profile() -> dict:
    return yaml.safe_load(LOCAL_PROFILE.read_text())


def flag_argv(flags: dict) -> list[str]:
    """vLLM's argv for a profile's flags, as the rig's unit passes them: a value follows its flag, a
    switch (true) stands alone, a mapping is JSON, null and false leave the flag out."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        argv.append(f"--{key}")
        if value is not True:
            argv.append(json.dumps(value) if isinstance(value, dict) else str(value))
    return argv


RIG_DTYPE = _profile()["rig_vllm_flags"]["dtype"]
# The local profile's flags but dtype (a test may serve another datapath: float16, the T4's), and no
# prefix caching, so benchmark repeats cannot hit it.
RIG_FLAGS = (
    *flag_argv({k: v for k, v in _profile()["rig_vllm_flags"].items() if k != "dtype"}),
    "--no-enable-prefix-caching",
)
# The profile's environment for vLLM (one process fewer at every start).
RIG_ENV = {k: str(v) for k, v in _profile().get("rig_vllm_profile_environment", {}).items()}


# The API server's pid for each URL `serve` yields, while it serves.
SERVER_PIDS: dict[str, int] = {}


def engine_forked(server_pid: int) -> bool:
    """Whether the server's engine process is a fork of it, not a spawned interpreter: a fork
    shares the parent's auxiliary vector (set at exec, randomized by ASLR at each one), and a
    spawn also leaves multiprocessing's resource tracker beside it."""
    children = [
        int(pid) for pid in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    ]
    engines = [pid for pid in children if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::EngineCor")]
    if len(engines) != 1:
        raise AssertionError(f"server {server_pid}: engine processes {engines} among children {children}")
    parent = Path(f"/proc/{server_pid}/auxv").read_bytes()
    return children == engines and Path(f"/proc/{engines[0]}/auxv").read_bytes() == parent


def free_port() -> int:
    """A port nothing listens on: from ``RIG_TEST_PORTS`` when set, else one the OS picks."""
    span = os.environ.get("RIG_TEST_PORTS")
    candidates = range(int(span.split("-")[0]), int(span.split("-")[1]) + 1) if span else [0]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in RIG_TEST_PORTS={span}")


def tiny_build(root: Path, seed: int, target: str = "text", train: bool = True) -> Path:
    """The rig's tiny model (repack/make_tiny_qat.py, ``seed``; untrained with ``train=False``)
    converted to ``target``; returns its dir."""
    qat = root / f"qat-{seed}"
    out = root / f"{target}-{seed}"
    build_qat(qat, seed=seed, with_shared_kv=False, force=False, train=train)
    run_steps(qat, out, STEPS[target], quiet=True)
    return out


def _served_name(url: str, key: str = "") -> str | None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url + "/v1/models", headers=headers), timeout=5
        ) as r:
            return json.loads(r.read())["data"][0]["id"]
    except OSError:
        return None


@contextlib.contextmanager
def serve(
    model: Path,
    name: str,
    log: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = START_TIMEOUT_S,
    dtype: str = RIG_DTYPE,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Serve ``model`` as ``name`` until the block ends; yield ``http://127.0.0.1:PORT``.

    vLLM's output goes to ``log`` so tests can read the real start-up lines. Ready means
    /v1/models lists ``name``; an early exit or a timeout raises with the log's tail. ``env`` adds
    to the profile's environment (asked with its VLLM_API_KEY, when it sets one).
    """
    env = {**RIG_ENV, **(env or {})}
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, *RIG_FLAGS,
        *extra_args,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env}
        )
    try:
        deadline = time.monotonic() + timeout
        while _served_name(url, env.get("VLLM_API_KEY", "")) != name:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not ready after {timeout:.0f} s:\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        SERVER_PIDS[url] = proc.pid
        yield url
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM died while in use:\n{log.read_text()[-4000:]}")
    finally:
        SERVER_PIDS.pop(url, None)
        # The server's whole process group: the API server and its engine core.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
