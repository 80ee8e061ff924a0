"""site.yml stands up the local rig from nothing, converges to zero changes, and --check touches nothing."""

from __future__ import annotations

import re

import pytest

from tests.ansible_run import PlaybookRun, run_playbook
from tests.e2e.rig import assert_serving, chat, podman, unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "none"  # this file stands the rig up

# Every file the roles install on a rig: a converged run reads them back in one round trip per role
# and runs none of these tasks (each is two round trips even when it changes nothing).
INSTALL_TASKS = (
    "rig_host : Copy the extra CA bundle into the system trust store",
    "rig_host : Point TMPDIR and the caches at the data disk for shells",
    "rig_host : Point pip at the data disk (and the system CA store)",
    "rig_host : Install the base packages",
    "vllm_service : Install the unit",
    "vllm_service : Install the swap journal tool",
    "vllm_service : Install rigctl, the rig's own command (rigctl --help lists what it does)",
)
# The checks the unit runs before a start are written by their patch modules (checker:), which
# compare on the rig: one round trip each, and no change.
CHECKER_TASKS = ("vllm_service : Install the clamp check (ExecStartPre)",)


def task_results(run: PlaybookRun) -> dict[str, set[str]]:
    """{task name: the result words its hosts got (ok, changed, skipping, failed)} from the output."""
    results: dict[str, set[str]] = {}
    for chunk in re.split(r"(?:TASK|RUNNING HANDLER) \[", run.output)[1:]:
        name = chunk.split("]", 1)[0]
        words = {m.group(1) for m in re.finditer(r"^(ok|changed|skipping|failed|fatal): \[", chunk, re.M)}
        results.setdefault(name, set()).update(words)
    return results


def test_site_stands_up_a_rig_that_answers(local_rig, figure) -> None:
    figure(
        "site.yml from nothing to a healthy rig",
        f"{local_rig.bring_up.seconds:.0f} s; slowest tasks: {local_rig.bring_up.slowest(6)}",
    )
    assert_serving(local_rig.container, local_rig.port, local_rig.model)
    answer = chat(local_rig.port, local_rig.model, "What is the capital of France?")
    assert answer["model"] == local_rig.model
    assert answer["usage"]["completion_tokens"] > 0
    assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in local_rig.bring_up.output
    assert "answer:" in local_rig.bring_up.output
    # A task name that fails to template shows as a warning and a garbled name on every run.
    assert "template error" not in local_rig.bring_up.output, local_rig.bring_up.output[-6000:]


def test_second_run_changes_nothing(local_rig, figure) -> None:
    started = unit_started_at(local_rig.container)
    run = run_playbook("site.yml")
    assert run.rc == 0, run.output[-6000:]
    figure("site.yml re-run on a converged rig", f"{run.seconds:.0f} s, changed={run.total('changed')}")
    # Every host changed nothing (the controller's plays too), and rig-local is in the recap.
    assert run.total("changed", hosts=["rig-local"]) == run.total("changed") == 0, run.output[-6000:]
    assert "template error" not in run.output, run.output[-6000:]
    assert unit_started_at(local_rig.container) == started
    results = task_results(run)
    assert {name: results.get(name) for name in INSTALL_TASKS} == {
        name: {"skipping"} for name in INSTALL_TASKS
    }
    assert {name: results.get(name) for name in CHECKER_TASKS} == {name: {"ok"} for name in CHECKER_TASKS}


def test_check_mode_reports_only_the_drift_and_touches_nothing(local_rig) -> None:
    """A file whose content or mode drifted is a task check mode reports; a plugin whose copy on the
    rig is not the source's (its recorded digest gone) is sent, installed, and vLLM restarted to load
    it: check mode reports those and nothing else, and writes nothing."""
    container, profile, rigctl = local_rig.container, "/etc/profile.d/gemma-rig.sh", "/usr/local/bin/rigctl"
    stamp = "/opt1/plugins/gemma-rig-guard.sha256"
    original, digest = (podman("exec", container, "cat", path).stdout for path in (profile, stamp))
    drift = f"echo '# drift' >> {profile} && chmod 0700 {rigctl} && rm {stamp}"
    assert podman("exec", container, "sh", "-c", drift).returncode == 0
    started = unit_started_at(local_rig.container)
    try:
        run = run_playbook("site.yml", "--check")
        assert run.rc == 0, run.output[-6000:]
        changed = {name for name, words in task_results(run).items() if "changed" in words}
        assert changed == {
            "rig_host : Point TMPDIR and the caches at the data disk for shells",
            INSTALL_TASKS[-1],
            "vllm : Record the digest of the copy on the rig (gemma-rig-guard)",
            "vllm_service : Restart vLLM on the code installed in this run",
            "vllm_service : Restart vLLM",  # the handler
        }, run.output[-6000:]
        assert podman("exec", container, "stat", "-c", "%a", rigctl).stdout.strip() == "700"  # untouched
        assert podman("exec", container, "tail", "-n1", profile).stdout == "# drift\n"
        assert podman("exec", container, "test", "-e", stamp).returncode == 1
        assert unit_started_at(local_rig.container) == started
    finally:
        restore = f'printf %s "$1" > {profile} && chmod 0755 {rigctl} && printf %s "$2" > {stamp}'
        assert podman("exec", container, "sh", "-c", restore, "sh", original, digest).returncode == 0
