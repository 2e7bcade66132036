"""Which Arrow type each JSONL field has, found from the records themselves (the first, or as many as it takes).

pyarrow infers a JSON column's type from its first block, so a first record holding `null` or `[]` would
fix a wrong type; this reads records in Python only as far as it must, and names a record that fits no type.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from ..errors import InputError

_SNIFF_RECORDS = 256  # records read in Python at most to find the types the first record leaves open
_SNIFF_BYTES = 16 << 20


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "array" | "scalar"
    nested: bool  # wrapped in a one-element list (NeMo-RL logs each record as a micro-batch of one)
    element: pa.DataType

    def arrow_type(self) -> pa.DataType:
        value = pa.list_(self.element) if self.kind == "array" else self.element
        return pa.list_(value) if self.nested else value


_NAMES = {type(None): None, bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}
_SHOWN = {"bool": "a boolean", "int": "a number", "float": "a number", "number": "numbers", "string": "a string",
          "list": "a list", "object": "an object"}
_HINTS = {
    "log-probs": "write every log-prob as a JSON number (null for a missing one)",
    "mask": "write the mask as 0/1 or true/false on every token, the same kind in every record",
    "advantages": "write advantages as JSON numbers, either a list per record (one per token) or one number per "
                  "record, the same in every record",
    "row-mask": "write the sample mask as a JSON number (0 drops the record, 1 keeps it) or a boolean, not a string",
    "step": "every record needs an integer step, or drop the field to take the step from the file name",
    "id": "write one sequence id per record, a number or a string",
    "group": "group by a field with one label per record (e.g. env_name)",
}


@dataclass
class _Seen:
    """What the records read so far show of one field's JSON type; None where nothing showed it yet (null, [])."""

    name: str
    role: str  # "log-probs" | "mask" | "advantages" | "row-mask" | "step" | "id" | "group"
    kind: str | None  # "array" | "scalar"; None for advantages until a record shows which
    nested: bool | None = None
    nested_row: int = 0
    element: str | None = None  # "bool" | "int" | "float" | "string" (arrays: "bool" | "number")
    element_row: int = 0

    def resolved(self) -> bool:
        if self.kind is None or self.nested is None:
            return False
        return self.element is not None or (self.kind == "array" and self.role != "mask")

    def observe(self, value: object, row: int, source: str) -> None:
        if value is None:
            return
        kind = self.kind or ("array" if isinstance(value, list) else "scalar")
        if self.role == "advantages" and (kind == "array") != isinstance(value, list):
            self._refuse("a list per record" if kind == "array" else "one number per record", self.nested_row,
                         _SHOWN[_NAMES.get(type(value), "object")], value, row, source)
        self.kind = kind
        if kind == "array":
            self._observe_array(value, row, source)
        else:
            self._observe_scalar(value, row, source)

    def _observe_array(self, value: object, row: int, source: str) -> None:
        if not isinstance(value, list):
            self._bad(value, row, source, "a list of numbers")
            return
        first = next((v for v in value if v is not None), None)
        if first is None:
            return  # [] or all null: shows neither the wrapping nor the element type
        self._wrapping(isinstance(first, list), row, source)
        values = first if isinstance(first, list) else value
        found = {_NAMES.get(t, "object") for t in set(map(type, values))} - {None}
        if not found:
            return  # [[]] or [[null]]: the element type is still open
        if found <= {"int", "float"}:
            element = "number"
        elif self.role == "mask" and found == {"bool"}:
            element = "bool"
        else:
            bad = next(v for v in values if _NAMES.get(type(v), "object") not in (None, "int", "float"))
            self._bad(bad, row, source, "numbers" if self.role != "mask" else "0/1 or true/false values")
            return
        if self.element is None:
            self.element, self.element_row = element, row
        elif self.element != element:
            self._refuse(_SHOWN[self.element] if self.element == "number" else "booleans", self.element_row,
                         "numbers" if element == "number" else "booleans", None, row, source)

    def _observe_scalar(self, value: object, row: int, source: str) -> None:
        nested = isinstance(value, list)
        if isinstance(value, list):
            if len(value) > 1:
                raise InputError(
                    f"expected field {self.name!r} to hold one value per record, got a list of {len(value)} in "
                    f"{source} record {row}",
                    hint=_HINTS[self.role],
                )
            value = value[0] if value else None
        element = _NAMES.get(type(value), "object")
        if element in ("list", "object"):
            raise InputError(
                f"expected field {self.name!r} to hold a number or a string, got {type(value).__name__} in {source} "
                f"record {row}",
                hint=_HINTS[self.role],
            )
        if self.role == "step" and element != "int":
            raise InputError(f"expected an integer step, got {value!r} in {source} row {row} field {self.name!r}",
                             hint=_HINTS["step"])
        if self.role in ("advantages", "row-mask") and (element == "string" or
                                                         (element == "bool" and self.role == "advantages")):
            noun = "advantages" if self.role == "advantages" else "a per-record sample mask"
            raise InputError(f"expected a number for {noun}, got {value!r} in {source} row {row} field {self.name!r}",
                             hint=_HINTS[self.role])
        self._wrapping(nested, row, source)
        if element is None:
            return
        if self.element is None:
            self.element, self.element_row = element, row
        elif self.element == element:
            pass
        elif {self.element, element} == {"int", "float"}:
            self.element = "float"
        else:
            self._refuse(_SHOWN[self.element], self.element_row, _SHOWN[element], value, row, source)

    def _wrapping(self, nested: bool, row: int, source: str) -> None:
        if self.nested is None:
            self.nested, self.nested_row = nested, row
        elif self.nested != nested:
            self._refuse("values wrapped in a one-element list" if self.nested else "unwrapped values",
                         self.nested_row, "a wrapped value" if nested else "an unwrapped value", None, row, source)

    def _bad(self, value: object, row: int, source: str, wanted: str) -> None:
        shown = _SHOWN.get(_NAMES.get(type(value), "object"), "a value")
        raise InputError(
            f"expected {wanted} in field {self.name!r}, got {shown} ({_clip(value)}) in {source} row {row}",
            hint=_HINTS[self.role],
        )

    def _refuse(self, before: str, before_row: int, now: str, value: object, row: int, source: str) -> None:
        shown = f" ({_clip(value)})" if value is not None else ""
        raise InputError(
            f"expected field {self.name!r} to hold {before} in every record, as in row {before_row}, got {now}{shown} "
            f"in {source} row {row}",
            hint=_HINTS[self.role],
        )

    def field(self, nested_default: bool) -> Field:
        nested = self.nested if self.nested is not None else nested_default
        if self.kind == "array" or (self.kind is None and self.role in ("log-probs", "mask")):
            return Field(self.name, "array", nested, pa.bool_() if self.element == "bool" else pa.float64())
        default = pa.float64() if self.role in ("advantages", "row-mask") else \
            pa.int64() if self.role == "step" else pa.string()
        types = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "string": pa.string()}
        return Field(self.name, "scalar", nested, types.get(self.element or "", default))


def _clip(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def records(path: str) -> Iterator[tuple[int, int, dict | None]]:
    """(row, bytes read so far, record) for every non-blank line; the record is None where the line is not a
    JSON object (reading stops there: pyarrow's message says what is wrong with it)."""
    row, size = 0, 0
    with open(path, "rb") as handle:
        for line in handle:
            size += len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            yield row, size, record if isinstance(record, dict) else None
            row += 1


def infer_fields(path: str, wanted: dict[str, str], advantage: str | None, whole: bool) -> dict[str, Field]:
    """The arrow type of every field we read, from the records up to where each type shows (`whole`: all of them).

    A first record's `null`, `[]` or all-null list tells neither the element type nor the one-element-list
    wrapping, so later records decide; a record that contradicts an earlier one is refused here, naming its
    row and field.
    """
    seen = {name: _Seen(name, role, "array" if role in ("log-probs", "mask") else None if name == advantage
                        else "scalar") for name, role in wanted.items()}
    for row, size, record in records(path):
        if record is None:
            break
        for name, state in seen.items():
            state.observe(record.get(name), row, path)
        if not whole and (row + 1 >= _SNIFF_RECORDS or size >= _SNIFF_BYTES
                          or all(s.resolved() for s in seen.values())):
            break
    wrapped = [s.nested for s in seen.values() if s.kind == "array" and s.nested is not None]
    return {name: state.field(any(wrapped)) for name, state in seen.items()}
