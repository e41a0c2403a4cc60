"""The HTTP gateway: user messages in, resumable Server-Sent Event streams out, per-user isolation,
limits, and the logs, metrics and traces derived from the event stream."""

from .auth import KeyStore, Principal, hash_key, new_key
from .config import GatewayConfig
from .hub import LiveHub
from .limits import Limits
from .server import server_config
from .service import Gateway
from .stream import SessionStream, StreamMessage

__all__ = [
    "Gateway",
    "GatewayConfig",
    "KeyStore",
    "Limits",
    "LiveHub",
    "Principal",
    "SessionStream",
    "StreamMessage",
    "hash_key",
    "new_key",
    "server_config",
]
