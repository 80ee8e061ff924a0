"""The cloud modules' shared credentials options: documented once (plugins/doc_fragments/google_cloud.py)
and checked once (module_utils/gce_client.py cloud_module), the same in every module."""

from __future__ import annotations

import json

import pytest

from tests.ansible_run import module_docs
from tests.fake_compute.harness import run_module

MODULES = ("gce_instance", "gce_firewall", "tpu_node")
AUTH_OPTIONS = ("project", "auth_kind", "service_account_file", "api_endpoint")
# Enough for each module to get past its own required options.
REQUIRED = {"project": "proj", "name": "n1", "zones": ["us-west4-a"], "source_ranges": ["203.0.113.0/24"]}


def test_every_cloud_module_documents_the_auth_options_alike() -> None:
    docs = module_docs(*MODULES)
    for name in AUTH_OPTIONS:
        texts = {m: json.dumps(docs[m]["doc"]["options"][name], sort_keys=True) for m in MODULES}
        assert len(set(texts.values())) == 1, (name, texts)
    for m in MODULES:
        assert "google-auth" in docs[m]["doc"]["requirements"], m
        assert {a["support"] for a in docs[m]["doc"]["attributes"].values()} == {"full"}, m
        assert set(docs[m]["doc"]["attributes"]) == {"check_mode", "diff_mode"}, m


@pytest.mark.parametrize("module", MODULES)
def test_a_service_account_without_its_key_file_is_refused_first(module: str) -> None:
    """Refused by the argument check, before credentials or any request (nothing listens here)."""
    params = {k: v for k, v in REQUIRED.items() if not (module == "gce_firewall" and k == "zones")}
    result = run_module("http://127.0.0.1:9", module=module, auth_kind="serviceaccount", **params)
    assert result.get("failed"), result
    assert result["msg"].startswith("auth_kind is serviceaccount but"), result["msg"]
    assert result["msg"].endswith("missing: service_account_file"), result["msg"]
