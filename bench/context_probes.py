#!/usr/bin/env python
"""Facts planted in a long session, probed after compaction (issue 8): what a model is sent,
and what it answers.

    PYTHONPATH=. .venv/bin/python bench/context_probes.py                 # the rule model only
    PYTHONPATH=. .venv/bin/python bench/context_probes.py --local         # + the local model
    PYTHONPATH=. .venv/bin/python bench/context_probes.py --base-url URL --model NAME   # any endpoint

The session is built by a free rule model: ``--turns`` turns (default 200) of filler, small
talk and the facts of tests/corpus/context_facts.json (preferences, ids, numbers, a corrected
decision), with ``ContextPolicy(window=--window, summarizer="extractive")`` so it is compacted
many times. Then every probe question is asked of the model under test, on the same session
(an agent with the same id and policy): the rule model answers by calling ``recall_history``
with the question; a real model decides for itself (the history it sees is compacted; the
recall tool is offered).

Reported per model: probes whose expected text was in what the model was sent (its context or a
recall result), and probes whose expected text is in the model's final answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from turnlog.engine import (  # noqa: E402
    Agent,
    AgentDirectory,
    AgentSessions,
    ContextPolicy,
    FunctionModel,
    Model,
    SqliteEventLog,
    call,
    reply,
)
from turnlog.engine.models.base import ModelChunk, ModelRequest, ModelResponse  # noqa: E402

FACTS = json.loads((REPO / "tests" / "corpus" / "context_facts.json").read_text(encoding="utf-8"))
FILLER = "Continue with the next batch of the delivery list."
ANSWER = (
    "Checked the next batch of deliveries; nothing unusual, all parcels are on their way as planned. " * 2
)
PROBES = {f["probe"]: f["expect"] for f in FACTS if f["probe"]}


class Recording(Model):
    """Passes requests through to ``inner`` and keeps them (what the model was sent)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.name = inner.name
        self.context_window = inner.context_window
        self.first_token_timeout_s = inner.first_token_timeout_s
        self.response_timeout_s = inner.response_timeout_s
        self.requests: list[ModelRequest] = []

    @property
    def token_counter(self) -> Any:
        return self.inner.token_counter

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        async for chunk in self.inner.stream(request):
            yield chunk


def builder(request: ModelRequest) -> ModelResponse | str:
    last = request.messages[-1]
    if last.role == "tool":
        return "From the archive: " + last.content[:400]
    text = next(m.content for m in reversed(request.messages) if m.role == "user")
    if text in PROBES:
        return reply("", call("recall_history", {"query": text}))
    return "You're welcome." if text == "thanks!" else ANSWER


def script(turns: int) -> list[str]:
    plants = [f["plant"] for f in FACTS]
    every = max(2, turns // (len(plants) + 1))
    out: list[str] = []
    for i in range(turns):
        if i % every == every // 2 and plants:
            out.append(plants.pop(0))
        else:
            out.append("thanks!" if i % 9 == 7 else FILLER)
    return out + plants


async def probe(model: Model, log: SqliteEventLog, sid: str, policy: ContextPolicy) -> dict[str, Any]:
    recording = Recording(model)
    agent = Agent("probe", recording, context=policy, first_token_timeout_s=300, model_timeout_s=600)
    api = AgentSessions(log, AgentDirectory([agent]))
    in_context, in_answer, rows = 0, 0, []
    for question, expected in PROBES.items():
        before = len(recording.requests)
        async for _ in api.send_user_message(sid, question):
            pass
        sent = "\n".join(m.content for r in recording.requests[before:] for m in r.messages)
        answer = (await api.get_state(sid)).messages[-1].content
        found, said = expected in sent, expected.lower() in answer.lower()
        in_context += found
        in_answer += said
        rows.append(
            {"probe": question, "expected": expected, "sent": found, "answered": said, "answer": answer[:300]}
        )
        print(f"  {'+' if found else '-'}{'+' if said else '-'} {question}", file=sys.stderr)
    return {
        "model": model.name,
        "probes": len(PROBES),
        "in_context_or_recall": in_context,
        "in_answer": in_answer,
        "rows": rows,
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        models: list[Model] = [FunctionModel(builder, name="rule-model")]
        if args.local:
            from turnlog.local_model import serve_local_model

            models.append(stack.enter_context(serve_local_model(Path(args.home))).model())
        if args.base_url:
            from turnlog.engine.models.openai_compat import OpenAICompatibleModel
            from turnlog.engine.models.prompt_tools import PromptToolsModel

            remote: Model = OpenAICompatibleModel(args.model, base_url=args.base_url, api_key=args.api_key)
            models.append(PromptToolsModel(remote) if args.prompt_tools else remote)
        for model in models:
            policy = ContextPolicy(window=args.window, summarizer="extractive")
            log = SqliteEventLog(Path(tmp) / f"{len(results)}.db")
            build = AgentSessions(
                log, AgentDirectory([Agent("probe", FunctionModel(builder), context=policy)])
            )
            sid = (await build.create_session("probe", "u")).session_id
            for text in script(args.turns):
                async for _ in build.send_user_message(sid, text):
                    pass
            print(f"{model.name}: {args.turns} turns built, probing", file=sys.stderr)
            results.append(await probe(model, log, sid, policy))
            await log.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--local", action="store_true", help="also probe the local model (the [local] extra)")
    parser.add_argument("--home", default=".turnlog", help="where the local model is assembled")
    parser.add_argument("--base-url", default="", help="also probe an OpenAI-compatible endpoint")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--prompt-tools", action="store_true", help="the endpoint has no native tool calls")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "context_probes.json")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print("\n| model | probes | expected text sent to the model | expected text in its answer |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['probes']} | {r['in_context_or_recall']} | {r['in_answer']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
