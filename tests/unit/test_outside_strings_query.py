"""playbooks/query.yml sends the user's prompt as data: byte for byte, never rendered, never run.

Real ansible-playbook and each rig's installed rigctl (the prompt reaches it on stdin) against
tests/fake_rig.py's FakeRig, which logs each POST's ``messages`` as received. One run covers many prompts: the inventory has one host per prompt, each a rig of its
own (its own FakeRig port and its own prompt), so a prompt that reached the wrong rig fails too.
"""

from __future__ import annotations

import json
import shutil
from contextlib import ExitStack
from pathlib import Path

import certifi
import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.fake_rig import FakeRig
from tests.unit.mcp_stack import installed_rigctl


def hostile_prompts(marker: Path) -> dict[str, str]:
    """Prompts that a template engine, a shell or a YAML loader would each change or run."""
    m = str(marker)
    return {
        "jinja_expr": "{{ 7*6 }}",
        "jinja_stmt": "{% if 1 %}x{% endif %}",
        "jinja_comment": "a{# c #}b",
        "jinja_lookup": "{{ lookup('pipe', 'touch " + m + "') }}",
        "shell_subst": f"$(touch {m})",
        "shell_semicolon": f"; touch {m}",
        "shell_backticks": f"`touch {m}`",
        "quotes": "it's \"quoted\" 'twice'",
        "newlines": "line one\nline two\n\n",
        "yaml_doc": "--- \nkey: value\n...",
        "yaml_tag": "!!python/object/apply:os.system ['touch " + m + "']",
        "yaml_anchor": "&a [1] *a",
        "unicode": "Ça va? 東京 \u200b\U0001f600",
        "nul": "before\x00after",
        "big": ("0123456789abcdef" * 6400)[:102400],  # 100 KB
        "backslashes": "C:\\new\\table \\u0041 %s %(x)s",
    }


def write_inventory(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    """An inventory of rigs reached on this machine, with the project's real group_vars."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "group_vars").symlink_to(ROOT / "inventory" / "group_vars")
    base = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    hosts = {name: {**base, **v} for name, v in hosts.items()}
    (inv / "hosts.yml").write_text(json.dumps({"rigs": {"hosts": hosts}}))
    return inv / "hosts.yml"


def received(rig: FakeRig) -> list:
    """Each chat completion's messages as the fake rig received them."""
    return [entry["messages"] for entry in rig.log if entry["path"] == "/v1/chat/completions"]


def run_query(tmp_path: Path, prompts: dict[str, str], per_host, *args: str) -> tuple[PlaybookRun, dict]:
    """Run query.yml on one rig per prompt; ``per_host(name, prompt)`` gives that host's vars."""
    with ExitStack() as stack:
        rigs = {name: stack.enter_context(FakeRig("m")) for name in prompts}
        hosts = {
            name: {
                "rig_ctl": str(installed_rigctl(tmp_path / name, rigs[name].port)),
                **per_host(name, prompts[name]),
            }
            for name in prompts
        }
        run = run_playbook(
            "playbooks/query.yml", *args, inventory=write_inventory(tmp_path, hosts), timeout=600
        )
    return run, {name: received(rig) for name, rig in rigs.items()}


def test_hostile_prompts_reach_the_model_byte_for_byte(tmp_path: Path) -> None:
    # Each prompt twice: from a file (prompt_file) and as an inventory variable (YAML, which
    # ansible-core 2.19 trusts as a template, like -e; the rig_text lookup reads it unrendered).
    marker = tmp_path / "MARKER"
    prompts = hostile_prompts(marker)
    files = tmp_path / "prompts"
    files.mkdir()
    for name, prompt in prompts.items():
        (files / name).write_bytes(prompt.encode())
    both = {f"{name}-{how}": prompt for name, prompt in prompts.items() for how in ("file", "var")}

    def per_host(host: str, prompt: str) -> dict:
        name, how = host.rsplit("-", 1)
        return {"prompt_file": str(files / name)} if how == "file" else {"prompt": prompt}

    run, got = run_query(tmp_path, both, per_host, "--forks", "16")
    assert run.rc == 0, run.output[-3000:]
    assert run.total("failed", both) == 0
    for host, prompt in both.items():
        assert got[host] == [[{"role": "user", "content": prompt}]], host
    assert not marker.exists()


@pytest.mark.parametrize("form", ["key=value", "json", "vars_file_unsafe", "vars_file_plain", "words"])
def test_every_extra_vars_form_sends_the_prompt_as_typed(tmp_path: Path, form: str) -> None:
    marker = tmp_path / "MARKER"
    prompt = "{{ lookup('pipe', 'touch " + str(marker) + "') }} {{ 7*6 }} {% if 1 %}x{% endif %}"
    if form == "words":
        # The everyday question, quoted inside the argument as query.yml's header says.
        prompt = "What is the capital of France? {{ 7*6 }}"
        args = ["-e", f"prompt='{prompt}'"]
    elif form == "key=value":
        # -e's key=value parsing splits on unquoted spaces: the whole value is quoted, as a shell
        # user would write -e "prompt='...'".
        args = ["-e", "prompt=" + json.dumps(prompt)]
    elif form == "json":
        args = ["-e", json.dumps({"prompt": prompt})]
    else:
        tag = "!unsafe " if form == "vars_file_unsafe" else ""
        (tmp_path / "vars.yml").write_text(f"prompt: {tag}{json.dumps(prompt)}\n")
        args = ["-e", "@" + str(tmp_path / "vars.yml")]
    run, got = run_query(tmp_path, {"r": prompt}, lambda name, prompt: {}, *args)
    assert run.rc == 0, run.output[-3000:]
    assert got["r"] == [[{"role": "user", "content": prompt}]]
    assert not marker.exists()


def test_a_missing_prompt_file_fails_with_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no such; $(touch x) {{ 7*6 }}"
    run, got = run_query(tmp_path, {"r": ""}, lambda name, prompt: {"prompt_file": str(missing)})
    assert run.rc != 0
    assert (
        f"prompt_file must be a readable file on the controller, got {json.dumps(str(missing))}" in run.output
    )
    assert got["r"] == []


def test_the_key_reaches_rigctl_on_stdin_only(tmp_path: Path) -> None:
    """On a rig, rigctl sends tpu.env's key; with -e via_gateway=true the role's own rigctl, run on
    the controller, asks each gateway with its client key and CA file and says which rig answered.
    The key goes in on stdin, never as an argument, and is never shown."""
    task = yaml.safe_load((ROOT / "roles/vllm_service/tasks/query.yml").read_text())[0]
    command = task["ansible.builtin.command"]
    assert "key" not in command["argv"] and "vllm_service_query_api_key" in command["stdin"]
    ca_dir = tmp_path / "gateway"
    ca_dir.mkdir()
    shutil.copy(certifi.where(), ca_dir / "gw.crt")  # a CA file rigctl can load
    with FakeRig("m") as rig, FakeRig("m") as gateway:
        base = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
        gw = {**base, "gateway_url": f"http://127.0.0.1:{gateway.port}", "gateway_client_api_key": "sk-GATEWAY",
              "gateway_controller_dir": str(ca_dir)}  # fmt: skip
        r = {**base, "rig_ctl": str(installed_rigctl(tmp_path / "r", rig.port, key="sk-RIG"))}
        (tmp_path / "group_vars").symlink_to(ROOT / "inventory" / "group_vars")
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(json.dumps({"rigs": {"hosts": {"r": r}}, "gateways": {"hosts": {"gw": gw}}}))
        on_rig = run_playbook("playbooks/query.yml", "-e", "prompt=hi", inventory=inventory)
        through = run_playbook(
            "playbooks/query.yml", "-e", "prompt=hi", "-e", "via_gateway=true", inventory=inventory
        )
    assert on_rig.rc == 0 and through.rc == 0, on_rig.output[-3000:] + through.output[-3000:]
    assert {e["authorization"] for e in rig.log} == {"Bearer sk-RIG"}
    assert {e["authorization"] for e in gateway.log} == {"Bearer sk-GATEWAY"}
    assert received(rig) == received(gateway) == [[{"role": "user", "content": "hi"}]]
    for run in (on_rig, through):
        assert "- 'm: Paris'" in run.output and "- 'tokens: 5 in, 1 out'" in run.output
        assert "sk-" not in run.output
    assert f"answered by ? through http://127.0.0.1:{gateway.port}" in through.output


@pytest.mark.parametrize("form", ["key=value", "vars_file_unsafe"])
def test_a_value_beside_the_prompt_is_the_operators_template_unless_tagged_unsafe(
    tmp_path: Path, form: str
) -> None:
    """-e max_tokens='{{ 7*6 }}' is rendered (42: -e is the operator's own Jinja, docs/security.md);
    the same text from a wrapper's `-e @file` with !unsafe stays text and is refused in one line,
    and a lookup in it never runs."""
    marker = tmp_path / "MARKER"
    value = "{{ 7*6 }}{{ lookup('pipe', 'touch " + str(marker) + "') }}"
    if form == "key=value":
        args = ["-e", "max_tokens={{ 7*6 }}"]
    else:
        (tmp_path / "vars.yml").write_text(f"max_tokens: !unsafe {json.dumps(value)}\n")
        args = ["-e", "@" + str(tmp_path / "vars.yml")]
    with FakeRig("m") as rig:
        hosts = {"r": {"rig_ctl": str(installed_rigctl(tmp_path / "r", rig.port))}}
        run = run_playbook("playbooks/query.yml", *args, inventory=write_inventory(tmp_path, hosts))
        sent = [e.get("max_tokens") for e in rig.log if e["path"] == "/v1/chat/completions"]
    if form == "key=value":
        assert run.rc == 0 and sent == [42], run.output[-3000:]
    else:
        assert run.rc != 0 and sent == []
        assert f"max_tokens must be a whole number of tokens, got {json.dumps(value)}" in run.output, (
            run.output[-3000:]
        )
    assert not marker.exists()
