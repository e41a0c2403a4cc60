"""Request bodies: read within the size limit while they stream in, parse JSON with bounded nesting
and number size, and refuse text that is not valid Unicode (a lone surrogate, anywhere in the body).
A NUL is valid Unicode, and harmless inside JSON the gateway re-encodes (metadata, edited tool
arguments); the fields stored as text refuse it (``string_field``, ``check_message``).

Every refusal is an ``HttpError`` (4xx); nothing here lets a hostile body reach a handler, the
engine or the log. A refusal made before the whole body was read closes the connection after
the answer, so the rest of a large upload is not read.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn

from starlette.requests import ClientDisconnect, Request

from turnlog.engine.text import unicode_problem

from .http import HttpError
from .limits import Limits

CLOSE = {"Connection": "close"}


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, never more than ``max_bytes``: a larger one is refused as soon as the declared
    Content-Length or the bytes received so far pass the limit (chunked bodies too)."""
    declared = request.headers.get("content-length")
    if declared is not None and len(declared) > 18:  # h11 checked it is ASCII digits
        raise _too_large(f"over {max_bytes}", max_bytes)
    if declared is not None and int(declared) > max_bytes:
        raise _too_large(declared, max_bytes)
    received = bytearray()
    try:
        async for chunk in request.stream():
            received += chunk
            if len(received) > max_bytes:
                raise _too_large(f"over {max_bytes}", max_bytes)
    except ClientDisconnect:
        raise HttpError(
            400, "incomplete_body", "the connection closed before the whole body arrived", CLOSE
        ) from None
    return bytes(received)


async def json_body(request: Request, limits: Limits) -> dict[str, Any]:
    """The body as a JSON object (an empty body is ``{}``)."""
    body = parse_json(await read_body(request, limits.max_message_bytes), limits)
    if not isinstance(body, dict):
        raise HttpError(422, "invalid_input", "the body must be a JSON object")
    return body


def parse_json(raw: bytes, limits: Limits) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(
            400, "bad_json", f"the body is not UTF-8 text (byte {exc.start}); send JSON in UTF-8"
        ) from None

    def number(literal: str) -> int | float:
        if len(literal) > limits.max_number_chars:
            _bad_json(
                f"a number in the body has {len(literal)} characters; the limit is {limits.max_number_chars}"
            )
        value = float(literal) if any(c in literal for c in ".eE") else int(literal)
        if isinstance(value, float) and not math.isfinite(value):
            _bad_json(f"the number {literal} is out of range")
        return value

    def constant(name: str) -> NoReturn:
        _bad_json(f"{name} is not a JSON number; send a finite number")

    try:
        value = json.loads(text or "{}", parse_int=number, parse_float=number, parse_constant=constant)
    except RecursionError:
        _bad_json(f"the body is nested more than {limits.max_json_depth} levels deep")
    except json.JSONDecodeError as exc:
        _bad_json(f"the body is not JSON: {exc}")
    check_tree(value, limits.max_json_depth)
    return value


def check_tree(value: Any, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` and any key or string that is not valid Unicode."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            _check_text(node, path)
        elif isinstance(node, (dict, list)):
            if depth >= max_depth:
                _bad_json(f"the body is nested more than {max_depth} levels deep (at {_where(path)})")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if isinstance(key, str):
                    _check_text(key, (*path, key), key=True)
                stack.append((child, depth + 1, (*path, key)))


def _check_text(text: str, path: tuple[Any, ...], *, key: bool = False) -> None:
    problem = unicode_problem(text)
    if problem is not None:
        what = "the key" if key else "the string"
        raise HttpError(400, "invalid_text", f"{what} at {_where(path)} holds {problem}; send UTF-8 text")


def _where(path: tuple[Any, ...]) -> str:
    """A JSON path for a message: ``$.messages[0].content``; odd keys are quoted."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:  # json.dumps escapes whatever is odd in a key (NUL, surrogates) as ASCII
            out += f".{part}" if part.isidentifier() else f"[{json.dumps(part)}]"
    return out


def _bad_json(detail: str) -> NoReturn:
    raise HttpError(400, "bad_json", detail)


def too_large_detail(size: str, limit: int) -> str:
    return f"the request body is {size} bytes; the limit is {limit}"


def _too_large(size: str, limit: int) -> HttpError:
    return HttpError(413, "body_too_large", too_large_detail(size, limit))
