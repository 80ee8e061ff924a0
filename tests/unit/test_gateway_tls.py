"""The gateway's self-signed certificate is kept, not made once (roles/gateway/tasks/tls.yml).

Each test runs the role's `tls` tasks alone on the controller (a local connection, gateway files
under a temporary directory, as tests/unit/test_gateway_config.py renders the whole role): the
first run makes a key and a certificate; a second run changes nothing; new names or an end within
gateway_tls_renew_days make a new certificate in the same run; the controller's copy is the
gateway's after every run; check mode says what a run would change and changes nothing; a given
certificate is installed as it is.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT, VENV_BIN


@dataclass
class TlsGateway:
    """A gateway whose `tls` tasks run on the controller, and where they write."""

    tmp: Path
    etc: Path
    ctl: Path

    @property
    def crt(self) -> Path:
        return self.etc / "gemma-gateway" / "tls" / "gateway.crt"

    @property
    def key(self) -> Path:
        return self.etc / "gemma-gateway" / "tls" / "gateway.crt.key"

    @property
    def copy(self) -> Path:
        return self.ctl / "gw.crt"

    def run(self, *args: str, **host_vars: object) -> PlaybookRun:
        """The role's tls tasks with these host variables (a fresh inventory each time)."""
        inventory = self.tmp / "inventory"
        if not inventory.exists():
            (inventory / "group_vars").mkdir(parents=True)
            (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(VENV_BIN / "python"),
            "gateway_service_manage": False,
            "gateway_config_dir": str(self.etc),
            "gateway_controller_dir": str(self.ctl),
            "gateway_address": "127.0.0.1",
            **host_vars,
        }
        (inventory / "hosts.yml").write_text(yaml.safe_dump({"gateways": {"hosts": {"gw": host}}}))
        task = {"name": "TLS", "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "tls"}}
        play = self.tmp / "tls.yml"
        play.write_text(json.dumps([{"hosts": "gateways", "gather_facts": False, "tasks": [task]}]))
        run = run_playbook(str(play), *args, inventory=inventory, timeout=120)
        assert run.rc == 0, run.output[-4000:]
        return run

    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.crt.read_bytes())

    def fingerprint(self) -> str:
        return self.cert().fingerprint(hashes.SHA256()).hex()

    def sans(self) -> set[str]:
        names = self.cert().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(v) for v in names.get_values_for_type(x509.DNSName)} | {
            str(v) for v in names.get_values_for_type(x509.IPAddress)
        }

    def days_left(self) -> float:
        end = self.cert().not_valid_after_utc
        return (end - datetime.datetime.now(datetime.UTC)).total_seconds() / 86400

    def assert_copy_is_the_gateways(self) -> None:
        assert self.copy.read_bytes() == self.crt.read_bytes()


@pytest.fixture
def gw(tmp_path: Path) -> TlsGateway:
    return TlsGateway(tmp_path, tmp_path / "etc", tmp_path / "ctl")


def test_made_once_then_kept(gw: TlsGateway) -> None:
    """First run: a key (0600) and a certificate for gateway_tls_names, copied to the controller;
    a second run, and a check-mode run, change nothing. Check mode on a new gateway says it would
    change and writes nothing."""
    fresh = gw.run("--check")
    assert fresh.total("changed") > 0 and not gw.etc.exists() and not gw.ctl.exists()
    first = gw.run()
    assert first.total("changed") > 0
    assert gw.key.stat().st_mode & 0o777 == 0o600
    assert gw.sans() == {"127.0.0.1", "localhost"}  # the default names: gateway_address, localhost
    made = gw.fingerprint()
    gw.assert_copy_is_the_gateways()
    # A server's certificate, not a CA, and OpenSSL's strict checks take it as its own trust anchor.
    constraints = gw.cert().extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and not constraints.value.ca
    verify = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile", gw.crt, gw.crt],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr

    again = gw.run()
    assert again.total("changed") == 0, again.output[-4000:]
    assert gw.fingerprint() == made
    checked = gw.run("--check")
    assert checked.total("changed") == 0, checked.output[-4000:]
    gw.assert_copy_is_the_gateways()


def test_a_new_name_makes_a_new_certificate_in_the_same_run(gw: TlsGateway) -> None:
    names = ["127.0.0.1", "localhost"]
    gw.run(gateway_tls_names=names)
    old = gw.fingerprint()
    moved = [*names, "gw.example.test", "10.1.2.3"]
    checked = gw.run("--check", gateway_tls_names=moved)
    assert checked.total("changed") > 0 and gw.fingerprint() == old  # says so, changes nothing
    gw.assert_copy_is_the_gateways()
    run = gw.run(gateway_tls_names=moved)
    assert run.total("changed") > 0
    assert gw.fingerprint() != old
    assert gw.sans() == {"127.0.0.1", "localhost", "gw.example.test", "10.1.2.3"}
    gw.assert_copy_is_the_gateways()
    assert gw.run(gateway_tls_names=moved).total("changed") == 0


def test_a_near_end_is_renewed(gw: TlsGateway) -> None:
    """A certificate that ends within gateway_tls_renew_days is replaced by one of gateway_tls_days;
    one that ends later is kept."""
    gw.run(gateway_tls_days=20, gateway_tls_renew_days=10)
    short = gw.fingerprint()
    assert 19 < gw.days_left() <= 20
    assert gw.run(gateway_tls_days=20, gateway_tls_renew_days=10).total("changed") == 0
    assert gw.fingerprint() == short
    checked = gw.run("--check")  # the default window (30 days) takes it in
    assert checked.total("changed") > 0 and gw.fingerprint() == short
    renewed = gw.run()
    assert renewed.total("changed") > 0
    assert gw.fingerprint() != short and gw.days_left() > 800  # gateway_tls_days' 825
    gw.assert_copy_is_the_gateways()
    assert gw.run().total("changed") == 0


def test_a_stale_controller_copy_is_replaced(gw: TlsGateway) -> None:
    gw.run()
    gw.copy.write_text("not the gateway's\n")
    checked = gw.run("--check")
    assert checked.total("changed") == 1, checked.output[-4000:]
    assert gw.run().total("changed") == 1
    gw.assert_copy_is_the_gateways()


def test_a_given_certificate_is_installed_as_it_is(gw: TlsGateway) -> None:
    given = gw.tmp / "given"
    given.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "5", "-subj", "/CN=given.example.test",
         "-keyout", given / "k.pem", "-out", given / "c.pem"],
        check=True, capture_output=True,
    )  # fmt: skip
    pems = {"gateway_tls_cert": str(given / "c.pem"), "gateway_tls_key": str(given / "k.pem")}
    gw.run(**pems)
    # Its near end is the owner's to act on: the role renews only a certificate it made.
    assert gw.crt.read_bytes() == (given / "c.pem").read_bytes()
    assert gw.key.read_bytes() == (given / "k.pem").read_bytes()
    assert gw.key.stat().st_mode & 0o777 == 0o600
    gw.assert_copy_is_the_gateways()
    assert gw.run(**pems).total("changed") == 0
