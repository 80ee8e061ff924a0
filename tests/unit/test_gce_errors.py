"""Error classification: a stockout and a transient 503 share a class and differ only by code."""

from __future__ import annotations

from google.api_core import exceptions

from tests.fake_compute.harness import module_util

_errors = module_util("gce_errors")
classify_exception = _errors.classify_exception
exception_to_error = _errors.exception_to_error
operation_error = _errors.operation_error
quota_name = _errors.quota_name
is_retryable = module_util("gce_retry").is_retryable


def test_stockout_503_is_not_retried_but_a_plain_503_is() -> None:
    stockout = exceptions.ServiceUnavailable(
        "The zone does not have enough resources", errors=[{"reason": "ZONE_RESOURCE_POOL_EXHAUSTED"}]
    )
    transient = exceptions.ServiceUnavailable(
        "The service is currently unavailable.", errors=[{"reason": "backendError"}]
    )
    assert classify_exception(stockout) == "stockout" and not is_retryable(stockout)
    assert classify_exception(transient) == "retryable" and is_retryable(transient)


def test_throttling_and_server_errors_are_retried_client_errors_are_not() -> None:
    assert is_retryable(exceptions.TooManyRequests("slow down"))
    assert is_retryable(exceptions.InternalServerError("oops"))
    assert is_retryable(exceptions.GatewayTimeout("late"))
    assert not is_retryable(exceptions.BadRequest("bad field"))
    assert not is_retryable(exceptions.NotFound("gone"))


def test_sync_quota_403_is_named_with_advice() -> None:
    exc = exceptions.Forbidden(
        "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
        errors=[{"reason": "quotaExceeded"}],
    )
    err = exception_to_error(exc, "proj")
    assert err.kind == "quota" and err.quota == "NVIDIA_T4_GPUS"
    assert "IAM & Admin > Quotas" in str(err) and "PREEMPTIBLE_NVIDIA_T4_GPUS" in str(err)


def test_a_403_without_quota_is_fatal() -> None:
    assert (
        classify_exception(exceptions.Forbidden("Required 'compute.instances.create' permission")) == "fatal"
    )


def test_operation_errors() -> None:
    stockout = {
        "name": "op",
        "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "message": "m"}]},
    }
    assert operation_error(stockout, "p").kind == "stockout"
    quota = {
        "error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'GPUS_ALL_REGIONS' exceeded."}]}
    }
    err = operation_error(quota, "p")
    assert err.kind == "quota" and err.quota == "GPUS_ALL_REGIONS"
    other = {
        "name": "op-1",
        "operationType": "insert",
        "error": {"errors": [{"code": "RESOURCE_NOT_FOUND", "message": "x"}]},
    }
    err = operation_error(other, "p")
    assert err.kind == "operation" and "op-1 (insert) failed: RESOURCE_NOT_FOUND: x" in str(err)
    assert operation_error({"name": "ok", "status": "DONE"}, "p") is None


def test_quota_names_are_spelled_as_the_api_spells_them() -> None:
    """NVIDIA_T4_GPUS with underscores, as in the API's message and the console's quota filter."""
    message = "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1."
    info = {
        "metricName": "compute.googleapis.com/preemptible_nvidia_t4_gpus",
        "limitName": "PREEMPTIBLE-NVIDIA-T4-GPUS-per-project-region",
    }
    assert quota_name(message, [{"quotaInfo": info}]) == "PREEMPTIBLE_NVIDIA_T4_GPUS"
    assert quota_name("no name in the message", [{"quotaInfo": info}]) == "PREEMPTIBLE_NVIDIA_T4_GPUS"
    limit_only = [{"quotaInfo": {"limitName": "NVIDIA-T4-GPUS-per-project-region"}}]
    assert quota_name("no name in the message", limit_only) == "NVIDIA_T4_GPUS"
    assert quota_name("Quota 'CPUS' exceeded.") == "CPUS"
    assert quota_name("no name here") == "unknown quota"


def test_throttling_until_the_deadline_says_it_was_throttling() -> None:
    last = exceptions.TooManyRequests("Rate Limit Exceeded", errors=[{"reason": "rateLimitExceeded"}])
    err = exception_to_error(exceptions.RetryError("Timeout of 1.0s exceeded", last), "proj")
    assert err.kind == "throttled" and "throttling" in str(err) and "429" in str(err)
    assert "retry_deadline" in str(err)


def test_a_403_rate_limit_is_throttling_not_a_quota() -> None:
    exc = exceptions.Forbidden("Rate Limit Exceeded", errors=[{"reason": "rateLimitExceeded"}])
    assert classify_exception(exc) == "retryable"


def test_a_dropped_connection_is_retried() -> None:
    import requests

    assert is_retryable(requests.exceptions.ConnectionError("Connection aborted. RemoteDisconnected"))
    assert not is_retryable(ValueError("not a transport error"))
