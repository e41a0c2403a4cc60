"""A deterministic stand-in for a model, for the offline demo.

It reads the conversation it is sent, as a real model would, and plays the seed's task: query
last week's anomalous orders (first with a malformed date, to show the engine's argument
correction), notify each affected customer in one parallel step, save a report, then answer,
reporting the failed notification honestly because the tool result says [FAILED].

Asked only which orders had anomalies ("which orders had anomalies last week?"), it looks them
up and lists them, sending nothing.

Asked for a refund ("refund 40 on order O-1003"), it calls ``refund``, which waits for a
person's approval, and then reports what the approval led to.
"""

from __future__ import annotations

import datetime as dt
import re

from turnlog.engine import FunctionModel, ModelRequest, ModelResponse, call, reply
from turnlog.engine.messages import ChatMessage, turn_tool_results

from .backend import last_week

ORDER_LINE = re.compile(r"- (O-\d+) \(customer (C-\d+), [^)]*\): (\w+)")
ORDER_ID = re.compile(r"\bO-\d+\b")
AMOUNT = re.compile(r"(?<![\w.\-])\d+(?:\.\d{1,2})?(?![\w.\-])")
LOOKUP = re.compile(r"\b(which|what|list|show)\b.*\borders?\b", re.IGNORECASE | re.DOTALL)
NOTIFY = re.compile(r"notif|notice|apolog|report", re.IGNORECASE)


def lookup_only(asked: str) -> bool:
    """A question about the orders that asks for no notices or report ("which orders had
    anomalies last week?"): look them up and answer, nothing else."""
    return bool(LOOKUP.search(asked)) and not NOTIFY.search(asked)


def _decide(today: dt.date, request: ModelRequest) -> ModelResponse:
    monday, sunday = last_week(today)
    results = turn_tool_results(request.messages)
    asked = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    if re.search(r"\brefund\b", asked, re.IGNORECASE):
        return _refund(asked, results)
    if not results:
        return reply(
            "",
            call(
                "query_orders",
                {
                    "start_date": monday.strftime("%Y/%m/%d"),
                    "end_date": sunday.strftime("%Y/%m/%d"),
                    "anomalies_only": True,
                },
                "call_query_1",
            ),
        )
    last = results[-1]
    if last.name == "query_orders" and last.content.startswith("[REJECTED]"):
        return reply(
            "",
            call(
                "query_orders",
                {"start_date": monday.isoformat(), "end_date": sunday.isoformat(), "anomalies_only": True},
                "call_query_2",
            ),
        )
    if last.name == "query_orders" and lookup_only(asked):
        return reply(_listing(ORDER_LINE.findall(last.content)))
    if last.name == "query_orders":
        orders = ORDER_LINE.findall(last.content)
        return reply(
            "",
            *(
                call(
                    "send_notification",
                    {
                        "customer_id": cust,
                        "order_id": oid,
                        "message": f"We are sorry: your order {oid} is {status.replace('_', ' ')}. "
                        "We are on it and will "
                        "update you within 24 hours.",
                    },
                    f"call_notify_{oid}",
                )
                for oid, cust, status in orders
            ),
        )
    if last.name == "send_notification":
        return reply(
            "",
            call(
                "save_report",
                {"title": f"Logistics anomalies {monday} to {sunday}", "body": _report(results)},
                "call_report",
            ),
        )
    return reply(_answer(results))


def _listing(orders: list[tuple[str, str, str]]) -> str:
    listed = ", ".join(f"{oid} (customer {cust}) {status.replace('_', ' ')}" for oid, cust, status in orders)
    return (
        f"Last week had {len(orders)} orders with logistics anomalies: {listed}."
        if orders
        else ("Last week had no orders with logistics anomalies.")
    )


def _refund(asked: str, results: list[ChatMessage]) -> ModelResponse:
    """One refund per request: ask for what is missing, call the tool, report its outcome."""
    if results:
        outcome = results[-1].content
        if outcome.startswith("["):  # [DECLINED BY USER], [FAILED], [REJECTED]
            return reply(f"The refund was not made: {outcome}")
        return reply(f"Done: {outcome}")
    order = ORDER_ID.search(asked)
    amount = AMOUNT.search(ORDER_ID.sub("", asked))
    if order is None or amount is None:
        return reply("Which order should I refund, and how much? For example: refund 40 on order O-1003.")
    arguments = {"order_id": order.group(), "amount": float(amount.group()), "reason": asked[:200]}
    return reply(
        f"Refunding {amount.group()} on {order.group()}; this needs your approval.",
        call("refund", arguments, "call_refund"),
    )


def _notifications(results: list[ChatMessage]) -> tuple[list[str], list[str]]:
    sent = [m.content for m in results if m.name == "send_notification" and not m.content.startswith("[")]
    failed = [m.content for m in results if m.name == "send_notification" and m.content.startswith("[")]
    return sent, failed


def _report(results: list[ChatMessage]) -> str:
    query = next(m.content for m in reversed(results) if m.name == "query_orders")
    sent, failed = _notifications(results)
    lines = [
        "## Orders with logistics anomalies",
        query,
        "",
        "## Apology notices",
        f"- sent: {len(sent)}",
        f"- failed: {len(failed)}",
    ]
    lines += [f"  - {f}" for f in failed]
    return "\n".join(lines)


def _answer(results: list[ChatMessage]) -> str:
    query = next(m.content for m in reversed(results) if m.name == "query_orders")
    orders = ORDER_LINE.findall(query)
    sent, failed = _notifications(results)
    saved = next(
        (m.content for m in reversed(results) if m.name == "save_report"), "the report was not saved"
    )
    failed_customers = [c for f in failed for c in re.findall(r"customer (C-\d+)", f)]
    listed = ", ".join(f"{oid} {status.replace('_', ' ')}" for oid, _, status in orders)
    outcome = f"I sent {len(sent)} apology notices."
    if failed:
        outcome += (
            f" {len(failed)} could not be sent (customer {', '.join(failed_customers)}: no email "
            "address on file), so that customer still needs to be contacted another way."
        )
    return f"Last week had {len(orders)} orders with logistics anomalies ({listed}). {outcome} {saved}"


def demo_model(today: dt.date | None = None, *, chunk_chars: int = 12) -> FunctionModel:
    day = today or dt.date.today()
    return FunctionModel(lambda request: _decide(day, request), name="scripted-demo", chunk_chars=chunk_chars)
