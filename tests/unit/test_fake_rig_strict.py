"""The vLLM stand-in's answers are held to the openai client's types, every key declared, and vLLM's error shape.

openai's pydantic models keep any unknown key as an extra, so these tests show that a misspelt or
wrongly typed field fails loudly (a 500 naming it, or a cut stream) instead of passing unseen.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import httpx
import openai
import pytest

from tests import fake_rig
from tests.fake_rig import FakeRig, ResponseMismatch, check_response

ASK = [{"role": "user", "content": "What is the capital of France?"}]


def _client(rig: FakeRig) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{rig.port}/v1", api_key="none", max_retries=0)


def test_every_answer_is_what_vllm_sends() -> None:
    """Models, chat (plain and streamed), completions and both 404s, through the official client."""
    with FakeRig("m", stream_pause=0) as rig:
        client = _client(rig)
        assert [m.id for m in client.models.list().data] == ["m"]
        assert client.chat.completions.create(model="m", messages=ASK).choices[0].message.content == "Paris"
        stream = client.chat.completions.create(model="m", messages=ASK, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == "Paris"
        assert (
            client.completions.create(model="m", prompt="The capital of France is").choices[0].text
            == " Paris"
        )
        with pytest.raises(openai.NotFoundError) as other:
            client.chat.completions.create(model="other", messages=ASK)
        assert other.value.body == {"message": "The model `other` does not exist.", "type": "NotFoundError",
                                    "param": "model", "code": 404}  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as nowhere:
            urllib.request.urlopen(f"http://127.0.0.1:{rig.port}/v1/nowhere", timeout=5)
        assert json.loads(nowhere.value.read()) == {"error": {"message": "Not Found", "type": "Not Found",
                                                              "param": None, "code": 404}}  # fmt: skip
    assert rig.mismatches == []


def test_a_misspelt_answer_field_is_a_500_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fake_rig.chat_body

    def misspelt(model: str) -> dict[str, Any]:
        body = real(model)
        body["systm_fingerprint"] = "fp"  # system_fingerprint, misspelt: openai keeps it as an extra
        return body

    monkeypatch.setattr(fake_rig, "chat_body", misspelt)
    with FakeRig("m") as rig, pytest.raises(openai.InternalServerError) as refused:
        _client(rig).chat.completions.create(model="m", messages=ASK)
    assert "chat.systm_fingerprint" in str(refused.value)
    assert rig.mismatches == ["chat.systm_fingerprint: not a field of openai's ChatCompletion"]


def test_a_misspelt_stream_event_cuts_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fake_rig.chunk_body

    def misspelt(model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body = real(model, delta, finish_reason)
        if finish_reason:
            body["choices"][0]["finish_reasn"] = body["choices"][0].pop("finish_reason")
        return body

    monkeypatch.setattr(fake_rig, "chunk_body", misspelt)
    # The cut is seen by httpx or by openai, whichever reads the stream's end first.
    with FakeRig("m", stream_pause=0) as rig, pytest.raises((openai.APIError, httpx.TransportError)):
        list(_client(rig).chat.completions.create(model="m", messages=ASK, stream=True))
    assert len(rig.mismatches) == 1 and "finish_reasn" in rig.mismatches[0]


CHAT = fake_rig.chat_body("m")


@pytest.mark.parametrize(
    ("kind", "body", "status", "named"),
    [
        ("chat", {**CHAT, "systemfingerprint": "x"}, 200, "chat.systemfingerprint"),
        ("chat", {**CHAT, "created": "1"}, 200, "chat.created"),  # a string where vLLM sends an int
        ("chat", {**CHAT, "choices": [{**CHAT["choices"][0], "mesage": {}}]}, 200, "mesage"),
        ("chunk", fake_rig.chunk_body("m", {"contnet": "x"}), 200, "contnet"),
        ("completion", {**fake_rig.completion_body("m"), "object": "completion"}, 200, "completion.object"),
        ("models", {"object": "list", "data": [{"id": "m", "object": "model"}]}, 200, "created"),
        ("models", {"object": "list", "data": [{**fake_rig.models_body("m")["data"][0], "maxlen": 1}]}, 200,
         "maxlen"),
        ("models", {"data": []}, 200, "ModelList"),
        ("error", {"error": {"message": "m"}}, 404, "error"),  # the stand-in's old 404: no type, param, code
        ("error", fake_rig.error_body(400, "m", "BadRequestError"), 404, "error.code"),
        ("error", {"detail": "Not Found"}, 404, "error"),
    ],
)  # fmt: skip
def test_an_answer_vllm_would_never_send_is_refused(kind: str, body: Any, status: int, named: str) -> None:
    with pytest.raises(ResponseMismatch, match=named.replace(".", r"\.")):
        check_response(kind, body, status)


@pytest.mark.slow
def test_the_vllm_table_is_vllms_own() -> None:
    """VLLM_EXTRAS and the error keys are what vLLM 0.29.0's types declare beyond openai's (slow: imports vLLM)."""
    from openai.types import Model
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ModelCard

    assert fake_rig.VLLM_EXTRAS["Model"] == set(ModelCard.model_fields) - set(Model.model_fields)
    assert set(ErrorInfo.model_fields) == fake_rig.VLLM_ERROR_KEYS
    ModelCard.model_validate(fake_rig.models_body("m")["data"][0])
