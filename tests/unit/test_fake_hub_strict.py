"""The hub stand-ins' answers are held to huggingface_hub's own types, and their errors to the hub's shape.

huggingface_hub builds ModelInfo, RepoFile and RepoFolder from the hub's JSON and keeps or drops
a key it does not know, so these tests show that a misspelt or wrongly typed field fails loudly
(a 500 naming it) instead of passing unseen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError

from tests.stand_in_hub import COMMIT, ResponseMismatch, StandInHub, check_answer
from tests.unit.fake_hub import FakeHub

REPO = "owner/model"
FILES = {"config.json": b"{}", "weights/model.safetensors": b"x" * 2048}


def test_both_stand_ins_answer_what_the_hub_sends(tmp_path: Path) -> None:
    """A whole download from each, through huggingface_hub: every answer passed the check."""
    with StandInHub(REPO, dict(FILES)) as hub:
        api = HfApi(endpoint=hub.endpoint, token="hf_granted")
        assert api.model_info(REPO, revision="main").sha == COMMIT
        listed = {entry.path for entry in api.list_repo_tree(REPO, recursive=True)}
        assert listed == {"config.json", "weights", "weights/model.safetensors"}
        snapshot_download(REPO, endpoint=hub.endpoint, token="hf_granted", local_dir=tmp_path / "a")
    assert hub.mismatches == []
    with FakeHub(REPO, "hf_t", dict(FILES)) as fake:
        snapshot_download(REPO, endpoint=fake.endpoint, token="hf_t", local_dir=tmp_path / "b")
    assert fake.mismatches == []
    assert (tmp_path / "b/weights/model.safetensors").read_bytes() == FILES["weights/model.safetensors"]


def test_a_misspelt_answer_field_is_a_500_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = StandInHub.model_info

    def misspelt(self: StandInHub, commit: str) -> dict[str, object]:
        body = real(self, commit)
        body["shaa"] = body.pop("sha")
        return body

    monkeypatch.setattr(StandInHub, "model_info", misspelt)
    with StandInHub(REPO, dict(FILES)) as hub, pytest.raises(HfHubHTTPError) as refused:
        HfApi(endpoint=hub.endpoint, token="hf_granted").model_info(REPO, revision="main")
    assert refused.value.response.status_code == 500
    assert "ModelInfo.shaa" in str(refused.value)
    assert hub.mismatches == ["ModelInfo.shaa: not a key huggingface_hub reads there"]


SIBLINGS = [{"rfilename": "config.json"}]


@pytest.mark.parametrize(
    ("kind", "body", "named"),
    [
        ("model_info", {"id": REPO, "sha": COMMIT, "siblings": SIBLINGS, "modelID": REPO}, "ModelInfo.modelID"),
        ("model_info", {"id": REPO, "sha": COMMIT, "last_modified": "2026-01-01T00:00:00Z"}, "last_modified"),
        ("model_info", {"id": REPO, "sha": 1234}, "ModelInfo.sha"),
        ("model_info", {"id": REPO, "gated": "yes"}, "ModelInfo.gated"),
        ("model_info", {"id": REPO, "siblings": [{"rfilename": "a", "blob_id": "x"}]}, "blob_id"),
        ("model_info", {"sha": COMMIT}, "ModelInfo.id"),
        ("tree", [{"type": "file", "path": "a", "size": "3", "oid": "0" * 40}], r"tree\[0\].size"),
        ("tree", [{"type": "file", "path": "a", "sizee": 3, "oid": "0" * 40}], r"tree\[0\].sizee"),
        ("tree", [{"type": "file", "path": "a", "size": 3, "oid": "0" * 40,
                   "lfs": {"oid": "0" * 64, "size": 3, "pointer_size": 134}}], "pointer_size"),
        ("tree", [{"type": "folder", "path": "a", "oid": "0" * 40}], r"tree\[0\].type"),
        ("error", {}, "error"),
        ("error", {"error": "m", "message": "m"}, "error"),
    ],
)  # fmt: skip
def test_an_answer_the_hub_would_never_send_is_refused(kind: str, body: Any, named: str) -> None:
    with pytest.raises(ResponseMismatch, match=named.replace("ModelInfo.", r"ModelInfo\.")):
        check_answer(kind, body)
