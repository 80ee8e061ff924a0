#!/usr/bin/python
"""Ansible module: apply or remove the gemma-rig Turing clamp in vLLM 0.29.0."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: turing_clamp
short_description: Clamp vLLM 0.29.0's Triton attention tiles so head size 512 fits a Turing GPU
description:
  - Inserts (or removes) a small block in C(vllm/v1/attention/ops/triton_unified_attention.py) of
    vLLM 0.29.0. When the device's major compute capability is below 8 (Turing, sm75), the block
    halves the prefill and decode KV tile sizes (not below 16) until the shared memory estimate,
    C(BLOCK_M + 2 * tile) times C(head_size * element_size), fits O(smem_budget) bytes, and launches
    the kernel with one pipeline stage. On capability 8.0 and newer, and where the capability is
    unknown (vLLM's CPU build), the block does nothing.
  - Without it, Gemma 4's head size 512 asks for ~96 KiB of shared memory per block and fails on a
    T4 (64 KiB) with C(OutOfResources).
  - Idempotent through a marker comment. O(state=absent) restores the original bytes exactly.
  - Before writing, it checks that the code around the insertion point is vLLM 0.29.0's; if an
    anchor is missing it fails, names the anchor, and changes nothing. The patched file is
    compiled before it replaces the original (atomically, keeping owner and mode).
  - The same logic runs standalone as the vllm service's C(ExecStartPre) check,
    C(clamp-check check --python PY), which O(checker) writes to the rig from this module's own code.
version_added: "0.1.0"
author: gemma-rig contributors !UNKNOWN
options:
  path:
    description:
      - The C(triton_unified_attention.py) file to patch.
      - Exactly one of O(path), O(python) and O(checker) is required.
    type: path
  python:
    description:
      - An interpreter (for example C(/opt1/venv/bin/python)) whose installed vLLM is patched.
      - The file is located with C(importlib.util.find_spec), without importing vLLM.
    type: path
  state:
    description: Whether the clamp is present (exactly once) or absent.
    type: str
    choices: [present, absent]
    default: present
  smem_budget:
    description:
      - Shared memory, in bytes, that a kernel block may use on a device with major capability
        below 8. Turing allows 65536 with opt-in; the default leaves room for the kernel's own
        scratch.
      - A clamp applied with another budget is replaced.
    type: int
    default: 60000
extends_documentation_fragment: [ansible.builtin.files, patch_checker]
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
notes:
  - Reinstalling or upgrading vLLM removes the clamp; the vllm service refuses to start without it.
seealso:
  - name: vLLM issue 36802 (Triton attention shared memory on Turing)
    description: The failure this clamp works around.
    link: https://github.com/vllm-project/vllm/issues/36802
"""

EXAMPLES = r"""
- name: Apply the Turing clamp to the rig's vLLM
  turing_clamp:
    python: /opt1/venv/bin/python
    state: present

- name: Apply it to a copy of the file with a smaller budget
  turing_clamp:
    path: /tmp/triton_unified_attention.py
    smem_budget: 49152

- name: Remove it, restoring vLLM's original file
  turing_clamp:
    python: /opt1/venv/bin/python
    state: absent

- name: Install the check a unit runs before every start
  turing_clamp:
    checker: /usr/local/libexec/gemma-rig/clamp-check
    mode: "0755"
"""

RETURN = r"""
checker:
  description: Where the check was written.
  returned: with O(checker)
  type: str
  sample: /usr/local/libexec/gemma-rig/clamp-check
path:
  description: The file that was checked or patched.
  returned: unless O(checker)
  type: str
  sample: /opt1/venv/lib/python3.11/site-packages/vllm/v1/attention/ops/triton_unified_attention.py
occurrences:
  description: How many clamp blocks the file holds after the task (or would hold, in check mode).
  returned: unless O(checker)
  type: int
  sample: 1
occurrences_before:
  description: How many clamp blocks the file held before the task.
  returned: unless O(checker)
  type: int
  sample: 0
diff:
  description: The file before and after (what C(--diff) shows).
  returned: when changed or in diff mode
  type: dict
  contains:
    before:
      description: The file's text before.
      type: str
    after:
      description: The file's text after.
      type: str
"""

import os  # noqa: E402  (Ansible modules put their documentation first)
import tempfile  # noqa: E402

import ansible.module_utils.turing_clamp as clamp_code  # noqa: E402
from ansible.module_utils.own_source import patch_module  # noqa: E402
from ansible.module_utils.turing_clamp import (  # noqa: E402
    ClampError,
    apply,
    count,
    locate,
    remove,
)


def main() -> None:
    """Fetch the file, compute the wanted text, compare, and write only when they differ."""
    module = patch_module(
        clamp_code,
        {
            "path": {"type": "path"},
            "python": {"type": "path"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "smem_budget": {"type": "int", "default": 60000},
        },
        ("path", "python"),
    )
    params = module.params
    if params["smem_budget"] < 1:
        module.fail_json(msg=f"smem_budget must be a positive number of bytes, got {params['smem_budget']}")

    try:
        path = params["path"] or locate(params["python"])
    except ClampError as exc:
        module.fail_json(msg=str(exc))
    if not os.path.isfile(path):
        module.fail_json(msg=f"{path} does not exist or is not a file", path=path)

    try:
        with open(path, encoding="utf-8", newline="") as fh:
            before = fh.read()
        found_before = count(before)
        after = apply(before, params["smem_budget"]) if params["state"] == "present" else remove(before)
    except (OSError, UnicodeDecodeError, SyntaxError, ClampError) as exc:
        module.fail_json(msg=str(exc), path=path)

    changed = after != before
    result = {
        "changed": changed,
        "path": path,
        "occurrences_before": found_before,
        "occurrences": count(after),
    }
    if changed or module._diff:
        result["diff"] = {
            "before_header": path,
            "after_header": path,
            "before": before,
            "after": after,
        }
    if changed and not module.check_mode:
        # Write beside the target, then atomic_move: it keeps owner, mode and SELinux context,
        # and a crash leaves either the old file or the new one, never half of each.
        fd, tmp = tempfile.mkstemp(prefix=".turing_clamp.", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(after)
            module.atomic_move(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
