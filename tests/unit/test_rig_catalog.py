"""The catalog lookup (plugins/lookup/rig_catalog.py): one place that checks a key and derives
the entry's build path and targets; the roles and swap.yml ask it instead of checking themselves."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

_SPEC = importlib.util.spec_from_file_location("rig_catalog", ROOT / "plugins" / "lookup" / "rig_catalog.py")
assert _SPEC and _SPEC.loader
rig_catalog = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(rig_catalog)

from ansible.errors import AnsibleLookupError  # noqa: E402

CATALOG: dict[str, Any] = yaml.safe_load(
    (ROOT / "inventory" / "group_vars" / "all" / "models.yml").read_text()
)["rig_models"]
CONVERTER = str(ROOT / "repack" / "repack_q4_0.py")


def resolve(key: object, catalog: dict[str, Any] | None = None, converter: str = CONVERTER) -> dict[str, Any]:
    return rig_catalog.resolve(key, CATALOG if catalog is None else catalog, "/b", "rig_model", converter)


def test_the_converter_lists_its_targets() -> None:
    from repack.steps import STEPS

    res = subprocess.run(
        [str(VENV_BIN / "python"), CONVERTER, "--list-targets"], capture_output=True, text=True, check=True
    )
    assert res.stdout.split() == sorted(STEPS)


def test_a_repack_entry_gets_its_build_path_and_the_converters_targets() -> None:
    found = resolve("tiny-emb4")
    assert found["kind"] == "repack" and found["entry"] == CATALOG["tiny-emb4"]
    assert found["build_dir"] == "/b/models/tiny-emb4"
    assert found["targets"] == ["emb4", "text", "w4a16", "w8a8"]


def test_hub_and_dir_entries() -> None:
    assert resolve("bf16")["build_dir"] == "" and resolve("bf16")["targets"] == []
    mine = {"mine": {"source": {"kind": "dir", "path": "/ckpt/mine"}}}
    assert resolve("mine", mine)["build_dir"] == "/ckpt/mine"


# The reference rig's published builds: pulled on the rig like any hub entry, nothing to repack.
PUBLISHED = {
    "xbill9-emb4": "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text-emb4",
    "xbill9-w8a8": "xbill9/gemma-4-E2B-it-qat-w8a8-int8",
}


@pytest.mark.parametrize(("key", "repo"), sorted(PUBLISHED.items()))
def test_the_published_builds_are_hub_entries(key: str, repo: str) -> None:
    found = resolve(key)
    assert found["kind"] == "hub" and found["entry"]["source"] == {
        "kind": "hub", "repo": repo, "revision_unpinned": True,
    }  # fmt: skip
    assert found["revision"] == "main"
    assert found["build_dir"] == "" and found["targets"] == []
    # Text-only builds like their repack twins: no tower flag, the same size on disk.
    twin = CATALOG[key.removeprefix("xbill9-")]
    assert found["entry"]["vllm_args"] == twin["vllm_args"] == []
    assert found["entry"]["size_bytes"] == twin["size_bytes"]


def test_every_hub_entry_is_pinned_or_says_it_is_not() -> None:
    hub = {k: e["source"] for k, e in CATALOG.items() if e["source"]["kind"] == "hub"}
    assert hub
    for key, source in hub.items():
        assert resolve(key)["revision"] == source.get("revision", "main"), key


COMMIT = "5f1c3a9e0b7d2c4e6f8091a2b3c4d5e6f7a8b9c0"


def test_a_pinned_hub_entry_gives_its_commit_and_other_kinds_none() -> None:
    pinned = {"p": {"source": {"kind": "hub", "repo": "o/m", "revision": COMMIT}}}
    assert resolve("p", pinned)["revision"] == COMMIT
    assert resolve("tiny-emb4")["revision"] == ""


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({}, "needs a revision (a 40-hex commit) or revision_unpinned: true"),
        (
            {"revision": "main"},
            "revision must be a commit (40 lower-case hex digits), not a branch or tag; got 'main'",
        ),
        ({"revision": COMMIT[:12]}, "not a branch or tag"),
        ({"revision": COMMIT.upper()}, "not a branch or tag"),
        ({"revision": COMMIT + "\nmain"}, "got '" + COMMIT + "\\nmain'"),  # one line, the newline escaped
        ({"revision": 12345}, "got 12345"),
        ({"revision_unpinned": "yes"}, "revision_unpinned must be true or false; got 'yes'"),
        ({"revision": COMMIT, "revision_unpinned": True}, "has both a revision and revision_unpinned"),
    ],
)
def test_a_hub_revision_that_is_not_a_commit_is_refused(source: dict[str, Any], message: str) -> None:
    """Hostile: a branch or tag (it moves), a short or upper-case id, a smuggled second line."""
    with pytest.raises(AnsibleLookupError, match=re.escape(message)) as err:
        resolve("h", {"h": {"source": {"kind": "hub", "repo": "o/m", **source}}})
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("rig_models['h'].source")


def test_targets_come_from_the_converter_not_a_list_of_our_own(tmp_path: Path) -> None:
    """A converter that offers other targets makes the same catalog entry invalid."""
    fake = tmp_path / "converter.py"
    fake.write_text("import sys\nif '--list-targets' in sys.argv:\n    print('int2')\n")
    with pytest.raises(
        AnsibleLookupError, match=r"target must be one of the converter's targets \(int2\); got 'emb4'"
    ):
        resolve("tiny-emb4", converter=str(fake))
    fake.write_text("import sys\nsys.exit('broken')\n")
    with pytest.raises(AnsibleLookupError, match="named no targets"):
        resolve("tiny-emb4", converter=str(fake))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"source": {"kind": "ftp"}}, "needs kind 'repack'"),
        ({"nosource": 1}, "needs kind 'repack'"),
        ({"source": {"kind": "hub"}}, "of kind 'hub' and needs a non-empty 'repo'"),
        ({"source": {"kind": "dir", "path": ""}}, "of kind 'dir' and needs a non-empty 'path'"),
        ({"source": {"kind": "repack", "target": "emb4"}}, "of kind 'repack' and needs a non-empty 'qat'"),
    ],
)
def test_incomplete_sources_are_named(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(AnsibleLookupError, match=re.escape(message)) as err:
        resolve("x", {"x": entry})
    assert "rig_models['x'].source" in str(err.value)


def test_a_bad_key_is_one_line_naming_it_and_every_valid_key() -> None:
    with pytest.raises(AnsibleLookupError) as err:
        resolve("nope")
    valid = ", ".join(sorted(CATALOG))
    assert str(err.value) == f"rig_model 'nope' is not in the catalog (rig_models); valid keys: {valid}"


@pytest.mark.parametrize("key", ["nope", "tiny-emb4"])
def test_through_ansible(tmp_path: Path, key: str) -> None:
    """As the roles call it: the project's inventory, ansible.cfg's lookup_plugins."""
    play = tmp_path / "play.yml"
    expr = "lookup('rig_catalog', k, catalog=rig_models, build_dir=rig_controller_build_dir, var='model')"
    play.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.debug": {"msg": "{{ (" + expr + ") | to_json }}"},
                            "vars": {"k": key},
                        }
                    ],
                }
            ]
        )
    )
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(ROOT / "inventory" / "local.yml"), str(play)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal"},
    )  # fmt: skip
    out = res.stdout + res.stderr
    if key == "nope":
        assert res.returncode != 0
        line = next(line for line in out.splitlines() if "is not in the catalog" in line)
        assert line.endswith(
            f"model 'nope' is not in the catalog (rig_models); valid keys: {', '.join(sorted(CATALOG))}"
        )
    else:
        assert res.returncode == 0, out
        # The callback wraps long messages at blanks.
        assert f'"build_dir": "{ROOT}/build/models/tiny-emb4"' in " ".join(out.split())


def test_no_role_or_playbook_checks_the_catalog_itself() -> None:
    """The four "is the configured key in the catalog" asserts and the two build paths are gone: one lookup.

    A key read back from a rig (tpu.env's RIG_MODEL_KEY) is different: it is data, checked for
    membership where it is read so the refusal can name the rig and the file; those checks test a
    fact or a read-back variable, never a key the user configured.
    """
    sources = [*ROOT.glob("roles/*/*/*.yml"), *ROOT.glob("playbooks/**/*.yml"), ROOT / "swap.yml"]
    configured = (
        r"\b(rig_model|model|repack_model|item|rig_config_model|checkpoint_model)\s+in\s+rig_models\b"
    )
    for path in sources:
        text = path.read_text()
        assert not re.search(configured, text), f"{path.relative_to(ROOT)} checks the catalog itself"
        assert "'/models/' ~" not in text and "/models/{{ repack_model }}" not in text, path


def test_site_fails_first_on_a_bad_rig_model_with_the_one_line() -> None:
    """playbooks/checkpoint.yml (the first play of site.yml to read the catalog) asks the lookup."""
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), str(ROOT / "playbooks" / "checkpoint.yml"), "-e", "rig_model=nope", "--check"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode != 0
    assert (
        f"rig_model 'nope' is not in the catalog (rig_models); valid keys: {', '.join(sorted(CATALOG))}"
        in (res.stdout + res.stderr)
    )


def test_every_build_of_one_model_shares_its_alias() -> None:
    """The catalog's builds of Gemma 4 E2B answer to one name, the tiny builds to another, so a
    swap between builds of one model leaves a client's model name valid."""
    tiny = {key for key in CATALOG if key.startswith("tiny-")}
    assert {resolve(key)["alias"] for key in tiny} == {"tiny-gemma-4"}
    assert {resolve(key)["alias"] for key in CATALOG.keys() - tiny} == {"gemma-4-e2b"}
    assert resolve("mine", {"mine": {"source": {"kind": "dir", "path": "/m"}}})["alias"] == ""


@pytest.mark.parametrize(
    ("alias", "wrong"),
    [
        ("tiny emb4", "must be a plain name"),
        ("$(touch pwned)", "must be a plain name"),
        ("-x", "must be a plain name"),
        ("a" * 129, "must be a plain name"),
        (["a"], "must be a plain name"),
        ("other", "is also a catalog key"),
    ],
)
def test_an_alias_that_is_no_plain_name_or_is_a_key_is_refused(alias: object, wrong: str) -> None:
    catalog = {
        "mine": {"source": {"kind": "dir", "path": "/m"}, "alias": alias},
        "other": {"source": {"kind": "dir", "path": "/o"}},
    }
    with pytest.raises(AnsibleLookupError, match=re.escape("rig_models['mine'].alias")) as err:
        resolve("mine", catalog)
    assert wrong in str(err.value)
