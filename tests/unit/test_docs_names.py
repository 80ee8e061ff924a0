"""The docs name only what exists: every repository path they put in backticks (or in a fenced block)
is in the tree, and every variable with a role's or the rig_ prefix is defined: by a role's
defaults, vars or argument specs, by group_vars or an example inventory (a commented example there
counts), by a role's set_fact or add_host, or read as optional (`| default(`, `is defined`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tests.golden.render import CASES, GOLDEN
from tests.unit.test_self_contained import PLATFORM_PLAYS

# Where a path the docs name starts: the repository's own folders.
PATH_ROOTS = (
    "roles/",
    "playbooks/",
    "library/",
    "module_utils/",
    "inventory/",
    "docs/",
    "tests/",
    "measure/",
    "evidence/",
    "repack/",
    "scripts/",
    "molecule/",
    "plugins/",
    "rig_mcp/",
)
# A role's own folders: a role's README names its files from there.
ROLE_DIRS = ("defaults/", "files/", "handlers/", "meta/", "tasks/", "templates/", "vars/")
# Google Cloud IAM roles (roles/compute.securityAdmin) are not the repository's roles/.
IAM_ROLE = re.compile(r"^roles/[a-z]+\.[A-Za-z0-9.]+$")
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
IDENT = re.compile(r"[a-z][a-z0-9_]*")
# `<platform>`, `{a,b}`, `*`: a placeholder stands for any name.
PLACEHOLDER = re.compile(r"<[^>]*>")
BRACES = re.compile(r"\{([^{}]*)\}")
COMMENTED_KEY = re.compile(r"^\s*#\s*([a-z][a-z0-9_]*):", re.M)
OPTIONAL_READ = re.compile(r"\b([a-z][a-z0-9_]*)\s*(?:\|\s*default\(|is (?:not )?defined)")
PY_DEF = re.compile(r"^\s*(?:async )?def ([a-z][a-z0-9_]*)", re.M)
# A name the docs also write as name.Attribute is a Python namespace (tpu_v2.Node), not a variable.
NAMESPACE = re.compile(r"^([a-z][a-z0-9_]*)\.[A-Za-z]")


def docs(root: Path) -> list[Path]:
    """The docs this test reads."""
    return sorted(
        [
            *root.glob("docs/*.md"),
            root / "README.md",
            root / "CONTRIBUTING.md",
            *root.glob("roles/*/README.md"),
        ]
    )


def spans(text: str) -> Iterator[str]:
    """Each backticked span, and each line of a fenced block, of a Markdown text."""
    for block in FENCE.findall(text):
        yield from block.splitlines()[1:-1]
    yield from SPAN.findall(FENCE.sub("", text))


def expand(token: str) -> list[str]:
    """A token's brace alternatives, written out."""
    match = BRACES.search(token)
    if not match:
        return [token]
    head, tail = token[: match.start()], token[match.end() :]
    return list(itertools.chain.from_iterable(expand(head + alt + tail) for alt in match.group(1).split(",")))


def paths_in(span: str, roots: tuple[str, ...]) -> Iterator[str]:
    """The paths under roots a span names (a command's arguments included), as globs; the file
    `ansible-vault create` makes is the user's own."""
    tokens = span.split()
    for before, token in zip(["", *tokens], tokens, strict=False):
        if before == "create":
            continue
        token = token.strip("'\"(),;:.").split("#")[0].split("::")[0]
        token = re.sub(r":\d+$", "", token)
        if token.startswith(roots) and not IAM_ROLE.match(token):
            for path in expand(token):
                yield PLACEHOLDER.sub("*", path).rstrip("/")


def missing_paths(root: Path) -> list[str]:
    """Each doc's path that matches nothing in the tree; a role's README may name its own files."""
    bad = []
    for doc in docs(root):
        base = doc.parent if doc.parent.parent.name == "roles" else root
        for span in spans(doc.read_text()):
            found = [(root, p) for p in paths_in(span, PATH_ROOTS)]
            found += [(root / "inventory", p) for p in paths_in(span, ("group_vars/",))]
            found += [(base, p) for p in paths_in(span, ROLE_DIRS)] if base != root else []
            for where, path in found:
                if not any(True for _ in where.glob(path)):
                    bad.append(f"{doc.relative_to(root)}: {(where / path).relative_to(root)}")
    return sorted(set(bad))


def _keys(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        yield from (str(k) for k in node)


def _inventory_vars(node: object) -> Iterator[str]:
    """The variables an inventory file sets: its groups' vars and its hosts'."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in {"vars", "hosts"} and isinstance(value, dict):
                for name, host in value.items():
                    yield from [str(name)] if key == "vars" else _keys(host)
            yield from _inventory_vars(value)


def _task_vars(node: object) -> Iterator[str]:
    """The names a task file sets (set_fact, add_host) or gives a task (vars:)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.split(".")[-1] in {"set_fact", "add_host", "vars"}:
                yield from _keys(value)
            yield from _task_vars(value)
    elif isinstance(node, list):
        for item in node:
            yield from _task_vars(item)


def defined_variables(root: Path) -> set[str]:
    """Every variable the roles, the plays, group_vars and the example inventories define or read as
    optional."""
    names: set[str] = set()
    vars_files = [
        *root.glob("inventory/group_vars/**/*.yml"),
        *root.glob("playbooks/vars/*.yml"),
        *root.glob("roles/*/defaults/*.yml"),
        *root.glob("roles/*/vars/*.yml"),
    ]
    for path in vars_files:
        text = path.read_text()
        names.update(_keys(yaml.safe_load(text)))
        names.update(COMMENTED_KEY.findall(text))
    for path in root.glob("inventory/*.yml"):
        text = path.read_text()
        names.update(_inventory_vars(yaml.safe_load(text)))
        names.update(COMMENTED_KEY.findall(text))
    for path in root.glob("roles/*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(path.read_text()).get("argument_specs") or {}).values():
            names.update(_keys(entry.get("options")))
    for path in [*root.glob("roles/*/tasks/**/*.yml"), *root.glob("playbooks/*.yml")]:
        names.update(_task_vars(yaml.safe_load(path.read_text())))
    for path in [*root.glob("roles/**/*.yml"), *root.glob("roles/**/*.j2"), *root.glob("playbooks/*.yml")]:
        names.update(OPTIONAL_READ.findall(path.read_text()))
    return names


def other_names(root: Path) -> set[str]:
    """Names with a variable's shape that are not variables: roles, groups, modules, plugins, files,
    folders and Python functions (a test's fixture)."""
    names = {p.name for p in root.glob("*") if p.is_dir()}
    for folder in (
        "roles",
        "library",
        "module_utils",
        "plugins/*",
        "roles/*/files",
        "roles/*/tasks",
        "rig_mcp",
    ):
        names.update(p.stem for p in root.glob(f"{folder}/*"))
    names.update(p.stem for p in root.glob("inventory/group_vars/*"))
    for path in root.glob("[!.]*/**/*.py"):
        names.update(PY_DEF.findall(path.read_text()))
    return names


def undefined_variables(root: Path) -> list[str]:
    """Each doc's rig_ or role variable that nothing defines; `name_*` or `name_` stands for any name
    it starts."""
    roles = tuple(f"{p.name}_" for p in root.glob("roles/*"))
    known = defined_variables(root) | other_names(root)
    texts = {doc: FENCE.sub("", doc.read_text()) for doc in docs(root)}
    all_spans = [span.strip() for text in texts.values() for span in SPAN.findall(text)]
    known |= {m.group(1) for span in all_spans if (m := NAMESPACE.match(span))}
    bad = []
    for doc, text in texts.items():
        for span in SPAN.findall(text):
            for name in expand(span.strip()):
                stem = PLACEHOLDER.sub("*", name)
                if not IDENT.fullmatch(stem.rstrip("*")) or not stem.startswith(("rig_", *roles)):
                    continue
                if stem.endswith(("*", "_")) and any(k.startswith(stem.rstrip("*")) for k in known):
                    continue
                if stem not in known:
                    bad.append(f"{doc.relative_to(root)}: {stem}")
    return sorted(set(bad))


def test_docs_name_only_paths_that_exist() -> None:
    assert missing_paths(ROOT) == []


def test_docs_name_only_variables_that_are_defined() -> None:
    assert undefined_variables(ROOT) == []


def test_a_stale_name_is_caught(tmp_path: Path) -> None:
    (tmp_path / "roles/vllm/defaults").mkdir(parents=True)
    (tmp_path / "roles/vllm/defaults/main.yml").write_text("vllm_package: vllm\n# vllm_hint: x\n")
    (tmp_path / "roles/vllm/tasks").mkdir()
    (tmp_path / "roles/vllm/tasks/main.yml").write_text("[]\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "Runs `roles/vllm/tasks/main.yml`, `roles/<role>/tasks/{main,x}.yml` and `playbooks/tasks/swap.yml`;"
        " sets `vllm_package`, `vllm_hint`, `vllm_pack*`, `vllm_`, `vllm_clamp_enabled`, `vllm_x_*`.\n"
        " Profile: `group_vars/byoh.yml`.\n"
        "```\nansible-vault create inventory/group_vars/all/vault.yml\n"
        ".venv/bin/python measure/run.py --out evidence/x\n```\n"
    )
    (tmp_path / "CONTRIBUTING.md").write_text("")
    (tmp_path / "roles/vllm/README.md").write_text("`defaults/main.yml`, `tasks/tpu_patch.yml`\n")
    assert missing_paths(tmp_path) == [
        "README.md: evidence/x",
        "README.md: inventory/group_vars/byoh.yml",
        "README.md: measure/run.py",
        "README.md: playbooks/tasks/swap.yml",
        "README.md: roles/*/tasks/x.yml",
        "roles/vllm/README.md: roles/vllm/tasks/tpu_patch.yml",
    ]
    assert undefined_variables(tmp_path) == ["README.md: vllm_clamp_enabled", "README.md: vllm_x_*"]


# A platform's guide where it is not docs/<platform>.md.
GUIDES = {"local": "docs/tiny-model.md"}


def test_every_platform_has_what_adding_a_platform_lists() -> None:
    """docs/platforms.md ("Adding a platform"): steps 1 to 4 for every platform, step 5's plays
    wherever there are any; nvidia_driver knows NVIDIA's Debian repositories only."""
    profiles = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "inventory/group_vars").glob("*.yml")}
    platforms = sorted(name for name, values in profiles.items() if values.get("rig_platform") == name)
    header = next(
        line for line in (ROOT / "docs/platforms.md").read_text().splitlines() if line.startswith("| key |")
    )
    contract = (ROOT / "docs/rig-contract.md").read_text()
    assert sorted(column.strip() for column in header.split("|")[3:-1]) == platforms
    for p in platforms:
        inventory = yaml.safe_load((ROOT / "inventory" / f"{p}.yml").read_text())
        assert p in inventory["rigs"]["children"], p
        assert p in CASES and all((GOLDEN / p / f).is_file() for f in ("tpu.env", "vllm.service")), p
        assert (ROOT / GUIDES.get(p, f"docs/{p}.md")).is_file() and f"  - `{p}`:" in contract, p
        for play in (f"provision_{p}.yml", f"teardown_{p}.yml"):
            if (ROOT / "playbooks" / play).exists():
                imported_by = ROOT / (
                    "playbooks/provision.yml" if play.startswith("provision") else "teardown.yml"
                )
                assert play in PLATFORM_PLAYS and play in imported_by.read_text(), play
    keys = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/main.yml").read_text())[
        "_nvidia_driver_repo_keys"
    ]
    assert all(k.startswith("debian") for k in keys)
