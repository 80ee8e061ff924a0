"""The recap parser the playbook tests rely on."""

import json
from pathlib import Path

import pytest

from tests.ansible_run import PlaybookRun, RecapMissing, parse_recap, run_playbook
from tests.conftest import VENV_BIN

OUTPUT = """
PLAY [x] ****
TASK [y] ****
ok: [rig-local]

PLAY RECAP *********************************************************************
localhost                  : ok=3    changed=1    unreachable=0    failed=0    skipped=2    rescued=0    ignored=0
rig-local                  : ok=40   changed=0    unreachable=0    failed=1    skipped=5    rescued=1    ignored=0
"""


def test_parse_recap_reads_every_host_and_counter() -> None:
    recap = parse_recap(OUTPUT)
    assert recap["localhost"]["changed"] == 1
    assert recap["rig-local"] == {
        "ok": 40,
        "changed": 0,
        "unreachable": 0,
        "failed": 1,
        "skipped": 5,
        "rescued": 1,
        "ignored": 0,
    }


def test_parse_recap_without_recap_is_empty() -> None:
    assert parse_recap("ERROR! the playbook could not be found") == {}


def _run(output: str, rc: int = 0) -> PlaybookRun:
    return PlaybookRun(rc, output, 1.0, parse_recap(output))


def test_a_run_without_recap_has_no_counters() -> None:
    run = _run("ERROR! the playbook could not be found", rc=1)
    with pytest.raises(RecapMissing, match="no PLAY RECAP"):
        run.total("changed")


def test_every_expected_host_must_be_in_the_recap() -> None:
    run = _run(OUTPUT)
    assert run.total("changed", hosts=["localhost", "rig-local"]) == 1
    with pytest.raises(RecapMissing, match="no line for rig-b"):
        run.total("changed", hosts=["rig-local", "rig-b"])


def test_total_sums_only_the_hosts_named() -> None:
    """Named hosts: their counters alone (one host's changes are not another's); none: every host."""
    run = _run(OUTPUT)
    assert run.total("changed", hosts=["rig-local"]) == 0
    assert run.total("changed", hosts=["localhost"]) == 1
    assert run.total("ok", hosts=["rig-local"]) == 40
    assert run.total("ok", hosts=("localhost", "rig-local")) == 43
    assert run.total("ok") == 43
    # A generator of names is read once, for both the check and the sum.
    assert run.total("skipped", hosts=(h for h in ["rig-local"])) == 5


def test_slowest_reads_profile_tasks_closing_list(tmp_path: Path) -> None:
    """ansible.cfg's profile_tasks lists every task's time at the end; slowest() names the longest."""
    play = tmp_path / "play.yml"
    tasks = [
        {"name": "Wait a little", "ansible.builtin.command": "sleep 1.2", "changed_when": False},
        {"name": "Say something", "ansible.builtin.debug": {"msg": "hi"}},
    ]
    play.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "tasks": tasks,
                    "vars": {"ansible_python_interpreter": str(VENV_BIN / "python")},
                }
            ]
        )
    )
    run = run_playbook(str(play), inventory="localhost,", timeout=120)
    assert run.rc == 0, run.output[-3000:]
    first, second = run.slowest(2).split("; ")
    assert first.startswith("Wait a little ") and first.endswith(" s") and int(first.split()[-2]) >= 1
    assert second.startswith("Say something ")
