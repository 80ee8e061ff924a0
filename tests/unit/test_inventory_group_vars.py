"""Settings a user writes as group vars in an inventory file reach the hosts.

Ansible ranks the project's inventory/group_vars/all above group vars written in an inventory
file: anything defined there silently beats a user's `gce: vars:`. The endpoint's source ranges
are therefore left undefined there (the roles default them to an empty list).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT


def test_source_ranges_in_an_inventory_files_group_vars_reach_the_rig(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yml"
    extra.write_text(
        yaml.safe_dump(
            {"rigs": {"children": {"gce": {"vars": {"rig_endpoint_source_ranges": ["203.0.113.0/24"]}}}}}
        )
    )
    out = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", "inventory/gce.yml", "-i", str(extra),
         "--host", "gemma-rig-1"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["rig_endpoint_source_ranges"] == ["203.0.113.0/24"]
