"""The demo's tools, bound to a LogisticsBackend. Each shows one part of the tool contract:
typed arguments with a derived schema, a formatter that turns JSON into readable text (seed
§4.2), a business error raised as ToolFailure (seed §4.4), idempotent vs not, and a call that
waits for a person's approval (``refund``: money leaves the shop)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from engine import Tool, ToolFailure, tool

from .backend import LogisticsBackend


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
    return (
        f"Found {len(orders)} orders between {result['start_date']} and {result['end_date']} "
        f"(by carrier: {by_carrier}; earliest {min(o['order_date'] for o in orders)}):\n" + "\n".join(lines)
    )


def format_refund(result: dict[str, Any]) -> str:
    order, customer = result["order_id"], result["customer_id"]
    return f"Refunded {result['refunded']:.2f} on order {order} (customer {customer})."


def build_tools(backend: LogisticsBackend) -> list[Tool]:
    @tool(idempotent=True, formatter=format_orders)
    def query_orders(start_date: dt.date, end_date: dt.date, anomalies_only: bool = False) -> dict[str, Any]:
        """Find orders placed between start_date and end_date (inclusive, YYYY-MM-DD). With
        anomalies_only, return only orders whose logistics status is delayed, lost, damaged or
        returned_to_sender."""
        if end_date < start_date:
            raise ToolFailure(f"end_date {end_date} is before start_date {start_date}")
        orders = backend.find_orders(start_date, end_date, anomalies_only)
        return {"start_date": start_date.isoformat(), "end_date": end_date.isoformat(), "orders": orders}

    @tool
    async def send_notification(customer_id: str, order_id: str, message: str) -> dict[str, Any]:
        """Send one customer a notification about one order (email). Not idempotent: every call
        sends a message."""
        customer = backend.customer(customer_id)
        if customer is None:
            raise ToolFailure(f"no customer {customer_id}")
        if not customer.get("email"):
            raise ToolFailure(f"customer {customer_id} has no email address on file; nothing was sent")
        entry = {
            "to": customer["email"],
            "customer_id": customer_id,
            "order_id": order_id,
            "message": message,
        }
        backend.outbox.append(entry)
        return {"sent": True, "to": customer["email"], "order_id": order_id}

    @tool(formatter=lambda r: f"Report saved as {r['path']} ({r['chars']} characters).")
    def save_report(title: str, body: str) -> dict[str, Any]:
        """Save a handling report (markdown body) and return where it was stored."""
        path = backend.save_report(title, body)
        return {"path": str(path), "chars": len(body)}

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

    return [query_orders, send_notification, save_report, refund]
