"""Run the project's cloud modules (library/gce_*.py, tpu_node.py) in-process against the fake API (fast: no ansible-playbook start-up).

The module code runs unchanged: its ``ansible.module_utils.gce_*`` imports resolve to the
repository's module_utils/, as they do when Ansible ships the module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import unittest.mock
from pathlib import Path
from typing import Any

import ansible.module_utils
from ansible.module_utils import _internal
from ansible.module_utils.common import warnings as module_warnings
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))


def load(name: str) -> Any:
    """Import library/NAME.py as a Python module."""
    spec = importlib.util.spec_from_file_location(f"{name}_module", ROOT / "library" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULES = {n: load(n) for n in ("gce_instance", "gce_firewall", "tpu_node", "rig_cost")}

# Defaults that keep tests fast: tiny backoff, anonymous credentials.
FAST = {"auth_kind": "anonymous", "retry_initial_delay": 0.01, "retry_deadline": 10, "operation_timeout": 20}
FAST_FIREWALL = {"auth_kind": "anonymous", "operation_timeout": 20}
FAST_TPU = dict(FAST, poll_interval=0.02, zone_wait=5)
PRESETS = {
    "gce_instance": FAST,
    "gce_firewall": FAST_FIREWALL,
    "tpu_node": FAST_TPU,
    "rig_cost": {"auth_kind": "anonymous"},
}


def run_module(
    endpoint: str, check: bool = False, diff: bool = False, module: str = "gce_instance", **params: Any
) -> dict[str, Any]:
    """Run the module once; returns its JSON result (``failed`` set when it failed)."""
    args = dict(PRESETS[module], api_endpoint=endpoint, **params)
    args["_ansible_check_mode"] = check
    args["_ansible_diff"] = diff
    out = io.StringIO()
    # A module starts in a fresh process with no warnings queued: one left over from an earlier
    # run in this process would otherwise show in this run's result.
    module_warnings._global_warnings.clear()
    module_warnings._global_deprecations.clear()
    # A module runs in its own process on the target, where ansible-core knows it is not the
    # controller. Once any test in this process imports controller code (a lookup plugin's tests
    # do, at collection), module.warn() would go to the controller's display instead of the result.
    with (
        unittest.mock.patch.object(_internal, "is_controller", False),
        patch_module_args(args),
        contextlib.redirect_stdout(out),
        contextlib.suppress(SystemExit),
    ):
        MODULES[module].main()
    return json.loads(out.getvalue())


def module_util(name: str) -> Any:
    """Import the repository's module_utils/NAME.py as Ansible would (ansible.module_utils.NAME)."""
    return importlib.import_module(f"ansible.module_utils.{name}")
