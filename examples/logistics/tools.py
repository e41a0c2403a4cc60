"""The demo's tools, bound to a LogisticsBackend. Each shows one part of the tool contract:
typed arguments with a derived schema, a formatter that turns JSON into readable text (seed
§4.2), a business error raised as ToolFailure (seed §4.4), idempotent vs not, and a call that
waits for a person's approval (``refund``: money leaves the shop).

Results say what they mean for the rest of the task (who is left to notify, what comes next), so
a small model knows what is left to do without working it out."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Collection
from typing import Any

from turnlog.engine import Tool, ToolFailure, tool
from turnlog.engine.errors import ConfigurationError

from .backend import LogisticsBackend

DEMO_TOOLS = ("query_orders", "send_notification", "save_report")
"""The tools the demo's agent is offered (the local model gets exactly these)."""
FINAL_TOOLS = ("save_report",)
"""The report is the task's last step: after it the model answers (``Agent.final_tools``)."""


def format_orders(result: dict[str, Any]) -> str:
    orders = result["orders"]
    if not orders:
        return f"No matching orders between {result['start_date']} and {result['end_date']}."
    by_carrier = ", ".join(f"{c} {n}" for c, n in Counter(o["carrier"] for o in orders).most_common())
    lines = [
        f"- {o['order_id']} (customer {o['customer_id']}, {o['carrier']}, {o['order_date']}): "
        f"{o['logistics_status']}" + (f" - {o['anomaly_note']}" if o.get("anomaly_note") else "")
        for o in orders
    ]
    text = (
        f"Found {len(orders)} orders between {result['start_date']} and {result['end_date']} "
        f"(by carrier: {by_carrier}; earliest {min(o['order_date'] for o in orders)}):\n" + "\n".join(lines)
    )
    if result.get("anomalies_only"):
        text += (
            f"\nTo notify the {len(orders)} affected customers: one send_notification per order above "
            "(its customer_id and order_id), all in one block."
        )
    return text


def format_refund(result: dict[str, Any]) -> str:
    order, customer = result["order_id"], result["customer_id"]
    return f"Refunded {result['refunded']:.2f} on order {order} (customer {customer})."


def format_notice(result: dict[str, Any]) -> str:
    sent = f"Notice sent to {result['customer_id']} ({result['to']}) about {result['order_id']}."
    return f"{sent} {result['handled']}." if result.get("handled") else sent


def format_report(result: dict[str, Any]) -> str:
    saved = f"Report saved as {result['path']} ({result['chars']} characters)."
    left = result.get("not_notified") or []
    if not left:
        return saved + " Every affected customer has a notice."
    items = "; ".join(f"{o['order_id']} (customer {o['customer_id']}: {o['reason']})" for o in left)
    return f"{saved} Still not notified: {items}."


def build_tools(backend: LogisticsBackend, names: Collection[str] = DEMO_TOOLS) -> list[Tool]:
    """The tools called ``names``, in that order; a name the demo does not have is a ConfigurationError.
    ``refund`` waits for a person's approval: the scripted demo offers it, the local model does not."""
    made = (_query_orders(backend), _send_notification(backend), _save_report(backend), _refund(backend))
    tools = {t.name: t for t in made}
    unknown = [n for n in names if n not in tools]
    if unknown:
        raise ConfigurationError(f"the logistics demo has no tool {unknown[0]!r}; it has {', '.join(tools)}")
    return [tools[n] for n in names]


def _query_orders(backend: LogisticsBackend) -> Tool:
    @tool(idempotent=True, formatter=format_orders)
    def query_orders(start_date: dt.date, end_date: dt.date, anomalies_only: bool = False) -> dict[str, Any]:
        """Find orders placed between start_date and end_date (inclusive). With anomalies_only,
        only orders whose logistics status is delayed, lost, damaged or returned_to_sender."""
        if end_date < start_date:
            raise ToolFailure(f"end_date {end_date} is before start_date {start_date}")
        orders = backend.find_orders(start_date, end_date, anomalies_only)
        return {
            "start_date": start_date.isoformat(),
            "end_date": end_date.isoformat(),
            "anomalies_only": anomalies_only,
            "orders": orders,
        }

    return query_orders


def _send_notification(backend: LogisticsBackend) -> Tool:
    @tool(formatter=format_notice)
    async def send_notification(customer_id: str, order_id: str, message: str = "") -> dict[str, Any]:
        """Email one customer an apology notice about one of their orders. Leave message out to send
        the standard apology for the order's problem. Not idempotent: every call sends an email."""
        order = backend.order(order_id)
        if order is None:
            raise ToolFailure(f"no order {order_id}")
        if order["customer_id"] != customer_id:
            raise ToolFailure(
                f"order {order_id} belongs to customer {order['customer_id']}, not {customer_id}"
            )
        customer = backend.customer(customer_id)
        if customer is None:
            raise ToolFailure(f"no customer {customer_id}")
        if not customer.get("email"):
            backend.unreachable.add(customer_id)
            raise ToolFailure(
                f"customer {customer_id} has no email address on file; nothing was sent, and trying again "
                "will not help: name it in the report and the answer"
                + (f". {handled}" if (handled := backend.all_handled()) else "")
            )
        entry = {
            "to": customer["email"],
            "customer_id": customer_id,
            "order_id": order_id,
            "message": message or standard_apology(order),
        }
        backend.outbox.append(entry)
        handled = backend.all_handled()
        return {
            "sent": True,
            "to": customer["email"],
            "customer_id": customer_id,
            "order_id": order_id,
            "handled": handled,
        }

    return send_notification


def _save_report(backend: LogisticsBackend) -> Tool:
    @tool(formatter=format_report)
    def save_report(title: str, body: str) -> dict[str, Any]:
        """Save the handling report (a short markdown body: the orders, the notices sent and those
        that failed) once every affected customer has been notified, and return where it was stored."""
        if not_ready := backend.not_ready_for_report():
            raise ToolFailure(f"the report was not saved: {not_ready}")
        path = backend.save_report(title, body)
        return {"path": str(path), "chars": len(body), "not_notified": backend.not_notified()}

    return save_report


def _refund(backend: LogisticsBackend) -> Tool:
    @tool(requires_approval=True, sensitivity="high", formatter=format_refund)
    def refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund a customer part or all of one order's amount. Money leaves the shop, so a person
        approves (or edits, or rejects) every refund before it is made."""
        order = backend.order(order_id)
        if order is None:
            raise ToolFailure(f"no order {order_id}")
        left = round(order["amount"] - backend.refunded(order_id), 2)
        if not 0 < amount <= left:
            raise ToolFailure(f"order {order_id} can be refunded between 0.01 and {left:.2f}, not {amount}")
        backend.refunds.append({"order_id": order_id, "amount": amount, "reason": reason})
        return {"refunded": amount, "order_id": order_id, "customer_id": order["customer_id"]}

    return refund


def standard_apology(order: dict[str, Any]) -> str:
    status = str(order["logistics_status"]).replace("_", " ")
    return (
        f"We are sorry: your order {order['order_id']} is {status}. We are on it and will update you "
        "within 24 hours."
    )
