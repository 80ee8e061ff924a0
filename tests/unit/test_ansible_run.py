"""The recap parser the playbook tests rely on."""

from tests.ansible_run import parse_recap

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
