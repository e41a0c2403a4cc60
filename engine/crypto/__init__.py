"""Content encryption per session (crypto-shredding, issue 43): which fields are content
(``fields``), the sealed value format (``sealed``), the master key (``master``), the key store
(``keystore``, in SQLite or PostgreSQL), the cipher a persisting log is given (``cipher``), and
where a deployment's keys are (``setup``)."""

from .cipher import ContentCipher
from .fields import CONTENT, ERASED_OBJECT, ERASED_TEXT, METADATA, is_erased, scrubbed
from .keystore import DataKey, ErasureRecord, KeyStore
from .master import MasterKeys

__all__ = [
    "CONTENT",
    "ERASED_OBJECT",
    "ERASED_TEXT",
    "METADATA",
    "ContentCipher",
    "DataKey",
    "ErasureRecord",
    "KeyStore",
    "MasterKeys",
    "is_erased",
    "scrubbed",
]
