"""The owner's transactional producer, tuned for transactions that follow each other closely.

A partition's owner runs its transactions back to back (group commit, ``kafka_appends``). Right
after a commit the transaction coordinator is still writing the previous transaction's markers,
and answers the next transaction's first request (AddPartitionsToTxn, or AddOffsetsToTxn for a
transaction that only commits offsets) with CONCURRENT_TRANSACTIONS until it is done (KAFKA-5477).
aiokafka then sleeps before asking again: 20 ms for AddPartitionsToTxn (``BACKOFF_OVERRIDE`` in
``aiokafka.producer.sender``) and ``retry_backoff_ms`` (100 ms by default) for AddOffsetsToTxn.
The markers take a few milliseconds on a local broker, so those sleeps were most of a
transaction: measured on the repo's broker (bench/README.md §11), one event per transaction
took 27 ms with aiokafka's defaults and 7 ms with the values below, and a transaction that only
commits a consumer group's offsets 108 ms against 18 ms. The cost of a shorter wait is a few
more small requests to the coordinator while the markers are written.

``BACKOFF_OVERRIDE`` is a module constant read at each retry (aiokafka pinned in pyproject.toml;
``tests/test_log_kafka.py`` checks it is still there), so setting it applies to every
transactional producer in the process: only the owners' are.
"""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.producer import sender as aiokafka_sender

CONCURRENT_TXN_RETRY_S = 0.002
"""The wait before asking again to add a partition while the previous transaction's markers are
being written (aiokafka's default: 0.02 s)."""

TXN_RETRY_BACKOFF_MS = 10
"""The owner producer's ``retry_backoff_ms`` (aiokafka's default: 100): the wait before asking
again to add a consumer group's offsets, and before other retries of that producer."""


def tune_transactions() -> None:
    """Shorten aiokafka's wait after CONCURRENT_TRANSACTIONS (see the module docstring)."""
    aiokafka_sender.BACKOFF_OVERRIDE = CONCURRENT_TXN_RETRY_S


def owner_producer(bootstrap: str, client_id: str, transactional_id: str) -> AIOKafkaProducer:
    """The transactional producer that makes its process a partition's only writer."""
    tune_transactions()
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        retry_backoff_ms=TXN_RETRY_BACKOFF_MS,
    )
