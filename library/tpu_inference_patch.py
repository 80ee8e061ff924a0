#!/usr/bin/python
"""Ansible module: apply, remove or check the gemma-rig patch of tpu-inference 0.29.0."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tpu_inference_patch
short_description: Patch tpu-inference 0.29.0 (vllm-tpu's JAX backend) to serve the rig's W8A8 Gemma 4 E2B
description:
  - Adds what C(tpu-inference==0.29.0) lacks to serve a text-only, compressed-tensors
    C(int-quantized) (int8 W8A8) Gemma 4 E2B on a Cloud TPU, and nothing else.
  - An int8 W8A8 linear method on the JAX compressed-tensors path (0.29.0 has fp8 W8A8 only),
    with a variant for the merged gate_up linear. Activations are quantized per token to int8 so the
    matrix units multiply int8 by int8 into int32, then the result is scaled by both scales. The
    matmul is a new file, C(layers/jax/quantization/gemma_rig_int8.py).
  - A text-only Gemma 4 (C(Gemma4ForCausalLM), model_type C(gemma4_text)) in the JAX model
    C(models/jax/gemma4.py) reads its config where a multimodal one keeps C(text_config), and its
    C(model.*) weight names are routed like the release's C(model.language_model.*). Helpers in a new
    file, C(models/jax/gemma_rig_text_only.py).
  - KV-shared layers own no C(k_proj), C(v_proj) or C(k_norm) (they read the source layer's cache),
    so checkpoints without those tensors load (tpu-inference pull request 3299).
  - Each released file is recognised by its sha256 in the 0.29.0 wheel and every replacement's
    original text must occur exactly once; any other file is refused, naming what differs, and
    nothing is written. O(state=absent) restores the released bytes exactly and deletes the two
    added files only while they are still the module's. O(state=check) changes nothing and fails
    unless the patch is present exactly, which is what a rig runs before every start (a reinstall
    or upgrade of tpu-inference silently removes the patch).
  - The same logic runs standalone as C(python tpu_inference_patch.py check --python PY), the
    check a rig's unit runs before every start, which O(checker) writes to the rig from this module's own code.
version_added: "0.1.0"
author: gemma-rig contributors !UNKNOWN
options:
  package_dir:
    description:
      - The installed C(tpu_inference) package directory (in a virtualenv's site-packages).
      - Exactly one of O(package_dir), O(python) and O(checker) is required.
    type: path
  python:
    description:
      - An interpreter (for example C(/opt1/venv/bin/python)) whose installed tpu-inference is patched.
      - The package is located with C(importlib.util.find_spec), without importing it.
    type: path
  state:
    description:
      - V(present) applies the patch (exactly once), V(absent) removes it, V(check) fails unless it is present.
    type: str
    choices: [present, absent, check]
    default: present
extends_documentation_fragment: [ansible.builtin.files, patch_checker]
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
notes:
  - For tpu-inference 0.29.0 only, on one chip (tensor parallel 1); the int8 method refuses more.
  - Reinstalling or upgrading tpu-inference removes the patch; run O(state=check) before each start.
seealso:
  - name: tpu-inference pull request 3299
    description: KV-shared Gemma 4 layers that own no K/V parameters.
    link: https://github.com/vllm-project/tpu-inference/pull/3299
"""

EXAMPLES = r"""
- name: Patch the rig's tpu-inference
  tpu_inference_patch:
    python: /opt1/venv/bin/python
    state: present

- name: Refuse to start unless the patch is there
  tpu_inference_patch:
    python: /opt1/venv/bin/python
    state: check

- name: Remove it, restoring the released files byte for byte
  tpu_inference_patch:
    package_dir: /opt1/venv/lib/python3.12/site-packages/tpu_inference
    state: absent

- name: Install the check a unit runs before every start
  tpu_inference_patch:
    checker: /usr/local/libexec/gemma-rig/tpu_inference_patch.py
    mode: "0644"
"""

RETURN = r"""
checker:
  description: Where the check was written.
  returned: with O(checker)
  type: str
  sample: /usr/local/libexec/gemma-rig/tpu_inference_patch.py
package_dir:
  description: The tpu_inference package directory that was checked or patched.
  returned: unless O(checker)
  type: str
  sample: /opt1/venv/lib/python3.12/site-packages/tpu_inference
files:
  description: Each file the patch owns, relative to O(package_dir), and whether the task changed it.
  returned: unless O(checker)
  type: list
  elements: dict
  contains:
    path:
      description: The file, relative to the package directory.
      type: str
    changed:
      description: Whether the task changed (or, in check mode, would change) it.
      type: bool
  sample: [{"path": "models/jax/gemma4.py", "changed": true}]
diff:
  description: Each changed file before and after (what C(--diff) shows); an absent file is empty (with O(checker), one dict for it).
  returned: when changed or in diff mode
  type: list
  elements: dict
"""

import ansible.module_utils.tpu_inference_patch as patch_code  # noqa: E402
from ansible.module_utils.own_source import patch_module  # noqa: E402
from ansible.module_utils.tpu_inference_patch import (  # noqa: E402
    PatchError,
    locate,
    plan,
    write,
)


def main() -> None:
    """Plan every file's wanted text, compare, and write only what differs (never in check mode)."""
    module = patch_module(
        patch_code,
        {
            "package_dir": {"type": "path"},
            "python": {"type": "path"},
            "state": {"type": "str", "choices": ["present", "absent", "check"], "default": "present"},
        },
        ("package_dir", "python"),
    )
    params = module.params
    try:
        package_dir = params["package_dir"] or locate(params["python"])
        changes = plan(package_dir, params["state"])
    except (OSError, UnicodeDecodeError, SyntaxError, PatchError) as exc:
        module.fail_json(msg=str(exc), package_dir=params["package_dir"] or "")

    changed = any(c.changed for c in changes)
    result = {
        "changed": changed,
        "package_dir": package_dir,
        "files": [{"path": c.path, "changed": c.changed} for c in changes],
    }
    if changed or module._diff:
        result["diff"] = [
            {
                "before_header": f"{package_dir}/{c.path}",
                "after_header": f"{package_dir}/{c.path}",
                "before": c.before or "",
                "after": c.after or "",
            }
            for c in changes
            if c.changed or module._diff
        ]
    if changed and not module.check_mode:
        try:
            for change in changes:
                if change.changed:
                    write(package_dir, change)
        except OSError as exc:
            module.fail_json(msg=f"writing {package_dir}: {exc}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
