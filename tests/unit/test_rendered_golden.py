"""tpu.env and the vLLM unit, rendered for each platform profile, compared byte for byte with files.

One ansible-playbook run (local connection, nothing started) renders, with the project's own
inventory and roles, for:

- ``local``: host ``rig-local`` of inventory/local.yml (the default profile);
- ``gce``: host ``gemma-rig-1`` of inventory/gce.yml (the T4 profile);
- ``tpu``: host ``gemma-tpu-1`` of inventory/tpu.yml (the v5e profile: no clamp check, the
  tpu-inference patch check, the chip's device nodes, unlimited locked memory, a 30-minute start);
- ``gce-open``: the gce profile with the endpoint open, an API key and a model with its own
  vLLM args (google-w4a16), so the key, the listen address and the args' order are covered too;
- ``local-host-flags``: the local profile with one host's changes to its flags (one changed,
  one switch dropped, a JSON one and a new one added).

tpu.env comes from roles/rig_config (tasks ``render``, in memory) and the unit from
roles/vllm_service (tasks ``unit``), as the real plays do (tests/golden/render.py). The golden
files are in tests/golden/<case>/, and this test only reads them. After a deliberate change,
regenerate them by hand with

    .venv/bin/python -m tests.golden.update

and review ``git diff tests/golden`` (the diff is the change the rigs will see).
"""

from __future__ import annotations

import difflib
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.golden import update
from tests.golden.render import CASES, FILES, GOLDEN, render


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case rendered into one directory (tests/golden/render.py)."""
    out = tmp_path_factory.mktemp("rendered")
    render(out)
    return out


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("case", CASES)
def test_rendered_matches_golden(rendered: Path, case: str, name: str) -> None:
    got = (rendered / case / name).read_bytes()
    golden = GOLDEN / case / name
    assert golden.exists(), f"{golden} is missing: `.venv/bin/python -m tests.golden.update` writes it"
    want = golden.read_bytes()
    diff = "".join(
        difflib.unified_diff(
            want.decode().splitlines(keepends=True),
            got.decode().splitlines(keepends=True),
            f"golden/{case}/{name}",
            f"rendered/{case}/{name}",
        )
    )
    assert got == want, f"rendered {case}/{name} differs from the golden file:\n{diff}"


def test_the_comparison_never_writes_the_golden_files(
    rendered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A golden file that differs, or is missing, fails the comparison and stays as it was, whatever
    the environment says (GOLDEN_UPDATE=1 once made the test write what it compares against)."""
    golden = tmp_path / "golden"
    for case in CASES:
        shutil.copytree(rendered / case, golden / case)
    stale = golden / "tpu" / "tpu.env"
    stale.write_bytes(stale.read_bytes() + b"RIG_STALE=1\n")
    before = stale.read_bytes()
    missing = golden / "gce" / "vllm.service"
    missing.unlink()
    monkeypatch.setattr(sys.modules[__name__], "GOLDEN", golden)
    monkeypatch.setenv("GOLDEN_UPDATE", "1")
    with pytest.raises(AssertionError, match="differs from the golden file"):
        test_rendered_matches_golden(rendered, "tpu", "tpu.env")
    assert stale.read_bytes() == before
    with pytest.raises(AssertionError, match="is missing"):
        test_rendered_matches_golden(rendered, "gce", "vllm.service")
    assert not missing.exists()


def test_update_writes_what_is_rendered(
    rendered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """tests/golden/update.py (run by hand) writes each rendered file over its golden one, only
    those that differ, and creates a missing one; here over a copy of the golden files, rendered
    by the same play the comparison uses (this module's fixture)."""
    golden = tmp_path / "golden"
    for case in CASES:
        shutil.copytree(GOLDEN / case, golden / case)
    (golden / "tpu" / "tpu.env").write_text("RIG_STALE=1\n")
    (golden / "gce" / "vllm.service").unlink()
    monkeypatch.setattr(update, "GOLDEN", golden)
    monkeypatch.setattr(update, "render", lambda out: shutil.copytree(rendered, out, dirs_exist_ok=True))
    assert update.main() == 0
    for case in CASES:
        for name in FILES:
            assert (golden / case / name).read_bytes() == (rendered / case / name).read_bytes(), (case, name)
    wrote = sorted(line.split("/", 1)[1] for line in capsys.readouterr().out.splitlines())
    assert wrote == ["golden/gce/vllm.service", "golden/tpu/tpu.env"]


def env_keys(text: str) -> list[str]:
    """The RIG_* keys of a tpu.env, in order."""
    return re.findall(r"(?m)^(RIG_[A-Z0-9_]+)=", text)


@pytest.mark.parametrize("case", CASES)
def test_unit_passes_exactly_the_flag_keys_of_tpu_env(rendered: Path, case: str) -> None:
    """rig_config and vllm_service each read the flags: the unit must pass every flag key, in order."""
    keys = env_keys((rendered / case / "tpu.env").read_text())
    unit = (rendered / case / "vllm.service").read_text()
    exec_start = unit[unit.index("ExecStart=") :].split("\nRestart=")[0]
    passed = re.findall(r"--([a-z0-9-]+) \$\{(RIG_[A-Z0-9_]+)\}", exec_start)
    # Each flag's key is its name in capitals; the role's own keys lead, RIG_EXTRA_ARGS ends.
    assert all(key == "RIG_" + flag.upper().replace("-", "_") for flag, key in passed), passed
    unbraced = ("RIG_MODEL_KEY", "RIG_SERVED_ALIAS", "RIG_EXTRA_ARGS")
    assert [key for _, key in passed] == [k for k in keys if k not in unbraced]
    assert keys[-1] == "RIG_EXTRA_ARGS" and exec_start.rstrip().endswith("$RIG_EXTRA_ARGS")
    # The alias is vLLM's second served name, unbraced: an empty one adds no argument.
    assert keys[keys.index("RIG_SERVED_MODEL_NAME") + 1] == "RIG_SERVED_ALIAS"
    assert "--served-model-name ${RIG_SERVED_MODEL_NAME} $RIG_SERVED_ALIAS \\\n" in exec_start


def test_tpu_profile_settings(rendered: Path) -> None:
    """The v5e settings (docs/tpu.md) reach tpu.env and the unit: no T4 clamp, the patch checked."""
    env = (rendered / "tpu" / "tpu.env").read_text().splitlines()
    for line in (
        "RIG_MAX_MODEL_LEN=16384",
        "RIG_MAX_NUM_SEQS=16",
        "RIG_MAX_NUM_BATCHED_TOKENS=512",
        "RIG_GPU_MEMORY_UTILIZATION=0.8",
        'RIG_LIMIT_MM_PER_PROMPT="{\\"image\\":0,\\"audio\\":0,\\"video\\":0}"',
        "MIN_TOKEN_BUCKET=64",
        "VLLM_CACHE_ROOT=/opt1/cache/vllm",
        "VLLM_XLA_CACHE_PATH=/opt1/cache/vllm/xla_cache",
    ):
        assert line in env, f"{line!r} not in tpu.env: {env}"
    assert not any(k.startswith(("RIG_DTYPE=", "RIG_KV_CACHE_DTYPE=")) for k in env)
    unit = (rendered / "tpu" / "vllm.service").read_text()
    assert "clamp-check" not in unit and "swap-check" not in unit
    assert "tpu_inference_patch.py check --python /opt1/venv/bin/python" in unit
    assert "TimeoutStartSec=1800" in unit and "LimitMEMLOCK=infinity" in unit
    assert "DeviceAllow=char-vfio rw" in unit and "PrivateDevices=no" in unit
