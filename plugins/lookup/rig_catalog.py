"""Lookup plugin: one catalog entry (rig_models), checked, with where it is built and the targets."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: rig_catalog
author: gemma-rig contributors !UNKNOWN
version_added: "0.1.0"
short_description: Look up one entry of the model catalog, checked, with its build path and targets
description:
  - Checks that the key names an entry of the catalog (C(rig_models)) and that the entry's
    C(source) is complete for its kind, then returns the entry with what is derived from it.
  - A bad key fails with one line that names the key and every valid key.
  - The repack targets are read from the converter (C(repack/repack_q4_0.py --list-targets)),
    so the catalog never restates them; the converter runs only for entries of kind C(repack).
  - The roles (rig_config, checkpoint, repack) and swap.yml call it once each, with
    C(ansible.builtin.set_fact), instead of checking the catalog themselves.
options:
  _terms:
    description: The catalog key (one).
    required: true
    type: str
  catalog:
    description: The catalog, C(rig_models).
    required: true
    type: dict
  build_dir:
    description:
      - The controller's build directory (C(rig_controller_build_dir)); repacked checkpoints are
        built in C(<build_dir>/models/<key>).
    required: true
    type: str
  var:
    description: The variable the key came from, named in the error message.
    type: str
    default: rig_model
  converter:
    description:
      - The repack converter to ask for its targets (default, the project's
        C(repack/repack_q4_0.py)), run with the Python that runs Ansible.
    type: str
"""

EXAMPLES = r"""
- name: Look up the served model once
  ansible.builtin.set_fact:
    _catalog: "{{ lookup('rig_catalog', rig_model, catalog=rig_models, build_dir=rig_controller_build_dir) }}"
"""

RETURN = r"""
_raw:
  description: The entry and what is derived from it.
  type: dict
  contains:
    key:
      description: The catalog key.
      type: str
    entry:
      description: The catalog entry as written in C(rig_models).
      type: dict
    kind:
      description: C(repack), C(hub) or C(dir).
      type: str
    build_dir:
      description:
        - Where the checkpoint lies on the controller, to push it from; C(<build_dir>/models/<key>)
          for C(repack), the C(path) of a C(dir) entry, empty for C(hub).
      type: str
    targets:
      description: The converter's build targets (C(repack) entries only; empty otherwise).
      type: list
      elements: str
    alias:
      description:
        - The entry's C(alias), the second name vLLM serves the build under (shared by every build
          of one model); empty when the entry has none. Checked to be a plain name that is no
          catalog key.
      type: str
    revision:
      description:
        - What a C(hub) entry is pulled at - its C(revision), a 40-hex commit, or C(main) for an entry
          marked C(revision_unpinned) (the pull records the commit it got either way); empty for the
          other kinds. A branch or tag name is refused - it moves.
      type: str
"""

import os  # noqa: E402  (Ansible plugins put their documentation first)
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

# plugins/lookup/rig_catalog.py -> the project root -> its converter.
DEFAULT_CONVERTER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "repack", "repack_q4_0.py"
)
KINDS = {"repack": "qat", "hub": "repo", "dir": "path"}  # each kind and the field it needs
# A name vLLM serves under and the gateway routes by: it lands in a unit's argv, a map file and
# HAProxy backend names, so a plain word only.
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
COMMIT = re.compile(r"[0-9a-f]{40}")  # a hub commit id as the hub API gives it (lower-case hex)


def converter_targets(converter: str) -> list[str]:
    """The build targets the converter offers (``--list-targets``, one a line)."""
    try:
        res = subprocess.run(
            [sys.executable, converter, "--list-targets"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AnsibleLookupError(f"cannot ask the converter {converter} for its targets: {exc}") from exc
    targets = res.stdout.split()
    if res.returncode != 0 or not targets:
        raise AnsibleLookupError(
            f"the converter {converter} named no targets (--list-targets, rc {res.returncode}): "
            f"{(res.stderr or res.stdout).strip()[-300:]}"
        )
    return targets


def resolve(key: object, catalog: dict, build_dir: str, var: str, converter: str) -> dict:
    """The checked entry and what derives from it; AnsibleLookupError naming what is wrong."""
    if not isinstance(catalog, dict) or not catalog:
        raise AnsibleLookupError("the catalog (rig_models) is empty or not a mapping")
    valid = ", ".join(sorted(catalog))
    if not isinstance(key, str) or key not in catalog:
        raise AnsibleLookupError(
            f"{var} {str(key)!r} is not in the catalog (rig_models); valid keys: {valid}"
        )
    entry = catalog[key]
    source = entry.get("source") if isinstance(entry, dict) else None
    kind = source.get("kind") if isinstance(source, dict) else None
    where = f"rig_models['{key}'].source"
    if kind not in KINDS:
        raise AnsibleLookupError(
            f"{where} needs kind 'repack' (with qat and target), 'hub' (with repo) or 'dir' (with path); got {source}"
        )
    if not str(source.get(KINDS[kind]) or "").strip():
        raise AnsibleLookupError(
            f"{where} is of kind '{kind}' and needs a non-empty '{KINDS[kind]}'; got {source}"
        )
    targets: list[str] = []
    if kind == "repack":
        targets = converter_targets(converter)
        if source.get("target") not in targets:
            raise AnsibleLookupError(
                f"{where}.target must be one of the converter's targets ({'|'.join(targets)}); "
                f"got {source.get('target')!r}"
            )
    revision = hub_revision(source, where) if kind == "hub" else ""
    alias = entry.get("alias", "")
    if alias != "" and (not isinstance(alias, str) or not SERVED_NAME.fullmatch(alias)):
        raise AnsibleLookupError(
            f"rig_models['{key}'].alias must be a plain name (letters, digits, '.', '_', '-'; at most 128); "
            f"got {str(alias)[:60]!r}"
        )
    if alias in catalog:
        raise AnsibleLookupError(
            f"rig_models['{key}'].alias {alias!r} is also a catalog key: a client naming it would not "
            "know which it gets; choose another alias"
        )
    build = {"repack": f"{build_dir}/models/{key}", "dir": str(source.get("path", "")), "hub": ""}[kind]
    return {
        "key": key,
        "entry": entry,
        "kind": kind,
        "build_dir": build,
        "targets": targets,
        "revision": revision,
        "alias": alias,
    }


def hub_revision(source: dict, where: str) -> str:
    """A hub entry's pinned commit, or ``main`` where the entry says in so many words it is unpinned."""
    revision = source.get("revision")
    unpinned = source.get("revision_unpinned", False)
    if not isinstance(unpinned, bool):
        raise AnsibleLookupError(f"{where}.revision_unpinned must be true or false; got {unpinned!r}")
    if revision is None:
        if not unpinned:
            raise AnsibleLookupError(
                f"{where} is of kind 'hub' and needs a revision (a 40-hex commit) or revision_unpinned: true"
            )
        return "main"
    if unpinned:
        raise AnsibleLookupError(f"{where} has both a revision and revision_unpinned: true; keep one")
    if not isinstance(revision, str) or not COMMIT.fullmatch(revision):
        shown = repr(revision)[:60]
        raise AnsibleLookupError(
            f"{where}.revision must be a commit (40 lower-case hex digits), not a branch or tag; got {shown}"
        )
    return revision


class LookupModule(LookupBase):
    """``lookup('rig_catalog', KEY, catalog=rig_models, build_dir=rig_controller_build_dir)``."""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleLookupError(f"rig_catalog takes exactly one catalog key, got {len(terms)}: {terms}")
        return [
            resolve(
                terms[0],
                self.get_option("catalog"),
                self.get_option("build_dir"),
                self.get_option("var"),
                self.get_option("converter") or DEFAULT_CONVERTER,
            )
        ]
