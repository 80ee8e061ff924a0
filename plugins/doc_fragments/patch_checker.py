"""The O(checker) option of the modules that patch code a rig checks before every start
(turing_clamp, tpu_inference_patch): module_utils/own_source.py writes it."""

from __future__ import annotations


class ModuleDocFragment:
    """``extends_documentation_fragment: [ansible.builtin.files, patch_checker]``."""

    DOCUMENTATION = r"""
options:
  checker:
    description:
      - Instead of patching, write the check a rig runs before every start to this path, with
        O(owner), O(group) and O(mode). It is this module's own patch code (its module_utils file)
        as a script, run as C(PY -I CHECKER check --python PY), so the check and the patch cannot differ.
      - Exclusive with the options that name what to patch.
    type: path
"""
