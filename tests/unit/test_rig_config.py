"""roles/rig_config run by real ansible-playbook (local connection) with the project's inventory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

# Each converge is a real ansible-playbook run (~3 s of CPU): keep them out of the fast suite.
pytestmark = pytest.mark.slow

CONTRACT_KEYS = [
    "RIG_MODEL_KEY",
    "RIG_MODEL",
    "RIG_SERVED_MODEL_NAME",
    "RIG_SERVED_ALIAS",
    "RIG_HOST",
    "RIG_PORT",
    "RIG_DTYPE",
    "RIG_KV_CACHE_DTYPE",
    "RIG_TENSOR_PARALLEL_SIZE",
    "RIG_GPU_MEMORY_UTILIZATION",
    "RIG_MAX_MODEL_LEN",
    "RIG_MAX_NUM_SEQS",
    "RIG_KV_CACHE_MEMORY_BYTES",  # the local profile's; every flag with a value has its own key
    "RIG_DISTRIBUTED_EXECUTOR_BACKEND",
    "RIG_EXTRA_ARGS",
]


VLLM_VARS = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all" / "vllm.yml").read_text())
CATALOG = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all" / "models.yml").read_text())["rig_models"]


def feature_words(model: str, platform: str) -> list[str]:
    """The agent flags a build gets, as the one table (rig_vllm_feature_flags) words them."""
    profile = yaml.safe_load((ROOT / "inventory" / "group_vars" / f"{platform}.yml").read_text())
    words: list[str] = []
    for feature in CATALOG[model].get("template_carries", []):
        if feature in profile["rig_vllm_features"]:
            for flag, value in VLLM_VARS["rig_vllm_feature_flags"][feature].items():
                words += [f"--{flag}"] + ([] if value is True else [str(value)])
    return words


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (double quotes stripped)."""
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        if value.startswith('"') and value.endswith('"'):
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        env[key] = value
    return env


class Rig:
    """One rig_config target on this machine: tpu.env under tmp_path, a platform group."""

    def __init__(self, tmp_path: Path, platform: str = "local") -> None:
        self.tmp = tmp_path
        self.env_file = tmp_path / "etc" / "tpu.env"
        self.marker = tmp_path / "restarted"
        # A second inventory source puts the host in the platform group; group_vars come from
        # the project's inventory/ directory.
        self.inventory = tmp_path / "hosts.yml"
        self.inventory.write_text(
            yaml.safe_dump({"rigs": {"children": {platform: {"hosts": {"rig-test": {}}}}}})
        )
        self.play = tmp_path / "play.yml"
        self.play.write_text(
            yaml.safe_dump(
                [
                    {
                        "hosts": "rig-test",
                        "gather_facts": False,
                        "roles": ["rig_config"],
                        "handlers": [
                            {
                                "name": "Record the restart",
                                "ansible.builtin.file": {"path": str(self.marker), "state": "touch"},
                                "listen": "restart vllm",
                            }
                        ],
                    }
                ]
            )
        )

    def run(self, *args: str, **extra_vars: Any) -> tuple[int, list[dict[str, Any]], str]:
        """Converge; return rc, the per-task results, and the raw output."""
        self.marker.unlink(missing_ok=True)
        evars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(VENV_BIN / "python"),
            "rig_config_env_file": str(self.env_file),
            "rig_config_group": "root",
            **extra_vars,
        }
        env = {
            **os.environ,
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
        }
        cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(ROOT / "inventory" / "local.yml")]
        cmd += ["-i", str(self.inventory), "-e", json.dumps(evars), *args, str(self.play)]
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        try:
            plays = json.loads(res.stdout)["plays"]
        except (json.JSONDecodeError, KeyError):
            plays = []  # failed before the play (argument validation, bad vars)
        tasks = [t["hosts"].get("rig-test", {}) for p in plays for t in p["tasks"]]
        return res.returncode, tasks, res.stdout + res.stderr

    def changed(self, tasks: list[dict[str, Any]]) -> int:
        return sum(1 for t in tasks if t.get("changed"))


def test_local_renders_contract_keys_mode_and_restarts(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rc, tasks, out = rig.run()
    assert rc == 0, out
    env = parse_env(rig.env_file.read_text())
    assert [k for k in env if k.startswith("RIG_")] == CONTRACT_KEYS
    assert env["RIG_MODEL_KEY"] == env["RIG_SERVED_MODEL_NAME"] == "tiny-emb4"
    assert env["RIG_MODEL"] == "/opt1/models/current"
    assert (env["RIG_HOST"], env["RIG_PORT"]) == ("127.0.0.1", "8000")
    assert env["RIG_DTYPE"] == "bfloat16"
    assert env["RIG_KV_CACHE_MEMORY_BYTES"] == "268435456"
    assert env["RIG_EXTRA_ARGS"].split() == [*feature_words("tiny-emb4", "local"), "--enforce-eager"]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the profile's environment, under the user's
    assert stat.S_IMODE(rig.env_file.stat().st_mode) == 0o640
    assert rig.marker.exists(), "a new tpu.env must notify 'restart vllm'"
    assert not (tmp_path / "etc" / "tpu.env.prev").exists()

    # Idempotent: nothing changes, no restart.
    rc, tasks, out = rig.run()
    assert rc == 0, out
    assert rig.changed(tasks) == 0, [t for t in tasks if t.get("changed")]
    assert not rig.marker.exists()

    # A change keeps the previous file as tpu.env.prev, as private, and restarts.
    first = rig.env_file.read_text()
    rc, _, out = rig.run(rig_model="tiny-w4a16")
    assert rc == 0, out
    prev = tmp_path / "etc" / "tpu.env.prev"
    assert prev.read_text() == first
    assert stat.S_IMODE(prev.stat().st_mode) == 0o640
    assert parse_env(rig.env_file.read_text())["RIG_MODEL_KEY"] == "tiny-w4a16"
    assert rig.marker.exists()


def test_gce_values_and_model_args(tmp_path: Path) -> None:
    rig = Rig(tmp_path, platform="gce")
    rc, _, out = rig.run(
        rig_model="google-w4a16", rig_vllm_host_flags={"speculative-config": {"method": "ngram", "n": 4}}
    )
    assert rc == 0, out
    env = parse_env(rig.env_file.read_text())
    assert env["RIG_DTYPE"] == "float16"
    assert env["RIG_KV_CACHE_DTYPE"] == "auto"
    assert float(env["RIG_GPU_MEMORY_UTILIZATION"]) == 0.90
    assert (env["RIG_MAX_MODEL_LEN"], env["RIG_MAX_NUM_SEQS"]) == ("16384", "8")
    assert env["RIG_SPECULATIVE_CONFIG"] == '{"method":"ngram","n":4}'
    assert env["RIG_EXTRA_ARGS"].split() == ["--language-model-only", *feature_words("google-w4a16", "gce")]


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rc, tasks, out = rig.run("--check", "--diff")
    assert rc == 0, out
    assert not rig.env_file.exists()
    assert any(t.get("changed") for t in tasks)


def test_unknown_model_fails_before_writing_and_lists_keys(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rc, _, out = rig.run(rig_model="nope")
    assert rc != 0
    assert "rig_model 'nope' is not in the catalog" in out
    assert "tiny-emb4" in out and "google-w4a16" in out
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        (
            "rig_vllm_host_flags",
            {"dtype": "fp64"},
            "vLLM flag dtype (rig_vllm_flags, rig_vllm_host_flags) is",
        ),
        (
            "rig_vllm_host_flags",
            {"max-num-seqs": "many"},
            "vLLM flag max-num-seqs (rig_vllm_flags, rig_vllm_host_flags) is",
        ),
        (
            "rig_vllm_host_flags",
            {"gpu-memory-utilization": 1.5},
            "gpu-memory-utilization (rig_vllm_flags, rig_vllm_host_flags) is 1.5, not a fraction",
        ),
        ("rig_vllm_host_flags", {"port": 9000}, "port: set by the role"),
        ("rig_vllm_host_flags", {"Max_Len": 1}, "Max_Len: not a flag name"),
        ("rig_vllm_host_flags", {"middleware": ["a", "b"]}, "middleware: a list"),
        (
            "rig_vllm_host_flags",
            {"seed": ""},
            "RIG_SEED (from flag seed of rig_vllm_flags/rig_vllm_host_flags)",
        ),
        (
            "rig_vllm_host_flags",
            {"seed": "1\n2"},
            "tpu.env key RIG_SEED (from flag seed of rig_vllm_flags/rig_vllm_host_flags) needs a one-line value",
        ),
        ("rig_vllm_flags", "not-a-dict", "rig_vllm_flags"),
        ("rig_config_model_path", "", "RIG_MODEL (from rig_config_model_path)"),
        ("rig_vllm_environment", {"RIG_PORT": "1"}, "reserved names: RIG_PORT"),
    ],
)
def test_bad_input_fails_naming_variable(tmp_path: Path, var: str, value: Any, needle: str) -> None:
    rig = Rig(tmp_path)
    rig.env_file.parent.mkdir()
    rig.env_file.write_text("RIG_MODEL_KEY=untouched\n")
    before = rig.env_file.read_bytes()
    rc, _, out = rig.run(**{var: value})
    assert rc != 0
    assert needle in out
    assert rig.env_file.read_bytes() == before


def test_agent_flags_come_from_one_table_and_only_for_builds_that_carry_them(tmp_path: Path) -> None:
    """The parsers are named once (rig_vllm_feature_flags): a renamed parser there is what tpu.env
    gets; a build whose template carries nothing gets no agent flag, so vLLM answers tools with 400."""
    rig = Rig(tmp_path, platform="tpu")
    table = {"tools": {"enable-auto-tool-choice": True, "tool-call-parser": "parser-a"},
             "reasoning": {"reasoning-parser": "parser-b"}}  # fmt: skip
    rc, _, out = rig.run(rig_vllm_feature_flags=table)
    assert rc == 0, out
    words = parse_env(rig.env_file.read_text())["RIG_EXTRA_ARGS"].split()
    assert words == [
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "parser-a",
        "--reasoning-parser",
        "parser-b",
    ]
    assert feature_words("w8a8", "tpu") == [
        w.replace("parser-a", "gemma4").replace("parser-b", "gemma4") for w in words
    ]

    plain = {**CATALOG["w8a8"], "template_carries": []}
    rc, _, out = rig.run(rig_models={**CATALOG, "w8a8": plain})
    assert rc == 0, out
    assert parse_env(rig.env_file.read_text())["RIG_EXTRA_ARGS"] == ""
    # A platform that turns reasoning off keeps tool calls.
    rc, _, out = rig.run(rig_vllm_features=["tools"])
    assert rc == 0, out
    assert "--reasoning-parser" not in parse_env(rig.env_file.read_text())["RIG_EXTRA_ARGS"]


def _vllm_renderer(extra_args: str):
    """vLLM 0.29.0's chat renderer as ``vllm serve`` sets it up from RIG_EXTRA_ARGS, up to the
    tokenizer (which a request with tools is refused before)."""
    import shlex
    import types

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.parser.parser_manager import ParserManager
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "x", *shlex.split(extra_args)])
    renderer = object.__new__(OnlineRenderer)
    renderer.enable_auto_tools, renderer.use_harmony = args.enable_auto_tool_choice, False
    renderer.renderer = types.SimpleNamespace(tokenizer=None)
    renderer.parser = ParserManager.get_parser(
        tool_parser_name=args.tool_call_parser,
        reasoning_parser_name=args.reasoning_parser,
        enable_auto_tools=args.enable_auto_tool_choice,
        model_name="x",
    )
    return renderer


@pytest.mark.vllm
def test_vllm_takes_the_agent_flags_and_refuses_tools_without_them() -> None:
    """The table's parser names are vLLM 0.29.0's own (the golden tpu rig's RIG_EXTRA_ARGS parse into
    its Gemma 4 parsers); a build with no agent flags (RIG_EXTRA_ARGS empty, as above) gets a 400
    naming the flags for a request with tools, never an answer that ignored them."""
    import asyncio

    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    extra = parse_env((ROOT / "tests" / "golden" / "tpu" / "tpu.env").read_text())["RIG_EXTRA_ARGS"]
    parser = _vllm_renderer(extra).parser
    assert parser is not None and parser.tool_parser_cls.__name__ == "Gemma4EngineToolParser"
    assert parser.reasoning_parser_cls.__name__.startswith("Gemma4")
    tools = [{"type": "function", "function": {"name": "get_capital", "parameters": {"type": "object"}}}]
    request = ChatCompletionRequest(model="x", messages=[{"role": "user", "content": "hi"}], tools=tools)
    # Structured output: response_format and structured_outputs; the guided_* fields are gone.
    fields = ChatCompletionRequest.model_fields
    assert {"response_format", "structured_outputs"} <= set(fields)
    assert not [f for f in fields if f.startswith("guided_")]
    refused = asyncio.run(_vllm_renderer("").render_chat(request))
    assert refused.error.code == 400
    assert "--enable-auto-tool-choice and --tool-call-parser" in refused.error.message


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("rig_vllm_features", ["tools", "telepathy"], "rig_vllm_features: telepathy is no feature"),
        ("rig_vllm_feature_flags", {"tools": {"tool-call-parser": "gemma4 --trust-remote-code"}},
         "tool-call-parser: not true or one word"),
        ("rig_vllm_feature_flags", {"tools": {"tool-call-parser": ["a"]}}, "tool-call-parser: not true or one word"),
        ("rig_vllm_feature_flags", {"tools": {"--x; rm": True}}, "--x; rm: not a flag name"),
        ("rig_vllm_host_flags", {"reasoning-parser": "other"}, "reasoning-parser: also in rig_vllm_flags"),
    ],
)  # fmt: skip
def test_bad_agent_features_fail_before_writing(tmp_path: Path, var: str, value: Any, needle: str) -> None:
    rig = Rig(tmp_path)
    rc, _, out = rig.run(**{var: value})
    assert rc != 0
    assert needle in out
    assert not rig.env_file.exists()


KEY = "sk-test-0123456789abcdef"


def test_open_endpoint_listens_everywhere_and_its_key_never_shows(tmp_path: Path) -> None:
    rig = Rig(tmp_path, platform="gce")
    rc, _, out = rig.run("--diff", rig_endpoint_open=True, rig_api_key=KEY)
    assert rc == 0, out
    env = parse_env(rig.env_file.read_text())
    assert env["RIG_HOST"] == "0.0.0.0"
    assert env["VLLM_API_KEY"] == KEY
    assert KEY not in out
    # A change with the key in place keeps it out of the output too (diff, .prev copy).
    rc, _, out = rig.run(
        "--diff", rig_endpoint_open=True, rig_api_key=KEY, rig_vllm_host_flags={"max-num-seqs": 4}
    )
    assert rc == 0, out
    assert KEY not in out
    assert parse_env((tmp_path / "etc" / "tpu.env.prev").read_text())["VLLM_API_KEY"] == KEY

    # Hostile: the key leaves the configuration, but the tpu.env in place still holds it. Before
    # the fix no_log was computed from the NEW configuration only: closing the endpoint and dropping
    # rig_api_key made the write visible, and --diff printed the old file with the key.
    assert parse_env(rig.env_file.read_text())["VLLM_API_KEY"] == KEY
    rc, tasks, out = rig.run("--diff", "-v", rig_endpoint_open=False, rig_api_key="")
    assert rc == 0, out
    assert "VLLM_API_KEY" not in parse_env(rig.env_file.read_text())
    assert KEY not in out
    assert KEY not in json.dumps(tasks)
    # What changed is still said, by name.
    assert "VLLM_API_KEY" in out and "RIG_HOST" in out, out[-3000:]


@pytest.mark.parametrize("key", ["", "short"])
def test_open_endpoint_without_a_good_key_is_refused(tmp_path: Path, key: str) -> None:
    rig = Rig(tmp_path, platform="gce")
    rc, _, out = rig.run(rig_endpoint_open=True, rig_api_key=key)
    assert rc != 0
    assert "rig_config_api_key (from rig_api_key" in out
    assert not rig.env_file.exists()
