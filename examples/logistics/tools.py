"""The demo's tools, bound to a LogisticsBackend. Each shows one part of the tool contract:
typed arguments with a derived schema, a formatter that turns JSON into readable text (seed
§4.2), a business error raised as ToolFailure (seed §4.4), idempotent vs not."""

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

    return [query_orders, send_notification, save_report]
