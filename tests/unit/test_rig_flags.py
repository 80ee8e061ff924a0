"""The rig_flags filter (plugins/filter/rig_flags.py): the one merge of the profile's vLLM flags
and a host's changes, read by rig_config, vllm_service, bench.yml and the MCP server's capacity."""

from __future__ import annotations

import configparser
import importlib.util
import json
import re
import subprocess

import pytest
import yaml

from rig_mcp import capacity
from tests.conftest import ROOT, VENV_BIN

PLUGIN = ROOT / "plugins" / "filter" / "rig_flags.py"
_SPEC = importlib.util.spec_from_file_location("rig_flags", PLUGIN)
assert _SPEC and _SPEC.loader
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)
rig_flags = _MODULE.rig_flags


def test_null_and_false_drop_a_flag() -> None:
    profile = {"dtype": "half", "enforce-eager": True, "max-num-seqs": 4}
    host = {"dtype": None, "enforce-eager": False, "seed": None}
    assert rig_flags(profile, host) == {"max-num-seqs": 4}
    assert rig_flags({"a": None, "b": False, "c": 0, "d": ""}) == {"c": 0, "d": ""}


def test_drop_false_keeps_every_name_written() -> None:
    """What validate.yml checks: a mistyped name set to null must still be seen."""
    assert rig_flags({"dtype": "half"}, {"max_num_seqs": None}, drop=False) == {
        "dtype": "half",
        "max_num_seqs": None,
    }


def test_host_overrides_in_place_and_order_is_kept() -> None:
    profile = {"dtype": "half", "max-model-len": 1024, "max-num-seqs": 4}
    host = {"seed": 1, "max-model-len": 2048, "enforce-eager": True}
    got = rig_flags(profile, host)
    assert list(got) == ["dtype", "max-model-len", "max-num-seqs", "seed", "enforce-eager"]
    assert got["max-model-len"] == 2048
    assert rig_flags(profile) == profile and rig_flags(profile, None) == profile
    assert profile == {"dtype": "half", "max-model-len": 1024, "max-num-seqs": 4}  # not changed


@pytest.mark.parametrize("bad", [["max-num-seqs"], "max-num-seqs", 3])
def test_a_non_mapping_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="must be a mapping"):
        rig_flags({"dtype": "half"}, bad)
    with pytest.raises(TypeError, match="rig_vllm_flags must be a mapping"):
        rig_flags(bad)


def test_through_ansible(tmp_path) -> None:
    """As the roles call it: ansible.cfg's filter_plugins, with null and false dropped, in order."""
    out = tmp_path / "flags.json"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"profile": {"b": 1, "a": True, "c": "x"}, "host": {"a": False, "c": None, "d": 2}},
            "tasks": [
                {
                    "ansible.builtin.copy": {
                        "content": "{{ profile | rig_flags(host) | to_json }}",
                        "dest": str(out),
                        "mode": "0644",
                    }
                }
            ],
        }
    ]
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "/dev/stdin",
         "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}"],
        input=json.dumps(play), cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(json.loads(out.read_text()).items()) == [("b", 1), ("d", 2)]


def test_capacity_reads_the_flags_through_the_same_function() -> None:
    assert capacity.rig_flags.__code__.co_filename == str(PLUGIN)
    # false drops a flag for the unit, so vLLM's default applies; the capacity check agrees.
    profile = {"gpu-memory-utilization": 0.7, "kv-cache-memory-bytes": 1024}
    host = {"gpu-memory-utilization": False, "kv-cache-memory-bytes": None}
    assert capacity.vllm_memory_flags({"rig_vllm_flags": profile, "rig_vllm_host_flags": host}) == (0.9, 0)


def test_no_other_place_merges_the_flags() -> None:
    """Every Jinja expression that reads the flags reads them through rig_flags, host flags included."""
    merge = re.compile(r"rig_vllm_flags\s*\|\s*rig_flags\(\s*rig_vllm_host_flags\b")
    sources = [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("roles/**/*.j2"), *ROOT.glob("playbooks/**/*.yml")]
    readers = []
    for path in sources:
        for expr in re.findall(r"\{\{.*?\}\}", path.read_text(), re.S):
            code = re.sub(r"'[^']*'", "''", expr)  # names inside messages are not reads
            names = len(re.findall(r"\brig_vllm_(host_)?flags\b", code))
            if names:
                readers.append(path.relative_to(ROOT))
            assert names == 2 * len(merge.findall(code)), f"{path.relative_to(ROOT)}: {expr}"
    assert len(readers) >= 3, f"the scan found too few readers: it is broken ({readers})"
    python = [p for p in ROOT.glob("rig_mcp/*.py") if "rig_vllm_host_flags" in p.read_text()]
    assert python == [ROOT / "rig_mcp" / "capacity.py"]


def test_molecule_finds_the_plugins_ansible_cfg_names() -> None:
    """Molecule writes its own ansible.cfg: its env must name every plugin folder the project's does."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    plugins = {
        k: v for k, v in cfg["defaults"].items() if k.endswith("_plugins") and v.startswith("plugins/")
    }
    assert "filter_plugins" in plugins and "lookup_plugins" in plugins
    for scenario in sorted(ROOT.glob("molecule/*/molecule.yml")):
        env = yaml.safe_load(scenario.read_text())["provisioner"]["env"]
        for key, path in plugins.items():
            assert env.get(f"ANSIBLE_{key.upper()}") == f"${{MOLECULE_PROJECT_DIRECTORY}}/{path}", scenario
