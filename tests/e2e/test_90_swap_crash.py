"""A controller killed in the middle of a swap leaves a rig that serves a verified model.

On the session's shared rig (rig-local) (a second rig of its own cost a whole bring-up); it swaps
tiny-emb4 back at the end, so the next file starts from the state it declares.
The controller is killed (SIGKILL to ansible-playbook and every process under it, as a dead laptop
would) at each phase of a swap: while pushing, right after the switch, while vLLM restarts. Each
kill point waits for a marker on the rig (the swap journal's phase, the staged file's size), never a
sleep. After each kill, one start of vLLM serves a verified model: a `systemctl restart` after the
kills while pushing and while vLLM restarts, a reboot of the container after the kill right after
the switch (the kill while pushing is rebooted too, after its restart). Then the next swap.yml says
what it found and resolves it.

The models are two copies of the tiny build under their own keys (`dir` catalog entries), one
with 40 MiB of padding so that a push can be caught mid-file (rsync --bwlimit).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.e2e.rig import assert_serving, chat, load_catalog, podman, served_models, unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

CONTAINER = "gemma-rig"
PORT = 8000
INVENTORY: tuple[str, ...] = ()  # the default inventory: rig-local alone
OLD = "tiny-emb4"  # what site.yml serves
NEW = "crash-b"  # the same weights under another key, with padding
PADDING = 40 * 1024 * 1024
SERVE_TIMEOUT = 900  # bound on waits for vLLM (2 busy cores), not a measured figure


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The catalog plus `crash-b`: the tiny emb4 build copied, with a 40 MiB padding file."""
    base = tmp_path_factory.mktemp("swap-crash")
    new = base / NEW
    shutil.copytree(ROOT / "build" / "models" / OLD, new, ignore=shutil.ignore_patterns("MANIFEST.sha256"))
    (new / "padding.dat").write_bytes(os.urandom(PADDING))
    models = yaml.safe_load((ROOT / "inventory/group_vars/all/models.yml").read_text())["rig_models"]
    models[NEW] = {
        "description": "tiny-emb4 under another key, with 40 MiB of padding (crash tests)",
        "source": {"kind": "dir", "path": str(new)},
        "vllm_args": models[OLD].get("vllm_args", []),
        "size_bytes": PADDING,
    }
    path = base / "catalog.yml"
    path.write_text(yaml.safe_dump({"rig_models": models}))
    return path


@pytest.fixture(scope="module")
def rig(catalog: Path, local_rig):
    """The shared rig serving tiny-emb4 (conftest.rig_start checked it); put back at the end, so
    the next file starts from it too."""
    assert local_rig.model == OLD
    yield catalog
    run = swap(OLD, catalog)
    assert run.rc == 0, run.output[-6000:]
    serves(catalog, OLD)


# --- the rig --------------------------------------------------------------------------------------


def rig_sh(script: str) -> str:
    result = podman("exec", CONTAINER, "sh", "-c", script)
    return result.stdout


def journal() -> dict:
    text = rig_sh("cat /var/lib/gemma-rig/swap.json 2>/dev/null")
    return json.loads(text) if text.strip() else {}


def wait_for(what: str, probe: Callable[[], object], timeout: float = SERVE_TIMEOUT) -> object:
    """Poll ``probe`` until it returns something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (OSError, ValueError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting for {what} after {timeout:.0f} s; journal: {journal()}")


# The build each key is: crash-b is a `dir` entry, whose catalog entry does not say.
BUILDS = {OLD: "emb4", NEW: "emb4"}


def serves(catalog: Path, model: str) -> None:
    """vLLM on the rig lists ``model``, serves its checkpoint (checked at the source:
    assert_serving) and answers a chat with it."""
    wait_for(f"{model} to be served", lambda: served_models(PORT) == [model])
    assert_serving(CONTAINER, PORT, model, catalog=load_catalog(catalog), build=BUILDS[model])
    assert chat(PORT, model)["usage"]["completion_tokens"] > 0


def restart_vllm_once() -> None:
    """One `systemctl restart vllm`, as an operator (or a crash) would; its result may be a failed
    start, which is the guard reverting: systemd's own restart follows."""
    podman("exec", CONTAINER, "systemctl", "restart", "vllm")


def reboot() -> None:
    result = podman("restart", CONTAINER)
    assert result.returncode == 0, result.stderr


# --- the controller -------------------------------------------------------------------------------


def start_swap(model: str, catalog: Path, *extra: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [str(VENV_BIN / "ansible-playbook"), "swap.yml", "-e", f"model={model}", "-e", f"@{catalog}"]
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [*cmd, *INVENTORY, *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (ansible's workers call setsid: a process group is not enough)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def kill_controller(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ansible-playbook and everything it started on this machine, all at once."""
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):  # gone already
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def swap(model: str, catalog: Path) -> PlaybookRun:
    return run_playbook("swap.yml", "-e", f"model={model}", "-e", f"@{catalog}", *INVENTORY)


def said(run: PlaybookRun) -> str:
    """The run's output with its line wrapping undone (the YAML callback folds long messages)."""
    return " ".join(run.output.split())


def sent_bytes(run: PlaybookRun) -> tuple[int, int]:
    found = re.findall(
        r"pushed \S+ to rig-local: (\d+) bytes sent \(\d+ file\(s\); (\d+) bytes were already there\)",
        said(run),
    )
    assert found, run.output[-6000:]
    return int(found[-1][0]), int(found[-1][1])


# --- the kills ------------------------------------------------------------------------------------


def test_killed_while_pushing(rig: Path, tmp_path: Path, figure) -> None:
    serves(rig, OLD)
    started = unit_started_at(CONTAINER)
    proc = start_swap(
        NEW, rig, "-e", '{"checkpoint_push_rsync_opts": ["--bwlimit=2000"]}', log=tmp_path / "swap.log"
    )
    staged = f"find /opt1/models -path '*/{NEW}-*.partial/padding.dat' -size +8M"
    wait_for("padding.dat half pushed", lambda: rig_sh(staged).strip(), timeout=300)
    kill_controller(proc)

    assert journal()["phase"] == "staging"
    assert served_models(PORT) == [OLD]
    assert unit_started_at(CONTAINER) == started  # the old model never stopped

    restart_vllm_once()
    serves(rig, OLD)
    reboot()
    serves(rig, OLD)

    run = swap(NEW, rig)
    assert run.rc == 0, run.output[-6000:]
    assert (
        f"interrupted swap {OLD} -> {NEW} (phase staging): rolled back, {OLD} was serving already (no restart)"
        in said(run)
    )
    sent, resumed = sent_bytes(run)
    figure("push resumed after a kill mid-file", f"{resumed} bytes kept, {sent} bytes sent")
    assert resumed >= 8 * 1024 * 1024
    # Only the rest of padding.dat and the small files after it travelled, not the whole file.
    assert sent < PADDING - resumed + 1024 * 1024
    serves(rig, NEW)
    assert journal()["phase"] == "committed"


def test_killed_right_after_the_switch(rig: Path, tmp_path: Path) -> None:
    serves(rig, NEW)
    proc = start_swap(OLD, rig, log=tmp_path / "swap.log")
    wait_for(
        "the switch", lambda: journal().get("phase") in ("switching", "trial") and journal()["to"] == OLD
    )
    kill_controller(proc)

    # The switch and the restart are one step on the rig: it goes on without the controller,
    # and the unverified new model gets its one trial start. The reboot ends that trial; the boot's
    # start of vLLM is the next one, and it reverts.
    wait_for("the trial start", lambda: journal().get("phase") == "trial")
    reboot()
    serves(rig, NEW)  # the old, verified model, within that one start
    assert journal()["phase"] == "reverted"
    assert rig_sh("readlink /opt1/models/current").strip() == journal()["from_target"]

    run = swap(OLD, rig)
    assert run.rc == 0, run.output[-6000:]
    assert (
        f"interrupted swap {NEW} -> {OLD} (phase reverted): rolled back, {NEW} was serving already (no restart)"
        in said(run)
    )
    serves(rig, OLD)


def test_killed_while_vllm_restarts(rig: Path, tmp_path: Path) -> None:
    serves(rig, OLD)
    proc = start_swap(NEW, rig, log=tmp_path / "swap.log")
    wait_for("the trial start", lambda: journal().get("phase") == "trial" and journal()["to"] == NEW)
    kill_controller(proc)

    # The next swap.yml finds the trial running: checks it answers, then commits it.
    run = swap(NEW, rig)
    assert run.rc == 0, run.output[-6000:]
    assert f"interrupted swap {OLD} -> {NEW} (phase trial): finished, {NEW} answers and is committed" in said(
        run
    )
    assert f"rig-local already serves {NEW}: nothing to do" in said(run)
    assert journal()["phase"] == "committed"
    restart_vllm_once()
    serves(rig, NEW)


# --- the unit gives up ----------------------------------------------------------------------------

ATTENTION = "/opt1/venv/lib/python3.11/site-packages/vllm/v1/attention/ops/triton_unified_attention.py"
UNCLAMP = (
    "import importlib.machinery, sys; "
    "m = importlib.machinery.SourceFileLoader('c', '/usr/local/libexec/gemma-rig/turing_clamp.py').load_module(); "
    "p = sys.argv[1]; open(p, 'w').write(m.remove(open(p).read()))"
)


def test_a_missing_clamp_makes_the_unit_give_up_with_the_reason(rig: Path) -> None:
    """Every start fails in ExecStartPre: systemd stops retrying at the start limit; `systemctl
    status` says so and names the failing check, status.yml adds the check's own words."""
    serving = served_models(PORT)[0]
    unclamp = f'cp {ATTENTION} /opt1/attention.orig && /usr/bin/python3 -c "{UNCLAMP}" {ATTENTION} && echo ok'
    assert rig_sh(unclamp).strip() == "ok"
    try:
        restart_vllm_once()
        # Between automatic restarts the unit is `activating (auto-restart)`; `failed` means
        # systemd has given up.
        wait_for(
            "the unit to give up",
            lambda: rig_sh("systemctl show vllm -p ActiveState --value").strip() == "failed",
        )
        status = rig_sh("systemctl status vllm --no-pager -n 40; true")
        assert "Start request repeated too quickly" in status, status
        # systemctl status names the failing ExecStartPre; its own words are in the unit's journal.
        assert "clamp-check check --python /opt1/venv/bin/python (code=exited, status=1/FAILURE)" in status
        assert "clamp-check: turing clamp missing from" in rig_sh("journalctl -u vllm -n 60 --no-pager")
        assert int(rig_sh("systemctl show vllm -p NRestarts --value")) < 10  # it stopped retrying

        run = run_playbook("playbooks/status.yml", *INVENTORY)
        assert run.rc == 0, run.output[-4000:]
        assert "gave up after repeated failed starts (start limit hit" in said(run), run.output[-4000:]
        assert "clamp-check: turing clamp missing from" in said(run)
    finally:
        rig_sh(f"cp /opt1/attention.orig {ATTENTION}; systemctl reset-failed vllm; systemctl start vllm")
    serves(rig, serving)


def test_status_names_the_last_swap(rig: Path) -> None:
    run = run_playbook("playbooks/status.yml", *INVENTORY)
    assert run.rc == 0, run.output[-4000:]
    assert f"last swap: {OLD} -> {NEW}, committed" in said(run)
