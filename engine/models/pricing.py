"""What model calls cost (seed §5.3): a price table per model, exact integer arithmetic.

Prices are per million tokens in US dollars, for input, cached input and output. Costs are kept
as integer micro-dollars, so summing thousands of calls per session, user and day is exact and a
streamed and a non-streamed call with the same token counts cost exactly the same.

A price table is a JSON file::

    {"models": {"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.60,
                                "max_output_tokens": 16384}}}

Model names match exactly, else by the longest prefix ending in ``*`` (``"gpt-4o*"``); a model
with no entry costs nothing and is reported as unpriced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigurationError

MICROS_PER_DOLLAR = 1_000_000
TOKENS_PER_PRICE_UNIT = 1_000_000
DEFAULT_MAX_OUTPUT_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    """The most one answer can cost in output: the worst case a budget check assumes."""

    def cost_micros(self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> int:
        """Cost in micro-dollars; cached input tokens are part of input_tokens, billed at their rate."""
        cached = min(max(cached_input_tokens, 0), input_tokens)
        dollars_times_million = (
            (input_tokens - cached) * self.input + cached * self.cached_input + output_tokens * self.output
        )
        micros = dollars_times_million * MICROS_PER_DOLLAR / TOKENS_PER_PRICE_UNIT
        return int(micros.quantize(Decimal(1), rounding=ROUND_HALF_UP))

    def worst_case_micros(self, estimated_input_tokens: int) -> int:
        """The most a call with this input can cost: the full output allowance at the output price."""
        return self.cost_micros(estimated_input_tokens, self.max_output_tokens)


class PriceTable:
    """Prices by model name (a name ending in ``*`` is a prefix); ``load`` reads a JSON file of
    dollars per million tokens. Costs are integer micro-dollars."""

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._exact = {k: v for k, v in (prices or {}).items() if not k.endswith("*")}
        prefixes = [(k[:-1], v) for k, v in (prices or {}).items() if k.endswith("*")]
        self._prefixes = sorted(prefixes, key=lambda item: -len(item[0]))

    @staticmethod
    def from_dict(data: Mapping[str, Any], source: str = "price table") -> PriceTable:
        models = data.get("models")
        if not isinstance(models, dict):
            raise ConfigurationError(f'{source}: expected {{"models": {{name: prices}}}}')
        return PriceTable({name: _price(name, entry, source) for name, entry in models.items()})

    @staticmethod
    def load(path: Path) -> PriceTable:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigurationError(f"cannot read the price table {path}: {exc}") from exc
        return PriceTable.from_dict(data, str(path))

    def price_for(self, model: str) -> Price | None:
        if model in self._exact:
            return self._exact[model]
        return next((price for prefix, price in self._prefixes if model.startswith(prefix)), None)

    def cost_micros(
        self, model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0
    ) -> int:
        price = self.price_for(model)
        return price.cost_micros(input_tokens, output_tokens, cached_input_tokens) if price else 0


def _price(name: str, entry: Any, source: str) -> Price:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{source}: model {name!r} needs an object with input/cached_input/output")
    try:
        return Price(
            input=_dollars(entry["input"]),
            cached_input=_dollars(entry.get("cached_input", entry["input"])),
            output=_dollars(entry["output"]),
            max_output_tokens=int(entry.get("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS)),
        )
    except KeyError as exc:
        raise ConfigurationError(f"{source}: model {name!r} has no {exc.args[0]!r} price") from None
    except (ValueError, ArithmeticError) as exc:
        raise ConfigurationError(
            f"{source}: model {name!r} has a price that is not a number: {exc}"
        ) from None


def _dollars(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(repr(value))
    amount = Decimal(str(value))
    if amount < 0 or not amount.is_finite():
        raise ValueError(f"{value!r} must be a non-negative number")
    return amount


def format_micros(micros: int) -> str:
    """Micro-dollars as dollars for people: $0.000123."""
    return f"${Decimal(micros) / MICROS_PER_DOLLAR:.6f}"
