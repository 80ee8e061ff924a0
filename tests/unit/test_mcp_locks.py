"""The lock directory is the user's alone: a planted symlink (as the directory or as a lock file),
a directory of another user's, or one others can write, is refused, and nothing is followed or
written; the default is a private directory, never a fixed name in a shared /tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

from rig_mcp import locks
from rig_mcp.locks import RigLocks, UnsafeLockDir
from rig_mcp.server import Config, build
from tests.unit.mcp_stack import ROOT
from tests.unit.test_rig_mcp import FakeRunner


def hold(directory: Path) -> None:
    with RigLocks(directory).hold(["rig-local"], "stop of rig-local"):
        pass


def test_a_symlink_as_the_lock_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.mkdir(mode=0o700)
    link = tmp_path / "locks"
    link.symlink_to(target)
    with pytest.raises(UnsafeLockDir, match=r"is not a directory \(a symlink\?\): refused"):
        hold(link)
    assert list(target.iterdir()) == []


def test_a_symlink_as_a_lock_file_is_refused_and_not_followed(tmp_path: Path) -> None:
    directory = tmp_path / "locks"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (directory / "rig-local.lock").symlink_to(victim)
    dangling = tmp_path / "created-through-the-link"
    (directory / "rig-b.lock").symlink_to(dangling)
    with pytest.raises(UnsafeLockDir, match=r"rig-local.lock cannot be opened safely"):
        hold(directory)
    with (
        pytest.raises(UnsafeLockDir, match=r"rig-b.lock cannot be opened safely"),
        RigLocks(directory).hold(["rig-b"], "stop of rig-b"),
    ):
        pass
    assert victim.read_text() == "precious"
    assert not dangling.exists()


def test_a_lock_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "locks"
    directory.mkdir(mode=0o700)
    os.chown(directory, 4242, 4242)  # the tests run as root
    with pytest.raises(UnsafeLockDir, match=rf"owned by uid 4242, not {os.geteuid()}: refused"):
        hold(directory)
    assert list(directory.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_lock_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "locks"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(UnsafeLockDir, match=r"writable by others \(mode \d{4}\): refused; chmod 700 it"):
        hold(directory)
    assert list(directory.iterdir()) == []


def test_a_new_lock_directory_is_private(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "locks"
    hold(directory)
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (directory / "rig-local.lock").stat().st_mode & 0o777 == 0o600


def test_the_default_is_private_never_a_fixed_name_in_tmp(tmp_path: Path, monkeypatch) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert locks.default_lock_dir() == runtime / "gemma-rig-mcp"
    os.chown(runtime, 4242, 4242)  # a runtime directory that is not ours is not used
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert locks.default_lock_dir() == tmp_path / "home" / ".cache" / "gemma-rig" / "mcp-locks"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert locks.default_lock_dir() == tmp_path / "home" / ".cache" / "gemma-rig" / "mcp-locks"


def test_a_mutating_tool_says_so_in_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "locks"
    directory.mkdir()
    directory.chmod(0o777)
    runner = FakeRunner()

    async def go():
        async with Client(build(Config(lock_dir=directory), runner)) as client:
            return await client.call_tool("stop", {"rig": "rig-local"})

    result = anyio.run(go)
    assert result.is_error
    # The line itself, nothing in front of it (the SDK's "Error executing tool stop:" included).
    assert result.content[0].text == (
        f"lock directory {directory} is writable by others (mode 0777): refused; chmod 700 it"
    )
    assert runner.calls == []


def test_the_server_refuses_to_start_on_an_unsafe_lock_directory(tmp_path: Path) -> None:
    link = tmp_path / "locks"
    link.symlink_to(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "rig_mcp", "--lock-dir", str(link)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"rig_mcp: lock directory {link} is not a directory (a symlink?): refused; remove it"
    )


def test_arguments_off_the_schema_are_one_line_naming_the_field(tmp_path: Path) -> None:
    """The SDK's own check of a tool's arguments: one line with the field, never the value."""

    async def go():
        async with Client(build(Config(lock_dir=tmp_path / "locks", read_only=True), FakeRunner())) as client:
            return await client.call_tool("logs", {"rig": "rig-local", "lines": "SECRET-not-a-number"})

    result = anyio.run(go)
    assert result.is_error
    text = result.content[0].text
    assert text.startswith("logs: bad arguments: lines: ") and "\n" not in text, text
    assert "SECRET" not in text, text
