"""The source formats a spec may name: one row each, the `source` keys it reads and its checks.

The one table of formats. The spec's checks take the names and each row's checks from it; the
server opens each name with its reader (`input_server.data.formats`, held to these names by a
test), and docs/spec.md lists the same names (a test again). A new format is one row here and
one reader module on the server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from input_client.errors import SpecError

if TYPE_CHECKING:
    from input_client._spec_tables import SourceSpec

# The `source` keys, `paths` aside, that say how a file's records are read.
READ_KEYS = ("text_field", "token_field", "record_format")
# What an ArrayRecord record holds (`record_format`).
RECORD_FORMATS = ("json", "text", "tf_example")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Format:
    """One source format: what a spec's `source` table may say with it.

    Attributes:
      name: its `source.format`.
      reads: the keys of `READ_KEYS` that say how its records are read (the server names
        them when a file does not fit); empty: a record is the document as it stands.
      refuses: keys it does not read that must keep their defaults, each with the reason
        its message gives (a key set there is a spec written for another format, refused
        rather than silently ignored). Checked before each key's own check.
      check: what it asks of its keys together, after each key's own check: raises
        `SpecError` naming the key.
    """

    name: str
    reads: tuple[str, ...]
    refuses: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check: Callable[[SourceSpec, str], None] | None = None

    def __post_init__(self):
        object.__setattr__(self, "refuses", MappingProxyType(dict(self.refuses)))
        unknown = [k for k in (*self.reads, *self.refuses) if k not in READ_KEYS]
        if unknown:
            raise ValueError(f"format {self.name!r} names keys {unknown}; known: {READ_KEYS}.")


def _ids_need_records_that_hold_them(s: SourceSpec, key: str) -> None:
    if s.token_field and s.record_format == "text":
        raise SpecError(
            f"{key}.record_format",
            s.record_format,
            'holds text, not token ids: use "json" or "tf_example" with `token_field`',
        )


_TEXT_FIELDS = ("text_field", "token_field")

# By name, in the order messages list them ("must be one of jsonl, text, ...").
FORMATS: Mapping[str, Format] = MappingProxyType(
    {
        f.name: f
        for f in (
            Format(name="jsonl", reads=_TEXT_FIELDS),
            Format(
                name="text",
                reads=(),
                refuses={
                    "text_field": 'means nothing with format "text" (each line is the document): '
                    "leave it out",
                    # Names the formats that read `token_field` (a test holds it to the rows).
                    "token_field": 'means nothing with format "text" (lines are text to '
                    "tokenize; pre-tokenized ids come in jsonl, parquet, arrayrecord or "
                    "tfrecord): leave it out",
                },
            ),
            Format(
                name="arrayrecord",
                reads=(*_TEXT_FIELDS, "record_format"),
                check=_ids_need_records_that_hold_them,
            ),
            Format(name="parquet", reads=_TEXT_FIELDS),
            Format(name="tfrecord", reads=_TEXT_FIELDS),
        )
    }
)
NAMES = tuple(FORMATS)
