"""The demo's business system: orders, customers, a notification outbox and a report folder.

Stands in for the order database, the notification API and the document store of the seed's
example. Dates are computed from the sample data's offsets relative to today.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

DATA_FILE = resources.files(__package__).joinpath("data.json")
ANOMALIES = frozenset({"delayed", "lost", "damaged", "returned_to_sender"})


def last_week(today: dt.date) -> tuple[dt.date, dt.date]:
    """Monday and Sunday of the calendar week before ``today``'s."""
    monday = today - dt.timedelta(days=today.weekday() + 7)
    return monday, monday + dt.timedelta(days=6)


@dataclass
class LogisticsBackend:
    today: dt.date = field(default_factory=dt.date.today)
    reports_dir: Path = Path(".turnlog/reports")
    outbox: list[dict[str, Any]] = field(default_factory=list)
    refunds: list[dict[str, Any]] = field(default_factory=list)
    affected: list[dict[str, Any]] = field(default_factory=list)
    """The orders of the last anomaly query: whose customers should get a notice."""
    unreachable: set[str] = field(default_factory=set)
    """Customers a notice could not reach (no email address)."""

    def __post_init__(self) -> None:
        data = json.loads(DATA_FILE.read_text(encoding="utf-8"))
        self.customers = {c["customer_id"]: c for c in data["customers"]}
        monday, _ = last_week(self.today)
        self.orders = [
            {**o, "order_date": (monday + dt.timedelta(days=o.pop("day_offset"))).isoformat()}
            for o in (dict(o) for o in data["orders"])
        ]

    def find_orders(self, start: dt.date, end: dt.date, anomalies_only: bool) -> list[dict[str, Any]]:
        lo, hi = start.isoformat(), end.isoformat()
        found = [
            o
            for o in self.orders
            if lo <= o["order_date"] <= hi and (not anomalies_only or o["logistics_status"] in ANOMALIES)
        ]
        if anomalies_only:
            self.affected = found
        return found

    def not_ready_for_report(self) -> str:
        """Why a handling report cannot be saved yet ("" when it can): it must come after the
        anomaly query and after every affected customer got a notice or proved unreachable."""
        if not self.affected:
            return "no anomaly query was made yet: query last week's orders with anomalies_only first"
        sent = {(m["customer_id"], m["order_id"]) for m in self.outbox}
        waiting = [
            f"{o['order_id']} (customer {o['customer_id']})"
            for o in self.affected
            if (o["customer_id"], o["order_id"]) not in sent and o["customer_id"] not in self.unreachable
        ]
        if waiting:
            return (
                f"{len(waiting)} affected orders have no notice yet: {', '.join(waiting)}; send those "
                "notices first (one send_notification per order, all in one block), then save the report"
            )
        return ""

    def all_handled(self) -> str:
        """ "" while an affected order's customer is neither notified nor known unreachable; else a
        line saying every affected order is handled (the notices are done)."""
        if not self.affected:
            return ""
        sent = {(m["customer_id"], m["order_id"]) for m in self.outbox}
        keys = [(o["customer_id"], o["order_id"]) for o in self.affected]
        if any(k not in sent and k[0] not in self.unreachable for k in keys):
            return ""
        failed = sum(1 for k in keys if k not in sent)
        return (
            f"All {len(keys)} affected orders are handled ({len(keys) - failed} notices sent, {failed} "
            "could not be sent); next: save_report"
        )

    def not_notified(self) -> list[dict[str, str]]:
        """Orders of the last anomaly query whose customer has no notice about them, and why."""
        sent = {(m["customer_id"], m["order_id"]) for m in self.outbox}
        left = []
        for order in self.affected:
            if (order["customer_id"], order["order_id"]) in sent:
                continue
            customer = self.customer(order["customer_id"]) or {}
            why = "no email address on file" if not customer.get("email") else "no notice sent"
            left.append({"order_id": order["order_id"], "customer_id": order["customer_id"], "reason": why})
        return left

    def customer(self, customer_id: str) -> dict[str, Any] | None:
        return self.customers.get(customer_id)

    def order(self, order_id: str) -> dict[str, Any] | None:
        return next((o for o in self.orders if o["order_id"] == order_id), None)

    def refunded(self, order_id: str) -> float:
        return sum(r["amount"] for r in self.refunds if r["order_id"] == order_id)

    def save_report(self, title: str, body: str) -> Path:
        self.reports_dir.mkdir(parents=True, exist_ok=True)
        slug = "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")[:60] or "report"
        path = self.reports_dir / f"{self.today.isoformat()}-{slug}.md"
        path.write_text(f"# {title}\n\n{body}\n", encoding="utf-8")
        return path
