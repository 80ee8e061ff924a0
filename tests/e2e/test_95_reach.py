"""The local rig reached from where users stand: a client in another network namespace, not on
loopback. Closed, the rig refuses it; opened (rig_endpoint_open, a range, a key), it answers 401
without the key and 200 with it, and status/query/bench/accuracy all work with the key, which never
shows in their output at -vvv, in --diff or in any process's command line. It runs late, before
test_97_idle and test_99_teardown, and leaves the rig opened: nothing after it depends on a closed rig, and a closed
rig's filter is tested as rendered (tests/unit/test_vllm_unit_filter.py) and at bring-up. The file
starts closed (rig_start); the first test that needs the endpoint opened opens it (the `opened`
fixture, once per file), so each test also runs alone and proves its claim on an opened rig.

The client: a network namespace with one end of a veth pair, 10.231.0.2/30, the host's end
10.231.0.1/30. The rig's container shares the host's network, so its port is on 10.231.0.1. Only
these two addresses, made here, are ever sent to.

systemd in the container does not enforce IPAddressAllow/IPAddressDeny (no unified cgroup hierarchy
here), so what this proves is the bind address and the key; the filter is tested as rendered
(tests/unit/test_vllm_unit_filter.py) and as systemd loaded it (the readiness check, below).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT
from tests.e2e.rig import assert_closed, load_catalog, podman
from tests.secret_watch import CmdlineSampler

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

NS = "gemma-rig-client"
HOST_IF, NS_IF = "grc-host", "grc-client"
HOST_IP, NS_IP, PREFIX = "10.231.0.1", "10.231.0.2", 30
RANGE = "10.231.0.0/30"
KEY = "sk-e2e-reach-0123456789abcdef"
ENV_TOKEN = "tok-e2e-service-0123456789"  # a secret in vLLM's environment (rig_vllm_environment)


def sh(*cmd: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=check, timeout=120)


@pytest.fixture(scope="module")
def client_ns() -> Iterator[str]:
    """A network namespace whose only way out is a veth pair to the host."""
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "link", "del", HOST_IF, check=False)
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF, "netns", NS)
        sh("ip", "addr", "add", f"{HOST_IP}/{PREFIX}", "dev", HOST_IF)
        sh("ip", "link", "set", HOST_IF, "up")
        sh("ip", "-n", NS, "addr", "add", f"{NS_IP}/{PREFIX}", "dev", NS_IF)
        sh("ip", "-n", NS, "link", "set", NS_IF, "up")
        sh("ip", "-n", NS, "link", "set", "lo", "up")
        yield NS
    finally:
        sh("ip", "netns", "del", NS, check=False)  # removes the pair too
        sh("ip", "link", "del", HOST_IF, check=False)


def from_ns(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a bash script inside the client's namespace (curl and bash are the host's)."""
    exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in (env or {}).items())
    return sh("ip", "netns", "exec", NS, "bash", "-c", exports + script, check=False)


def connect(port: int) -> str:
    """What a TCP connect from the client to the host's veth address and ``port`` gets."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('{HOST_IP}', {port}), timeout=10).close(); print('connected')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except OSError as exc: print(type(exc).__name__, exc)\n"
    )
    res = from_ns(f"python3 -c {shlex.quote(probe)}")
    return res.stdout.strip() or res.stderr.strip()


def status_code(path: str = "/v1/models", key: str | None = None, method: str = "GET") -> str:
    """HTTP status of METHOD path from the client; the key goes to curl on stdin, as the docs say.
    A POST carries a chat request (vLLM's /invocations runs one); --path-as-is sends `..` unresolved."""
    header = '-H @- <<< "Authorization: Bearer $K"' if key else ""
    if method == "POST":
        chat = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        header += f" -X POST -H 'Content-Type: application/json' --data {shlex.quote(chat)} --path-as-is"
    res = from_ns(
        f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 60 {header} http://{HOST_IP}:8000{path}",
        {"K": key} if key else None,
    )
    return res.stdout.strip() or res.stderr.strip()


@pytest.fixture(scope="module")
def opened_vars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a user puts in the inventory and vault to open the endpoint, as an extra-vars file."""
    path = tmp_path_factory.mktemp("reach") / "opened.json"
    path.touch(mode=0o600)
    environment = {
        "HF_HOME": "/opt1/cache/huggingface",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": "/opt1/cache/vllm",
        "XDG_CACHE_HOME": "/opt1/cache",
        "TMPDIR": "/opt1/tmp",
        "GEMMA_RIG_E2E_TOKEN": ENV_TOKEN,
    }
    # A user's own rig_vllm_environment keeps the guard's lists (group_vars/all/vllm.yml says so).
    rig = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all" / "rig.yml").read_text())
    environment["GEMMA_RIG_SERVED_PATHS"] = " ".join(rig["rig_served_paths"])
    environment["GEMMA_RIG_OPEN_PATHS"] = " ".join(rig["rig_open_paths"])
    opened = {
        "rig_endpoint_open": True,
        "rig_endpoint_source_ranges": [RANGE],
        "rig_api_key": KEY,
        "rig_vllm_environment": environment,
    }
    path.write_text(json.dumps(opened))
    return path


def watched(playbook: str, *args: str, **kwargs: object) -> tuple[PlaybookRun, CmdlineSampler]:
    """Run a playbook at -vvv while every process's command line is sampled for the secrets."""
    with CmdlineSampler([KEY, ENV_TOKEN]) as sampler:
        run = run_playbook(playbook, "-vvv", *args, **kwargs)  # type: ignore[arg-type]
    return run, sampler


@dataclass
class Opening:
    """site.yml's run that opened the endpoint, and what the secrets watch saw while it ran."""

    run: PlaybookRun
    sampler: CmdlineSampler


@pytest.fixture(scope="module")
def opened(local_rig, opened_vars: Path) -> Opening:
    """The endpoint opened as a user opens it: site.yml with rig_endpoint_open, RANGE and KEY, at
    -vvv and --diff under the secrets watch. Once per file: the file starts closed (rig_start), the
    first test that needs it opened runs this, and the later ones find it done."""
    run, sampler = watched("site.yml", "--diff", "-e", f"@{opened_vars}")
    assert run.rc == 0, run.output[-6000:]
    return Opening(run, sampler)


def unit_allows(container: str) -> list[str]:
    """vllm.service's IPAddressAllow as systemd loaded it, sorted (systemd's own order changed between runs)."""
    shown = podman("exec", container, "systemctl", "show", "vllm", "-p", "IPAddressAllow").stdout
    return sorted(shown.split("=", 1)[1].split())


OPENED_ALLOWS = sorted(["127.0.0.0/8", "::1/128", RANGE])


def loopback_status(port: int) -> str:
    """HTTP status of GET /v1/models on loopback with no key: where the playbooks' requests go."""
    url = f"http://127.0.0.1:{port}/v1/models"
    res = sh("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url, check=False)
    return res.stdout.strip() or res.stderr.strip()


def assert_no_secret(run: PlaybookRun, sampler: CmdlineSampler) -> None:
    for secret in (KEY, ENV_TOKEN):
        where = run.output.find(secret)
        assert where < 0, f"a secret shows in the output: ...{run.output[max(0, where - 400) : where + 100]}"
    assert sampler.hits == [], sampler.hits
    assert sampler.rounds > 10


def test_closed_endpoint_refuses_a_client_in_another_namespace(local_rig, client_ns) -> None:
    assert_closed(local_rig.container)  # as the file starts (rig_start): the opened tests come after
    # Refused (a reset from the host), not unreachable: the packet arrived, nothing listens there.
    assert connect(local_rig.port) == "refused"
    # The same rig answers on loopback: the refusal is the bind address, not a broken rig.
    assert sh("curl", "-sS", f"http://127.0.0.1:{local_rig.port}/v1/models").returncode == 0


def test_opened_endpoint_needs_the_key(local_rig, client_ns, opened: Opening, figure) -> None:
    run, sampler = opened.run, opened.sampler
    figure(
        "site.yml opening the local rig's endpoint", f"{run.seconds:.0f} s, changed={run.total('changed')}"
    )
    assert_no_secret(run, sampler)
    assert "tpu.env: " in run.output and "GEMMA_RIG_E2E_TOKEN" in run.output  # named, never shown
    assert 'echo "Authorization: Bearer $RIG_API_KEY" | curl -s http://127.0.0.1:8000' in run.output
    assert unit_allows(local_rig.container) == OPENED_ALLOWS

    assert status_code() == "401"
    assert status_code(key="sk-wrong-key-0123456789") == "401"
    assert status_code(key=KEY) == "200"
    assert status_code("/health") == "200"  # the guard serves /health without the key
    # vLLM 0.29.0 alone asks for the key on /v1 only: /invocations ran a chat without it. The guard
    # (rig_served_paths) serves the documented paths only, with the key or not.
    for path in ("/invocations", "/tokenize", "/v1/../invocations"):
        assert status_code(path, method="POST") == "404", path
        assert status_code(path, key=KEY, method="POST") == "404", path
    assert status_code("/version", key=KEY) == "404"
    assert status_code("/metrics") == "401" and status_code("/metrics", key=KEY) == "200"


def test_playbooks_work_with_the_key_and_never_show_it(
    local_rig, opened: Opening, opened_vars: Path, tmp_path: Path
) -> None:
    # The playbooks ask on loopback: refused there without the key, so a play that works sent it.
    assert loopback_status(local_rig.port) == "401"
    evars = ("-e", f"@{opened_vars}")
    status, sampler = watched("playbooks/status.yml", *evars)
    assert status.rc == 0, status.output[-6000:]
    assert_no_secret(status, sampler)
    assert f"model: {local_rig.model}" in status.output and "health: ok" in status.output

    query, sampler = watched("playbooks/query.yml", *evars, "-e", "max_tokens=16")
    assert query.rc == 0, query.output[-6000:]
    assert_no_secret(query, sampler)
    assert f"{local_rig.model}: " in query.output and re.search(r"tokens: \d+ in, \d+ out", query.output)

    bench_vars = {
        "bench_input_lens": [64], "bench_concurrency": [1], "bench_output_len": 8, "bench_repeats": 1,
        "bench_decode_runs": 2, "bench_decode_output_len": 8, "bench_decode_input_len": 32,
        "bench_run_id": "reach-e2e", "bench_runs_dir": str(tmp_path / "runs"),
        "bench_fetch_root": str(tmp_path / "fetched"), "bench_update_index": False,
    }  # fmt: skip
    bench, sampler = watched("playbooks/bench.yml", *evars, extra_vars=bench_vars, timeout=1800)
    assert bench.rc == 0, bench.output[-6000:]
    assert_no_secret(bench, sampler)
    assert sampler.saw("--api-key-env-file /etc/gemma-rig/tpu.env")  # the client ran, keyless argv
    rec = json.loads((tmp_path / "runs" / "reach-e2e" / "run.json").read_text())
    assert rec["bench"]["cells"][0]["status"] == "ok" and rec["bench"]["decode"]["status"] == "ok"

    data = tmp_path / "mc-5.jsonl"
    data.write_text(
        "".join((ROOT / "roles/accuracy/files/data/mc-small.jsonl").read_text().splitlines(True)[:5])
    )
    acc_vars = {"accuracy_data": str(data), "accuracy_fetch_root": str(tmp_path / "acc")}
    accuracy, sampler = watched("playbooks/accuracy.yml", *evars, extra_vars=acc_vars, timeout=1800)
    assert accuracy.rc == 0, accuracy.output[-6000:]
    assert_no_secret(accuracy, sampler)
    scores = json.loads((tmp_path / "acc" / f"rig-local-{local_rig.model}.json").read_text())
    assert len(scores["scores"]) == 5


def test_the_docs_curls_as_written(local_rig, client_ns, opened: Opening) -> None:
    """docs/gce.md, "Reach the endpoint": the opened endpoint's commands, run from the client."""
    doc = (ROOT / "docs" / "gce.md").read_text()
    section = doc.split("## Reach the endpoint", 1)[1].split("\n## ", 1)[0]
    opened = section.split("### Opened to listed ranges", 1)[1]  # behind a gateway on gce
    block = opened.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "RIG=INTERNAL_IP" and len(lines) == 4, lines
    env = {"RIG": HOST_IP, "RIG_API_KEY": KEY}
    # The local rig's model, and fewer tokens for the tiny model on 2 cores; nothing else changes.
    outs = []
    for line in lines[1:]:
        cmd = line.replace('"model": "emb4"', f'"model": "{local_rig.model}"').replace(
            '"max_tokens": 512', '"max_tokens": 16'
        )
        res = from_ns(cmd, env)
        assert res.returncode == 0, res
        outs.append(res.stdout)
    assert outs[0].strip() == "401"
    # the build, then its catalog alias (vLLM serves both names)
    assert [m["id"] for m in json.loads(outs[1])["data"]] == [
        local_rig.model,
        load_catalog()[local_rig.model]["alias"],
    ]
    assert json.loads(outs[2])["usage"]["completion_tokens"] > 0


def test_readiness_fails_when_the_unit_filter_disagrees(
    local_rig, opened: Opening, opened_vars: Path
) -> None:
    # The unit admits the opened range before the drop-in: the disagreement below is the drop-in's.
    assert unit_allows(local_rig.container) == OPENED_ALLOWS
    dropin = "/etc/systemd/system/vllm.service.d/50-reach-test.conf"
    podman("exec", local_rig.container, "sh", "-c",
           f"mkdir -p {Path(dropin).parent} && printf '[Service]\\nIPAddressAllow=\\nIPAddressAllow=localhost\\n' > {dropin}"
           " && systemctl daemon-reload")  # fmt: skip
    try:
        run = run_playbook("playbooks/smoke.yml", "-e", f"@{opened_vars}")
    finally:
        podman("exec", local_rig.container, "sh", "-c", f"rm -f {dropin} && systemctl daemon-reload")
    assert run.rc != 0
    flat = " ".join(run.output.split())
    assert (
        "vllm.service admits [127.0.0.0/8 ::1/128] (deny [0.0.0.0/0 ::/0]) but the endpoint is open to "
        f"{RANGE}, which means allow [10.231.0.0/30 127.0.0.0/8 ::1/128]"
    ) in flat, run.output[-3000:]
    assert KEY not in run.output
