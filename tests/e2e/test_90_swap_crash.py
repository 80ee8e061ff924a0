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

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT
from tests.e2e.kill import kill_controller, start_playbook
from tests.e2e.rig import assert_serving, chat, load_catalog, podman, served_build, unit_started_at

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


def phase_of(swap: dict, to: str) -> str | None:
    """The phase of the journalled swap ``swap`` when it goes to ``to``; None for any other swap.
    A probe reads the journal once and asks this (each read is a `podman exec`, whose CPU the swap
    under test would otherwise share)."""
    return swap.get("phase") if swap.get("to") == to else None


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
    wait_for(f"{model} to be served", lambda: served_build(PORT) == model)
    assert_serving(CONTAINER, PORT, model, catalog=load_catalog(catalog), build=BUILDS[model])
    assert chat(PORT, model)["usage"]["completion_tokens"] > 0


def bring(catalog: Path, model: str) -> None:
    """The rig serving ``model``, verified: swapped there first when it serves another (a test run
    alone starts from site.yml's model; in file order the test before leaves the right one)."""
    if served_build(PORT) != model:
        run = swap(model, catalog)
        assert run.rc == 0, run.output[-6000:]
    serves(catalog, model)


def restart_vllm_once() -> None:
    """One `systemctl restart vllm`, as an operator (or a crash) would; its result may be a failed
    start, which is the guard reverting: systemd's own restart follows."""
    podman("exec", CONTAINER, "systemctl", "restart", "vllm")


def reboot() -> None:
    result = podman("restart", CONTAINER)
    assert result.returncode == 0, result.stderr


# --- the controller -------------------------------------------------------------------------------


def start_swap(model: str, catalog: Path, *extra: str, log: Path) -> subprocess.Popen[bytes]:
    return start_playbook(
        "swap.yml", "-e", f"model={model}", "-e", f"@{catalog}", *INVENTORY, *extra, log=log
    )


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
    bring(rig, OLD)
    started = unit_started_at(CONTAINER)
    proc = start_swap(
        NEW, rig, "-e", '{"checkpoint_push_rsync_opts": ["--bwlimit=2000"]}', log=tmp_path / "swap.log"
    )
    staged = f"find /opt1/models -path '*/{NEW}-*.partial/padding.dat' -size +8M"
    wait_for("padding.dat half pushed", lambda: rig_sh(staged).strip(), timeout=300)
    kill_controller(proc)

    assert journal()["phase"] == "staging"
    assert served_build(PORT) == OLD
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
    bring(rig, NEW)
    proc = start_swap(OLD, rig, log=tmp_path / "swap.log")
    wait_for("the switch", lambda: phase_of(journal(), OLD) in ("switching", "trial"))
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


# Run on the rig before a swap: waits for the switch (swap-journal ... switch), freezes it
# (SIGSTOP) and says which process it is. The brackets keep this script from matching itself.
FREEZE_THE_SWITCH = (
    "while :; do for d in /proc/[0-9]*; do "
    "if tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep -q 'swap-journa[l].* switc[h] --to-targe[t]'; "
    "then pid=${d#/proc/}; break 2; fi; done; sleep 0.05; done; "
    "kill -STOP $pid; echo $pid > /run/frozen-switch"
)


def test_hung_up_and_killed_during_the_switch_the_restart_goes_on(rig: Path, tmp_path: Path) -> None:
    """What a dropped SSH session does to the switch: the controller dies and the switch's whole
    process group on the rig gets SIGHUP. The switch is frozen first, so the hangup lands while it
    runs; it ignores it, switches and restarts vLLM on the new model (its trial start) with no
    controller. The next swap.yml finds the trial running, checks that it answers and commits it."""
    bring(rig, OLD)
    rig_sh("rm -f /run/frozen-switch")
    assert podman("exec", "-d", CONTAINER, "sh", "-c", FREEZE_THE_SWITCH).returncode == 0
    proc = start_swap(NEW, rig, log=tmp_path / "swap.log")
    pid = int(
        wait_for("the switch to start", lambda: rig_sh("cat /run/frozen-switch 2>/dev/null").strip(), 300)
    )
    kill_controller(proc)
    pgid = int(rig_sh(f"cut -d' ' -f5 /proc/{pid}/stat"))
    assert pgid > 1, f"the switch is in process group {pgid}: a hangup there would reach every process"
    hup = podman("exec", CONTAINER, "sh", "-c", f"kill -HUP -- -{pgid}; kill -CONT {pid}")
    assert hup.returncode == 0, hup.stderr

    wait_for("the trial start", lambda: phase_of(journal(), NEW) == "trial")
    assert rig_sh("readlink /opt1/models/current").strip() == journal()["to_target"]
    run = swap(NEW, rig)
    assert run.rc == 0, run.output[-6000:]
    assert f"interrupted swap {OLD} -> {NEW} (phase trial): finished, {NEW} answers and is committed" in said(
        run
    )
    assert f"rig-local already serves {NEW}: nothing to do" in said(run)
    assert journal()["phase"] == "committed"
    restart_vllm_once()
    serves(rig, NEW)


def test_killed_during_the_rollback(rig: Path, broken_catalog: Path, tmp_path: Path) -> None:
    """A swap to a model that cannot start rolls back; the controller is killed as soon as the
    rollback is journalled, while it restarts the old model. The rig serves the old model anyway
    (systemd restarts vLLM on the restored files), and the next swap.yml says nothing is left to do."""
    bring(rig, OLD)
    both = tmp_path / "catalog.yml"
    models = load_catalog(rig) | load_catalog(broken_catalog)
    both.write_text(yaml.safe_dump({"rig_models": models}))
    proc = start_swap("tiny-broken", both, log=tmp_path / "swap.log")
    wait_for("the rollback", lambda: phase_of(journal(), "tiny-broken") == "rolled-back")
    kill_controller(proc)

    serves(rig, OLD)
    assert rig_sh("readlink /opt1/models/current").strip() == journal()["from_target"]
    run = swap(OLD, both)
    assert run.rc == 0, run.output[-6000:]
    assert f"rig-local already serves {OLD}: nothing to do" in said(run)
    serves(rig, OLD)


# --- the unit gives up ----------------------------------------------------------------------------

ATTENTION = "/opt1/venv/lib/python3.11/site-packages/vllm/v1/attention/ops/triton_unified_attention.py"
UNCLAMP = (
    "import importlib.machinery, sys; "
    "m = importlib.machinery.SourceFileLoader('c', '/usr/local/libexec/gemma-rig/clamp-check').load_module(); "
    "p = sys.argv[1]; open(p, 'w').write(m.remove(open(p).read()))"
)


# A runtime drop-in (gone with the next boot, removed by the test) that paces systemd's automatic
# restarts faster than the unit's RestartSec: the test waits for the start limit, not the pacing.
PACE_DROP_IN = "/run/systemd/system/vllm.service.d/zz-test-restart-pace.conf"


def unit_setting(unit_text: str, name: str) -> int:
    """A whole-seconds setting (``name=N``) of the unit as `systemctl cat` shows it."""
    found = re.findall(rf"^{name}=(\d+)$", unit_text, re.MULTILINE)
    assert found, f"the unit sets no {name}=N:\n{unit_text}"
    return int(found[-1])


def test_a_missing_clamp_makes_the_unit_give_up_with_the_reason(rig: Path) -> None:
    """Every start fails in ExecStartPre: systemd stops retrying at the start limit; `systemctl
    status` says so and names the failing check, status.yml adds the check's own words.

    The unit's own pacing is checked to reach the start limit within its interval; the restarts
    then run 1 s apart (PACE_DROP_IN) instead of RestartSec apart, which only waits."""
    serving = served_build(PORT)
    unit = rig_sh("systemctl cat vllm")
    burst, interval = unit_setting(unit, "StartLimitBurst"), unit_setting(unit, "StartLimitIntervalSec")
    assert burst * unit_setting(unit, "RestartSec") < interval, unit
    own_pace = rig_sh("systemctl show vllm -p RestartUSec --value").strip()
    unclamp = f'cp {ATTENTION} /opt1/attention.orig && /usr/bin/python3 -c "{UNCLAMP}" {ATTENTION} && echo ok'
    assert rig_sh(unclamp).strip() == "ok"
    pace = f"mkdir -p {Path(PACE_DROP_IN).parent} && printf '[Service]\\nRestartSec=1\\n' > {PACE_DROP_IN}"
    try:
        assert rig_sh(f"{pace} && systemctl daemon-reload && echo ok").strip() == "ok"
        assert rig_sh("systemctl show vllm -p RestartUSec --value").strip() == "1s"
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
        rig_sh(
            f"rm -f {PACE_DROP_IN}; systemctl daemon-reload; cp /opt1/attention.orig {ATTENTION}; "
            "systemctl reset-failed vllm; systemctl start vllm"
        )
    assert rig_sh("systemctl show vllm -p RestartUSec --value").strip() == own_pace  # the drop-in is gone
    serves(rig, serving)


def test_status_names_the_last_swap(rig: Path) -> None:
    if not journal():  # alone, on a rig no swap has touched
        bring(rig, NEW)
    last = journal()
    run = run_playbook("playbooks/status.yml", *INVENTORY)
    assert run.rc == 0, run.output[-4000:]
    assert f"last swap: {last['from']} -> {last['to']}, {last['phase']}" in said(run)
