"""Fixed-width text tables of a benchmark's rows (`prism bench emulate`, `prism bench pruning`).

A column is `(header, spec, value)`: a row's cell is `format(value(row), spec)`, and the header takes the
cell's width and alignment (right unless the spec says otherwise). `SEP` separates groups of columns.
"""

from __future__ import annotations

import re
from typing import Callable

Column = tuple[str, str, Callable[[dict], object]]
SEP: Column = ("|", "", lambda _row: "|")
_ALIGN_WIDTH = re.compile(r"([<>^]?)(\d*)")


def _header_spec(spec: str) -> str:
    align, width = _ALIGN_WIDTH.match(spec).groups()
    return f"{align or '>'}{width}"


def header(columns: list[Column]) -> str:
    return " ".join(format(name, _header_spec(spec)) for name, spec, _ in columns)


def line(columns: list[Column], row: dict) -> str:
    return " ".join(format(value(row), spec) for _, spec, value in columns)


def render(title: str, columns: list[Column], rows: list[dict]) -> str:
    """The title, the header, then one line per row."""
    return "\n".join([title, header(columns)] + [line(columns, r) for r in rows])
