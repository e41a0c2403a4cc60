"""A separate turn worker for the gateway tests: ``python tests/gateway_worker_proc.py LOG_PATH``.

Runs the gateway tests' agent on the same log until it is killed, as a deployment that keeps
turns out of the gateway process would.
"""

from __future__ import annotations

import asyncio
import sys

from tests.gateway_support import PARTITIONS, GatedModel, lookup
from turnlog.consumers import TurnWorker
from turnlog.engine import Agent, AgentDirectory, SqliteEventLog


async def main(path: str) -> None:
    log = SqliteEventLog(path, partitions=PARTITIONS)
    agents = AgentDirectory(
        [Agent.build("support", GatedModel(), [lookup], system_prompt="You help with orders.")]
    )
    await TurnWorker(log, agents, worker_id="separate-worker").run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
