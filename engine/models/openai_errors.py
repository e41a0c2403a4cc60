"""How an OpenAI-compatible endpoint's failures become ModelErrors.

Every failure says which endpoint and model failed and what to check, because the person reading
it is usually configuring a server URL: the HTTP status with the server's own words and a hint, a
context too long (``ContextLengthError``: the engine compacts and calls once more), a time limit,
a refused or cut connection. The SDK and its transports wrap the real cause, so the chain of
exceptions is read for it.
"""

from __future__ import annotations

from typing import Iterator

import aiohttp
import openai

from ..errors import ContextLengthError, ModelError

EXCERPT_CHARS = 300

STATUS_HINTS = {
    400: "the server rejected the request; check the model supports tools and the message format",
    401: "check the API key",
    403: "check the API key's permissions for this model",
    404: "check the model name and that the base URL ends in /v1",
    429: (
        "the server is rate limiting; set the model's client-side limits (requests_per_minute, "
        "tokens_per_minute, max_in_flight) below the provider's, or lower the load"
    ),
}


def endpoint_error(
    exc: Exception, *, where: str, model: str, timeout_s: float, streaming: bool
) -> ModelError:
    """A ModelError that says which endpoint and model failed, and what to check."""
    if isinstance(exc, openai.APIStatusError):
        hint = STATUS_HINTS.get(exc.status_code, "the server failed; check its logs")
        if is_context_length(exc):
            return ContextLengthError(
                f"model endpoint {where} refused the request as too long for model {model!r}: "
                f"{excerpt(exc)}; the history is compacted and the call made once more"
            )
        error = ModelError(
            f"model endpoint {where} answered {exc.status_code} for model {model!r}: {excerpt(exc)}; {hint}"
        )
        error.status = exc.status_code
        return error
    refused = _refused(exc)
    if _timed_out(exc) and refused is None:
        return ModelError(
            f"model endpoint {where} did not answer within {timeout_s:g} s for model "
            f"{model!r}; check the server is not overloaded or raise request_timeout_s"
        )
    reason = _reason(exc)
    if streaming:
        return ModelError(
            f"the stream from model endpoint {where} for model {model!r} broke before the answer "
            f"was complete: {reason}; the partial answer was discarded"
        )
    if closed_before_answering(exc):
        return ModelError(
            f"model endpoint {where} closed the connection before answering for model {model!r}, "
            f"also when the request was sent again ({reason}); check the server's log: it may have "
            "crashed on the request, or something between turnlog and the server cut it"
        )
    if isinstance(exc, openai.APIConnectionError):
        return ModelError(
            f"cannot reach the model endpoint {where}: {refused or reason}; "
            "check TURNLOG_BASE_URL and that the server is running"
        )
    return ModelError(f"calling model endpoint {where} for model {model!r} failed: {reason}")


def _refused(exc: BaseException) -> str | None:
    """The refused connection behind ``exc``, if one is (the aiohttp transport reports a refused
    connection as a connect timeout)."""
    for seen in _chain(exc):
        os_error = getattr(seen, "os_error", None)
        for candidate in (seen, os_error):
            if isinstance(candidate, ConnectionRefusedError):
                return f"{type(candidate).__name__}: {candidate}"
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (the SDK and its transport wrap them)."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _timed_out(exc: BaseException) -> bool:
    """A time limit ran out. The aiohttp transport maps every connection error (a server closing
    the connection too) to a connect timeout and the SDK that to APITimeoutError, so where aiohttp
    raised, its own error decides; the SDK's default (httpx) transport raises timeouts as such."""
    chain = list(_chain(exc))
    if any(isinstance(e, aiohttp.ClientError) for e in chain):
        return any(isinstance(e, TimeoutError) for e in chain)  # aiohttp's timeouts are TimeoutErrors
    return any(
        isinstance(e, (TimeoutError, openai.APITimeoutError))
        or any(cls.__name__ == "TimeoutException" for cls in type(e).__mro__)
        for e in chain
    )


def closed_before_answering(exc: BaseException) -> bool:
    """The server closed the connection (or reset it) before the response's headers: no answer,
    and no sign the server processed the request. A refused connection is not this."""
    return any(
        isinstance(e, (aiohttp.ServerDisconnectedError, ConnectionResetError, BrokenPipeError))
        or type(e).__name__ == "RemoteProtocolError"  # the SDK's default (httpx) transport
        for e in _chain(exc)
    )


def _reason(exc: BaseException) -> str:
    """The most specific description in an exception chain (the SDK wraps transport errors)."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, openai.APIConnectionError) and cause is not None:
        exc = cause
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_context_length(exc: openai.APIStatusError) -> bool:
    """OpenAI says ``context_length_exceeded``; other servers only say it in words."""
    if exc.code == "context_length_exceeded":
        return True
    text = excerpt(exc).lower()
    return exc.status_code in (400, 413) and any(p in text for p in _CONTEXT_LENGTH_PHRASES)


_CONTEXT_LENGTH_PHRASES = ("maximum context length", "context length", "context window", "too many tokens")


def excerpt(exc: openai.APIStatusError) -> str:
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    text = str(message) if message else str(body if body is not None else exc.message)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."
