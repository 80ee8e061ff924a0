"""Reading the inventory (and running a playbook) leaves nothing on disk: no decrypted vault value
anywhere, and no ansible-runner directory holding the inventory (ansible_runner.get_inventory left
one in $TMPDIR for good). The server reads ansible-inventory's stdout, and removes a run's private
directory after it. The controller's copy of the rig's key is vault-encrypted in the inventory; the
rig's own copy is in its tpu.env (a directory apart, as the rig's disk is), where rigctl reads it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from tests.fake_rig import FakeRig
from tests.unit.mcp_stack import RIG, ROOT, installed_rigctl, isolated_env, stdio

SECRET = "vault-decrypted-rig-api-key-7f3a9c"


def vault_inventory(tmp_path: Path, rigctl: Path, port: int, password_file: Path) -> Path:
    """One FakeRig whose rig_api_key is vault-encrypted, asked through an installed rigctl."""
    encrypted = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-vault"),
            "encrypt_string",
            "--vault-password-file",
            str(password_file),
            "--name",
            "rig_api_key",
            SECRET,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    ).stdout
    key = "\n".join("          " + line for line in encrypted.strip().splitlines())
    path = tmp_path / "vault-rig.yml"
    path.write_text(
        f"""rigs:
  children:
    local:
      hosts:
        {RIG}:
          ansible_connection: local
          ansible_python_interpreter: {ROOT / ".venv" / "bin" / "python"}
          rig_ctl: {rigctl}
          rig_listen_address: 127.0.0.1
          rig_port: {port}
          rig_smoke_prompt: hello
          rig_api_headers: "{{{{ {{'Authorization': 'Bearer ' ~ rig_api_key}} }}}}"
{key}
"""
    )
    return path


def files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            if needle in path.read_bytes():
                hits.append(str(path.relative_to(root)))
    return hits


def test_no_decrypted_vault_value_is_left_on_disk(tmp_path: Path) -> None:
    password = tmp_path / "vault-pass"
    password.write_text("correct horse battery staple\n")
    password.chmod(0o600)
    env = {**isolated_env(tmp_path), "ANSIBLE_VAULT_PASSWORD_FILE": str(password)}
    with FakeRig("tiny-emb4") as rig, tempfile.TemporaryDirectory() as rig_disk:
        rigctl = installed_rigctl(Path(rig_disk), rig.port, key=SECRET)
        inventory = vault_inventory(tmp_path, rigctl, rig.port, password)
        params = stdio(["-i", str(inventory), "--read-only"], env, cwd=tmp_path)

        async def go() -> tuple[Any, Any, list[str]]:
            async with Client(params) as client:
                rigs = await client.call_tool("list_rigs", {})
                answer = await client.call_tool("query", {"prompt": "hi", "rig": RIG, "max_tokens": 8})
                # While the server still runs: ansible-runner removes what it auto-creates only
                # when the process exits, so a long-running server would keep it on disk.
                left = [str(d) for d in (tmp_path / "tmp").glob(".ansible-runner-*")]
                return rigs, answer, files_holding(tmp_path, SECRET.encode()) + left

        rigs, answer, while_running = anyio.run(go)
    assert while_running == []
    assert not rigs.is_error, rigs.content[0].text
    assert [r["rig"] for r in rigs.structured_content["result"]] == [RIG]
    assert not answer.is_error, answer.content[0].text
    # The rig was asked with its key (from its tpu.env).
    assert {e["authorization"] for e in rig.log} == {f"Bearer {SECRET}"}
    # $TMPDIR (ansible-runner's directories), $HOME (~/.ansible) and the working directory.
    assert files_holding(tmp_path, SECRET.encode()) == []
    assert SECRET not in rigs.content[0].text + answer.content[0].text
