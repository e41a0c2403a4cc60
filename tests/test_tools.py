"""Tools: schemas from typed functions or JSON Schema, argument validation phrased for a model,
and execution outcomes (success, failure, timeout, retry)."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any, Literal

import pytest

from turnlog.engine.errors import ConfigurationError, ToolFailure
from turnlog.engine.tools import (
    MARKERS,
    ArgumentProblem,
    Tool,
    ToolRegistry,
    ToolStatus,
    parse_arguments,
    run_tool_call,
    tool,
)


@tool(idempotent=True)
def sales_report(
    start_date: datetime.date,
    end_date: datetime.date,
    region: Literal["eu", "us"] = "eu",
    limit: int = 10,
    note: str | None = None,
) -> dict[str, Any]:
    """Sales totals for a date range.

    Dates are inclusive."""
    return {"start": start_date.isoformat(), "end": end_date.isoformat(), "region": region, "limit": limit}


GOOD = {"start_date": "2025-01-01", "end_date": "2025-01-15"}


# --- schemas ------------------------------------------------------------------------------------


def test_schema_is_derived_from_the_type_hints() -> None:
    params = sales_report.parameters
    assert params["type"] == "object"
    assert params["required"] == ["start_date", "end_date"]
    props = params["properties"]
    assert list(props) == ["start_date", "end_date", "region", "limit", "note"]
    assert props["start_date"] == {"type": "string", "format": "date"}
    assert props["end_date"] == {"type": "string", "format": "date"}
    assert props["region"]["enum"] == ["eu", "us"] and props["region"]["default"] == "eu"
    assert props["limit"] == {"type": "integer", "default": 10}
    assert "title" not in params and not any("title" in p for p in props.values())
    assert params.get("additionalProperties") is False


def test_description_comes_from_the_docstring_and_spec_is_what_a_model_sees() -> None:
    assert sales_report.name == "sales_report"
    assert sales_report.description == "Sales totals for a date range.\n\nDates are inclusive."
    assert sales_report.spec() == {
        "name": "sales_report",
        "description": sales_report.description,
        "parameters": dict(sales_report.parameters),
    }
    assert sales_report.idempotent is True


def test_decorator_options_override_name_and_description() -> None:
    @tool(name="ping-v2", description="Check the service.", timeout_s=1.5)
    async def ping() -> str:
        return "pong"

    assert (ping.name, ping.description, ping.timeout_s, ping.idempotent) == (
        "ping-v2",
        "Check the service.",
        1.5,
        False,
    )
    assert ping.parameters["properties"] == {}


def test_explicit_json_schema_tool() -> None:
    schema = {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^A-[0-9]+$"},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["order_id"],
        "additionalProperties": False,
    }
    lookup = Tool(
        name="lookup_order", description="Find an order.", parameters=schema, handler=lambda **kw: kw
    )
    assert lookup.spec() == {"name": "lookup_order", "description": "Find an order.", "parameters": schema}
    assert parse_arguments(lookup, '{"order_id": "A-17"}') == {
        "order_id": "A-17"
    }  # raw JSON values, no model
    assert describe(lookup, {"order_id": "B-1"}) == "order_id must match the pattern ^A-[0-9]+$, got 'B-1'"
    assert (
        describe(lookup, {"order_id": "A-1", "when": "tomorrow"}) == "when must be YYYY-MM-DD, got 'tomorrow'"
    )


@pytest.mark.parametrize(
    ("parameters", "problem"),
    [
        ({"type": "object", "properties": {"x": {"type": "strung"}}}, "not a valid JSON Schema"),
        ({"type": "object", "required": "x"}, "not a valid JSON Schema"),
        ({"type": "string"}, "must be an object schema"),
        ({"properties": {"x": {"type": "string"}}}, "must be an object schema"),
    ],
)
def test_invalid_or_non_object_schema_raises_configuration_error(
    parameters: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"tool broken: .*{problem}"):
        Tool(name="broken", description="", parameters=parameters, handler=lambda: None)


def test_bad_tool_names_and_functions_raise_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="letters, digits"):
        Tool(name="send email", description="", parameters={"type": "object"}, handler=lambda: None)

    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(ConfigurationError, match="parameter 'x' needs a type hint"):
        tool(untyped)

    def variadic(*args: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"\*args/\*\*kwargs"):
        tool(variadic)


def test_duplicate_tool_names_raise() -> None:
    other = Tool(
        name="sales_report", description="another", parameters={"type": "object"}, handler=lambda: None
    )
    with pytest.raises(ConfigurationError, match="'sales_report' is registered twice"):
        ToolRegistry([sales_report, other])
    registry = ToolRegistry([sales_report])
    with pytest.raises(ConfigurationError, match="registered twice"):
        registry.register(sales_report)
    assert registry.names == ["sales_report"] and len(registry) == 1


def test_registering_a_plain_function_raises() -> None:
    def plain(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="decorate the function with @tool"):
        ToolRegistry([plain])  # type: ignore[list-item]


# --- validation messages ------------------------------------------------------------------------


def describe(t: Tool, arguments: dict[str, Any] | str) -> str:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    result = parse_arguments(t, raw)
    assert isinstance(result, ArgumentProblem), f"expected a problem, got {result!r}"
    return result.describe()


def test_valid_arguments_become_typed_python_values() -> None:
    args = parse_arguments(sales_report, json.dumps({**GOOD, "region": "us"}))
    assert args == {
        "start_date": datetime.date(2025, 1, 1),
        "end_date": datetime.date(2025, 1, 15),
        "region": "us",
        "limit": 10,
        "note": None,
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({**GOOD, "end_date": "2025/1/15"}, "end_date must be YYYY-MM-DD, got '2025/1/15'"),
        ({**GOOD, "start_date": "2025-02-30"}, "start_date must be YYYY-MM-DD, got '2025-02-30'"),
        (
            {"end_date": "2025-01-15"},
            "missing required argument start_date (YYYY-MM-DD); arguments you sent: end_date",
        ),
        (
            {},
            "missing required argument start_date (YYYY-MM-DD), end_date (YYYY-MM-DD); "
            "arguments you sent: none",
        ),
        (  # no arguments at all
            "",
            "missing required argument start_date (YYYY-MM-DD), end_date (YYYY-MM-DD); "
            "arguments you sent: none",
        ),
        (
            {**GOOD, "colour": "red"},
            "unknown argument colour='red'; allowed arguments are start_date, end_date, region, limit, note",
        ),
        ({**GOOD, "limit": "ten"}, "limit must be an integer, got 'ten'"),
        ({**GOOD, "limit": True}, "limit must be an integer, got True"),
        ({**GOOD, "region": "asia"}, "region must be one of 'eu', 'us', got 'asia'"),
    ],
)
def test_validation_messages_name_the_field_and_what_was_sent(
    arguments: dict[str, Any] | str, message: str
) -> None:
    assert describe(sales_report, arguments) == message


def test_several_problems_are_all_reported() -> None:
    text = describe(sales_report, {"start_date": "01/01/2025", "end_date": "2025-01-15", "limit": "x"})
    assert text == "limit must be an integer, got 'x'; start_date must be YYYY-MM-DD, got '01/01/2025'"


def test_invalid_json_quotes_what_was_sent() -> None:
    sent = '{"start_date": "2025-01-01", "end_date": 2025'
    text = describe(sales_report, sent)
    assert text.startswith("arguments are not valid JSON (Expecting ',' delimiter at position 45)")
    assert text.endswith(f"you sent: {sent}")


def test_very_long_invalid_json_is_quoted_truncated() -> None:
    sent = "{" + "x" * 1000
    text = describe(sales_report, sent)
    assert f"you sent: {sent[:200]}..." in text and sent not in text


@pytest.mark.parametrize(
    ("sent", "kind"),
    [
        ("[1, 2]", "list [1, 2]"),
        ('"2025-01-15"', "str '2025-01-15'"),
        ("42", "int 42"),
        ("null", "NoneType None"),
    ],
)
def test_non_object_json_is_refused(sent: str, kind: str) -> None:
    assert describe(sales_report, sent) == f"arguments must be a JSON object of named arguments, got {kind}"


async def test_rejected_call_is_not_executed_and_tells_the_model_how_to_fix_it() -> None:
    calls: list[dict[str, Any]] = []

    @tool
    def book(day: datetime.date) -> str:
        """Book a day."""
        calls.append({"day": day})
        return "booked"

    outcome = await run_tool_call(ToolRegistry([book]), "book", '{"day": "15.01.2025"}')
    assert outcome.status == ToolStatus.REJECTED
    assert outcome.content == (
        "[REJECTED] invalid arguments for book: day must be YYYY-MM-DD, got '15.01.2025'. "
        "Fix the arguments and call book again."
    )
    assert outcome.attempts == 0 and calls == []


async def test_unknown_tool_is_rejected_listing_available_tools() -> None:
    outcome = await run_tool_call(ToolRegistry([sales_report]), "sales_reprot", "{}")
    assert outcome.status == ToolStatus.REJECTED
    assert outcome.content == "[REJECTED] no such tool 'sales_reprot'; available tools are: sales_report."


# --- execution ----------------------------------------------------------------------------------


async def test_success_content_comes_from_the_formatter_and_output_keeps_the_full_result() -> None:
    @tool(formatter=lambda r: f"{r['count']} orders, newest {r['newest']}")
    async def orders(customer: str) -> dict[str, Any]:
        """Orders of a customer."""
        return {"count": 3, "newest": "A-17", "customer": customer}

    outcome = await run_tool_call(ToolRegistry([orders]), "orders", '{"customer": "Zoë"}')
    assert outcome.status == ToolStatus.SUCCESS
    assert outcome.content == "3 orders, newest A-17"
    assert json.loads(outcome.output_json or "") == {"count": 3, "newest": "A-17", "customer": "Zoë"}
    assert outcome.attempts == 1 and outcome.error is None


async def test_default_formatter_is_compact_json_or_the_string_itself() -> None:
    outcome = await run_tool_call(ToolRegistry([sales_report]), "sales_report", json.dumps(GOOD))
    assert outcome.content == '{"start":"2025-01-01","end":"2025-01-15","region":"eu","limit":10}'

    @tool
    def greet(name: str) -> str:
        """Say hello."""
        return f"hello {name}"

    assert (await run_tool_call(ToolRegistry([greet]), "greet", '{"name": "Ana"}')).content == "hello Ana"


async def test_a_failing_formatter_still_reports_success_with_the_raw_result() -> None:
    @tool(formatter=lambda r: r["missing"])
    def data() -> dict[str, int]:
        """Data."""
        return {"a": 1}

    outcome = await run_tool_call(ToolRegistry([data]), "data", "{}")
    assert outcome.status == ToolStatus.SUCCESS
    assert (
        outcome.content.startswith("(formatter failed: KeyError: 'missing')") and '{"a":1}' in outcome.content
    )


async def test_tool_failure_is_a_failed_result_with_the_marker() -> None:
    @tool
    async def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        raise ToolFailure(f"order {order_id} not found")

    outcome = await run_tool_call(ToolRegistry([cancel_order]), "cancel_order", '{"order_id": "A-9"}')
    assert outcome.status == ToolStatus.FAILED
    assert outcome.content.startswith("[FAILED] cancel_order order A-9 not found")
    assert "Do not tell the user it succeeded" in outcome.content
    assert outcome.error == "order A-9 not found" and outcome.output_json is None


async def test_other_exception_is_failed_naming_the_exception_type() -> None:
    @tool
    def divide(a: int, b: int) -> float:
        """Divide."""
        return a / b

    outcome = await run_tool_call(ToolRegistry([divide]), "divide", '{"a": 1, "b": 0}')
    assert outcome.status == ToolStatus.FAILED
    assert outcome.content.startswith(
        f"{MARKERS[ToolStatus.FAILED]} divide ZeroDivisionError: division by zero"
    )


async def test_timeout_is_reported_with_the_timeout_marker() -> None:
    @tool(timeout_s=0.05)
    async def send_sms(to: str) -> str:
        """Send a text message (not safe to repeat)."""
        await asyncio.Event().wait()
        return "sent"

    outcome = await run_tool_call(ToolRegistry([send_sms]), "send_sms", '{"to": "+100"}')
    assert outcome.status == ToolStatus.TIMEOUT
    assert outcome.content.startswith("[FAILED: TIMEOUT] send_sms did not finish within 0.05 s")
    assert "may or may not have taken effect" in outcome.content
    assert outcome.attempts == 1


async def test_idempotent_tool_that_times_out_once_is_retried_and_succeeds() -> None:
    attempts: list[int] = []

    @tool(timeout_s=0.05, idempotent=True)
    async def flaky_lookup(sku: str) -> dict[str, Any]:
        """Stock level (read-only)."""
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            await asyncio.Event().wait()  # the first attempt hangs
        return {"sku": sku, "stock": 4}

    outcome = await run_tool_call(ToolRegistry([flaky_lookup]), "flaky_lookup", '{"sku": "X1"}')
    assert outcome.status == ToolStatus.SUCCESS
    assert outcome.attempts == 2 and attempts == [1, 2]
    assert outcome.content == '{"sku":"X1","stock":4}'


async def test_idempotent_tool_that_keeps_timing_out_gives_up_after_two_attempts() -> None:
    attempts: list[int] = []

    @tool(timeout_s=0.05, idempotent=True)
    async def stuck(sku: str) -> str:
        """Never answers."""
        attempts.append(1)
        await asyncio.Event().wait()
        return ""

    outcome = await run_tool_call(ToolRegistry([stuck]), "stuck", '{"sku": "X1"}')
    assert outcome.status == ToolStatus.TIMEOUT and outcome.attempts == 2 and len(attempts) == 2


async def test_non_idempotent_tool_that_times_out_is_not_retried() -> None:
    attempts: list[int] = []

    @tool(timeout_s=0.05)
    async def charge_card(amount: int) -> str:
        """Charge the card (not safe to repeat)."""
        attempts.append(amount)
        if len(attempts) == 1:
            await asyncio.Event().wait()
        return "charged"

    outcome = await run_tool_call(ToolRegistry([charge_card]), "charge_card", '{"amount": 5}')
    assert outcome.status == ToolStatus.TIMEOUT
    assert outcome.attempts == 1 and attempts == [5]


async def test_sync_tools_run_too() -> None:
    import threading

    seen: list[str] = []

    @tool
    def blocking_lookup(key: str) -> str:
        """A blocking lookup."""
        seen.append(threading.current_thread().name)
        return key.upper()

    outcome = await run_tool_call(ToolRegistry([blocking_lookup]), "blocking_lookup", '{"key": "abc"}')
    assert outcome.status == ToolStatus.SUCCESS and outcome.content == "ABC"
    assert seen and seen[0] != threading.main_thread().name, "a def tool must not block the event loop"


async def test_sync_tool_failure_is_reported() -> None:
    @tool
    def explode() -> str:
        """Fails."""
        raise ToolFailure("disk full")

    outcome = await run_tool_call(ToolRegistry([explode]), "explode", "{}")
    assert outcome.status == ToolStatus.FAILED and outcome.content.startswith("[FAILED] explode disk full")


async def test_explicit_schema_tool_executes_with_raw_arguments() -> None:
    received: list[dict[str, Any]] = []

    async def handler(**kwargs: Any) -> str:
        received.append(kwargs)
        return "ok"

    t = Tool(
        name="echo",
        description="Echo.",
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
        handler=handler,
    )
    outcome = await run_tool_call(ToolRegistry([t]), "echo", '{"n": 3}')
    assert outcome.status == ToolStatus.SUCCESS and received == [{"n": 3}]


def test_type_hint_that_cannot_be_resolved_raises_configuration_error() -> None:
    def lookup(order: NotDefinedAnywhere) -> str:  # type: ignore[name-defined]  # noqa: F821
        """Look up."""
        return ""

    with pytest.raises(ConfigurationError, match="tool lookup: a type hint names something not importable"):
        tool(lookup)
