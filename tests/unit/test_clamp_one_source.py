"""The clamp has one source: the module's module_utils and the copy the rig's check runs agree."""

from __future__ import annotations

from tests.conftest import ROOT

MODULE_UTILS = ROOT / "module_utils" / "turing_clamp.py"
ROLE_COPY = ROOT / "roles" / "vllm_service" / "files" / "turing_clamp.py"


def test_the_role_ships_module_utils_byte_for_byte() -> None:
    """The vllm_service role must stay self-contained (it ships its files), and the check it
    installs must be the module's own code: edit module_utils/turing_clamp.py, then
    `cp module_utils/turing_clamp.py roles/vllm_service/files/`."""
    assert ROLE_COPY.read_bytes() == MODULE_UTILS.read_bytes(), (
        f"{ROLE_COPY.relative_to(ROOT)} differs from {MODULE_UTILS.relative_to(ROOT)}: "
        "copy module_utils/turing_clamp.py over it"
    )


def test_the_role_installs_its_own_copy() -> None:
    """The install task names the role's file (found in files/), not a path out of the role."""
    tasks = (ROOT / "roles" / "vllm_service" / "tasks" / "main.yml").read_text()
    assert "src: turing_clamp.py" in tasks
    assert "module_utils" not in tasks.replace("module_utils/turing_clamp.py, byte for byte", "")


def test_module_utils_is_free_of_script_code() -> None:
    """ansible-test's pylint forbids print and sys.exit in module_utils: the CLI lives in the role."""
    text = MODULE_UTILS.read_text()
    assert 'if __name__ == "__main__"' not in text
    assert "import sys" not in text and "import argparse" not in text


def test_the_tpu_patch_check_is_the_modules_own_code() -> None:
    """The tpu unit's ExecStartPre runs the tpu_inference_patch module's own check (its
    module_utils file as a script), shipped by vllm_service: edit module_utils/tpu_inference_patch.py,
    then `cp module_utils/tpu_inference_patch.py roles/vllm_service/files/`."""
    source = ROOT / "module_utils" / "tpu_inference_patch.py"
    copy = ROOT / "roles" / "vllm_service" / "files" / "tpu_inference_patch.py"
    assert copy.read_bytes() == source.read_bytes(), (
        f"copy {source.relative_to(ROOT)} over {copy.relative_to(ROOT)}"
    )
