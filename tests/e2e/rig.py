"""Talk to a local rig from the tests: its endpoint and its container."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conftest import ROOT


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


def ask_facts(port: int, model: str) -> dict[str, str]:
    """Ask a rig every fact of the tiny model's set (repack/tiny_facts.py) with greedy decoding,
    all at once (vLLM batches them); return {question: answer as served}."""
    from concurrent.futures import ThreadPoolExecutor

    from repack.tiny_facts import FACTS

    def ask(question: str) -> str:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 16,
            "temperature": 0.0,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.load(response)["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, [f.question for f in FACTS]))
    return {f.question: a for f, a in zip(FACTS, answers, strict=True)}


def fact_misses(port: int, model: str) -> list[str]:
    """The facts a rig's model gets wrong, each as 'question: served answer != right answer'.

    The bf16 source answers every fact exactly (tests/unit/test_tiny_trained.py), so a lossless
    build must too: the same tokens, hence the same text.
    """
    from repack.tiny_facts import FACTS

    answers = ask_facts(port, model)
    return [
        f"{f.question} {answers[f.question]!r} != {f.answer!r}"
        for f in FACTS
        if answers[f.question] != f.answer
    ]


# The share of the tiny model's facts each build must answer exactly as the bf16 source does:
# every one for the lossless int4 build, 90% for W8A8 (int8 rounds the grid's values).
FACTS_NEEDED = {"tiny-emb4": 1.0, "tiny-w8a8": 0.9}


def assert_knows_the_facts(port: int, model: str, figure) -> None:
    """The served build answers the fact set (greedy) as its rule says; misses are listed."""
    from repack.tiny_facts import FACTS

    misses = fact_misses(port, model)
    right = len(FACTS) - len(misses)
    figure(f"{model} served: facts answered exactly", f"{right}/{len(FACTS)}")
    assert right >= FACTS_NEEDED[model] * len(FACTS), f"{model} missed {len(misses)}: {misses}"


def swap_downtime(output: str) -> float:
    """The downtime swap.yml reports (its last 'downtime N s'), from a playbook's output."""
    found = re.findall(r"downtime ([0-9.]+) s", output)
    assert found, output[-4000:]
    return float(found[-1])


def served_models(port: int) -> list[str]:
    """The model ids /v1/models lists: the build's catalog key, then its alias if it has one."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
        return [entry["id"] for entry in json.load(response)["data"]]


def served_build(port: int) -> str:
    """The catalog key of the build a rig serves (the first name /v1/models lists)."""
    served = served_models(port)
    assert served, f"port {port}: /v1/models lists no model"
    return served[0]


def wait_listed(port: int, timeout: float = 600) -> str:
    """The build vLLM on ``port`` serves, once /v1/models answers (a unit just started loads its
    model first; ``timeout`` is a bound for two busy cores, not a measured figure)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return served_build(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    """Run podman (the tests' environment carries CONTAINERS_CONF)."""
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False)


def unit_started_at(container: str) -> str:
    """When the vllm unit last entered the active state, as systemd reports it."""
    result = podman(
        "exec", container, "systemctl", "show", "vllm", "--property=ActiveEnterTimestampMonotonic"
    )
    return result.stdout.strip()


# The containers the e2e inventories name (inventory/local.yml, tests/e2e/fleet.yml and the
# gateway's inventory/gateway-local.yml). Other rigs on the same host (a developer's own, under
# another name) are neither removed nor counted.
E2E_CONTAINERS = ("gemma-rig", "gemma-rig-b", "gemma-gateway")


def rig_containers() -> list[str]:
    """Names of the e2e inventories' containers, running or not, that the rig playbooks made."""
    result = podman("ps", "-a", "--filter", "label=gemma-rig=true", "--format", "{{.Names}}")
    return [name for name in result.stdout.split() if name in E2E_CONTAINERS]


# --- what a rig serves, checked at the source -----------------------------------------------------

MODELS_DIR = "/opt1/models"  # rig_models_dir (inventory/group_vars/all/rig.yml)
CURRENT = f"{MODELS_DIR}/current"  # the link vLLM loads (RIG_MODEL in tpu.env)
ENV_FILE = "/etc/gemma-rig/tpu.env"
CATALOG = ROOT / "inventory" / "group_vars" / "all" / "models.yml"

# What vLLM 0.29 logs, for each catalog build (`source.target` of a repack entry), in the start
# that loaded it: the engine config line's `quantization=` (the checkpoint's quant_method) and the
# compressed-tensors schemes it picked for the linear layers ("Using <kernel> for <scheme>" or
# "Selected <kernel> for <scheme>"). The repack role writes every build as compressed-tensors, so
# `quantization=` alone cannot tell them apart; the scheme can: int4 weight-only groups (emb4,
# text, w4a16) load as CompressedTensorsWNA16, int8 weights with dynamic per-token int8
# activations (w8a8) as CompressedTensorsW8A8Int8. emb4, text and w4a16 log the same (they differ
# in the embeddings and the towers, which vLLM does not log a scheme for): the checkpoint's
# manifest, checked beside this, tells them apart.
LOGGED_QUANTIZATION: dict[str, tuple[str, frozenset[str]]] = {
    "emb4": ("compressed-tensors", frozenset({"CompressedTensorsWNA16"})),
    "text": ("compressed-tensors", frozenset({"CompressedTensorsWNA16"})),
    "w4a16": ("compressed-tensors", frozenset({"CompressedTensorsWNA16"})),
    "w8a8": ("compressed-tensors", frozenset({"CompressedTensorsW8A8Int8"})),
}
ENGINE_LINE = "Initializing a V1 LLM engine"
SCHEME = re.compile(r"\b(?:Using|Selected) \w+ for (CompressedTensors\w+)")


@dataclass(frozen=True)
class Serving:
    """What a rig serves, each part read where it is decided (see assert_serving)."""

    key: str  # the name /v1/models lists
    target: str  # where `current` points
    version: str  # the checkpoint's version: the short hash of its MANIFEST.sha256
    quantization: str  # `quantization=` in this start's engine config line
    schemes: frozenset[str]  # the compressed-tensors schemes this start loaded
    invocation: str  # the unit's InvocationID: the start all of the above was read from


def rig_sh(container: str, script: str) -> str:
    """Run a shell script in a rig's container; fail on a non-zero exit."""
    result = podman("exec", container, "sh", "-c", script)
    assert result.returncode == 0, f"{script!r} on {container}: {result.stderr or result.stdout}"
    return result.stdout


def load_catalog(path: Path = CATALOG) -> dict[str, dict]:
    """The model catalog (rig_models) of a catalog file: the inventory's, or a test's copy."""
    return yaml.safe_load(path.read_text())["rig_models"]


def controller_checkpoint(key: str, entry: dict) -> Path:
    """Where the controller keeps the checkpoint of a catalog entry (checkpoint_source_dir)."""
    source = entry["source"]
    if source["kind"] == "dir":
        return Path(source["path"])
    assert source["kind"] == "repack", f"{key}: a {source['kind']} entry has no controller checkpoint"
    return ROOT / "build" / "models" / key


def manifest_version(text: str) -> str:
    """A checkpoint's version: the first 12 hex digits of its MANIFEST.sha256's sha256 (written out
    here, not imported from the checkpoint role, so that a change there shows as a mismatch)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def assert_serving(
    container: str, port: int, key: str, *, catalog: dict[str, dict] | None = None, build: str | None = None
) -> Serving:
    """Fail unless the rig in ``container`` (vLLM on ``port``) serves the catalog build ``key``.

    Checked where each part is decided, not from the inventory: the name vLLM lists; the unit is
    active; `current` points at ``<models>/<key>-<version>``, the directory holds the manifest
    whose hash is that version, that manifest is the controller's for ``key`` and the directory's
    files match it; and the quantization vLLM logged for this start of the unit (this invocation's
    journal only) is the one ``key``'s build loads as (LOGGED_QUANTIZATION). ``build`` names the
    build for a `dir` entry (the catalog says only where its files are).
    """
    catalog = load_catalog() if catalog is None else catalog
    assert key in catalog, f"{key} is not in the catalog: {sorted(catalog)}"
    build = build or catalog[key]["source"].get("target")
    assert build in LOGGED_QUANTIZATION, f"{key}: no logged quantization known for build {build!r}"

    names = [key] + ([catalog[key]["alias"]] if catalog[key].get("alias") else [])
    assert served_models(port) == names, f"{container} lists {served_models(port)}, expected {names}"
    state = rig_sh(container, "systemctl show vllm -p ActiveState --value").strip()
    assert state == "active", f"{container}: vllm.service is {state}"

    target = rig_sh(container, f"readlink {CURRENT}").strip()
    rig_manifest = rig_sh(container, f"cat {target}/MANIFEST.sha256")
    version = manifest_version(rig_manifest)
    assert target == f"{MODELS_DIR}/{key}-{version}", (
        f"{container}: {CURRENT} -> {target}, expected {MODELS_DIR}/{key}-{version} (the hash of its manifest)"
    )
    ours = (controller_checkpoint(key, catalog[key]) / "MANIFEST.sha256").read_text()
    assert rig_manifest == ours, f"{container}: {target}'s manifest is not the controller's for {key}"
    rig_sh(container, f"cd {target} && sha256sum --check --quiet --strict MANIFEST.sha256")

    invocation = rig_sh(container, "systemctl show vllm -p InvocationID --value").strip()
    assert invocation, f"{container}: vllm.service has no InvocationID"
    journal = rig_sh(container, f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    engine = [line for line in journal.splitlines() if ENGINE_LINE in line]
    assert len(engine) == 1, f"{container}: {len(engine)} engine config lines in this start's journal"
    found = re.search(r"\bquantization=([^,\s]+),", engine[0])
    assert found, engine[0]
    assert f"served_model_name={key}," in engine[0], engine[0]
    logged = (found[1], frozenset(SCHEME.findall(journal)))
    assert logged == LOGGED_QUANTIZATION[build], (
        f"{container} serving {key} ({build}): vLLM logged quantization={logged[0]}, schemes "
        f"{sorted(logged[1])} in this start; {build} loads as {LOGGED_QUANTIZATION[build][0]}, "
        f"{sorted(LOGGED_QUANTIZATION[build][1])}"
    )
    return Serving(key, target, version, logged[0], logged[1], invocation)


def assert_closed(container: str) -> None:
    """The rig's endpoint as site.yml leaves it by default: bound to loopback, no API key."""
    env = rig_sh(container, f"cat {ENV_FILE}").splitlines()
    assert "RIG_HOST=127.0.0.1" in env, f"{container}: the endpoint is not bound to loopback"
    assert not any(line.startswith("VLLM_API_KEY=") for line in env), f"{container}: tpu.env holds an API key"
