"""Write a module_utils file, as the module imported it, to a path on the managed host.

The checks a rig runs before every start (``clamp-check``, ``tpu_inference_patch.py check``) are
the patch modules' own module_utils files run as scripts. A module installs its checker from the
code it runs, so the rig's check and the module's patch cannot drift apart and no role keeps a
copy. The bytes come from the module's loader: under AnsiballZ that reads the payload's zip, as
it reads the file when the module is imported from the project.
"""

from __future__ import annotations

import os
import tempfile
from types import ModuleType
from typing import Any

from ansible.module_utils.basic import AnsibleModule


def source_of(module_utils: ModuleType) -> bytes:
    """The exact bytes of an imported module's file."""
    return module_utils.__loader__.get_data(module_utils.__file__)


def install(module: Any, module_utils: ModuleType, dest: str) -> dict[str, Any]:
    """Make ``dest`` hold ``module_utils``'s source, with the task's owner, group and mode.

    ``module`` is the running AnsibleModule (``add_file_common_args=True``). Check mode writes
    nothing; ``changed`` is true only when the bytes or the file's attributes differ.
    """
    wanted = source_of(module_utils)
    try:
        with open(dest, "rb") as fh:
            current: bytes | None = fh.read()
    except FileNotFoundError:
        current = None
    changed = current != wanted
    result: dict[str, Any] = {"checker": dest}
    if changed or module._diff:
        result["diff"] = {
            "before_header": dest,
            "after_header": dest,
            "before": (current or b"").decode("utf-8", "replace"),
            "after": wanted.decode("utf-8"),
        }
    if changed and not module.check_mode:
        # Beside the target, then atomic_move: a crash leaves the old checker or the new one.
        fd, tmp = tempfile.mkstemp(prefix=".checker.", dir=os.path.dirname(dest) or ".")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(wanted)
            module.atomic_move(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if current is not None or not module.check_mode:
        changed = module.set_fs_attributes_if_different(
            module.load_file_common_arguments(module.params, path=dest), changed
        )
    result["changed"] = changed
    return result


def patch_module(code: ModuleType, argument_spec: dict[str, Any], targets: tuple[str, ...]) -> AnsibleModule:
    """The AnsibleModule of a module that patches with ``code``: exactly one of ``targets`` (the
    options that name what to patch) and ``checker``. With ``checker``, it installs and exits here."""
    where = (*targets, "checker")
    module = AnsibleModule(
        argument_spec=dict(argument_spec, checker={"type": "path"}),
        mutually_exclusive=[where],
        required_one_of=[where],
        add_file_common_args=True,
        supports_check_mode=True,
    )
    if module.params["checker"]:
        module.exit_json(**install(module, code, module.params["checker"]))
    return module
