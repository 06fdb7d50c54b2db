"""The source formats' one table (`input_client.formats`): the spec's checks take their names and
checks from it, the server has a reader for each of its names and no other, docs/spec.md lists
the same names, and no module keeps a format's name in a branch of its own (issue 52: a new
format is one row and one reader module)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from input_client import formats, spec
from input_client.spec import PipelineSpec, SpecError
from input_server.data.formats import READERS
from tests.support import ROOT

NAMES = set(formats.NAMES)
TABLE = ROOT / "client" / "input_client" / "formats.py"
# The modules that once chose by format name (an if/elif chain each) and now look it up.
LOOKUPS = [
    ROOT / "input_server" / "data" / "sources.py",
    ROOT / "client" / "input_client" / "_spec_checks.py",
]
PACKAGES = [ROOT / "input_server", ROOT / "client" / "input_client"]


def test_every_format_has_a_reader_and_every_reader_a_format():
    no_reader = sorted(NAMES - set(READERS))
    no_row = sorted(set(READERS) - NAMES)
    assert not no_reader, f"add their readers to input_server/data/formats.py: {no_reader}"
    assert not no_row, f"add their rows to client/input_client/formats.py, or drop them: {no_row}"


def test_the_spec_checks_take_the_tables_names():
    assert spec.FORMATS == formats.NAMES
    assert spec.RECORD_FORMATS == formats.RECORD_FORMATS


def test_a_row_naming_a_key_no_source_has_is_refused():
    with pytest.raises(ValueError, match="'csv' names keys \\['column'\\]"):
        formats.Format(name="csv", reads=("column",))


def _source(**keys) -> PipelineSpec:
    return PipelineSpec(source={"paths": ["a.data"], **keys}, tokenizer={"model": "m.model"})


@pytest.mark.parametrize("name", formats.NAMES)
def test_each_format_is_valid_with_the_default_keys(name):
    assert _source(format=name).source.format == name


def test_a_format_not_in_the_table_is_refused_naming_the_tables_formats():
    with pytest.raises(SpecError) as e:
        _source(format="csv")
    assert str(e.value) == f"`source.format` must be one of {', '.join(formats.NAMES)}, got 'csv'."


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            {"format": "text", "text_field": "body"},
            '`source.text_field` means nothing with format "text" (each line is the document): '
            "leave it out, got 'body'.",
        ),
        (
            {"format": "text", "text_field": ""},  # refused as unread before its own check
            '`source.text_field` means nothing with format "text" (each line is the document): '
            "leave it out, got ''.",
        ),
        (
            {"format": "text", "token_field": "ids"},
            '`source.token_field` means nothing with format "text" (lines are text to tokenize; '
            "pre-tokenized ids come in jsonl, parquet, arrayrecord or tfrecord): leave it out, "
            "got 'ids'.",
        ),
        (
            {"format": "arrayrecord", "record_format": "text", "token_field": "ids"},
            '`source.record_format` holds text, not token ids: use "json" or "tf_example" with '
            "`token_field`, got 'text'.",
        ),
    ],
    ids=["text-text_field", "text-empty-text_field", "text-token_field", "arrayrecord-ids"],
)
def test_a_rows_checks_say_what_they_said_before_the_table(keys, message):
    with pytest.raises(SpecError) as e:
        _source(**keys)
    assert str(e.value) == message


def test_the_text_refusal_names_the_formats_that_read_ids():
    reason = formats.FORMATS["text"].refuses["token_field"]
    listed = reason.split("come in ", 1)[1].split(")", 1)[0]
    named = set(re.findall(r"\w+", listed)) - {"or"}
    assert named == {f.name for f in formats.FORMATS.values() if "token_field" in f.reads}


def _spec_md_formats() -> list[str]:
    """The formats docs/spec.md's example spec lists in the comment of its `format =` line (and
    the comment lines under it): the words between `|`, up to "Left out"."""
    lines = (ROOT / "docs" / "spec.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("format = "))
    comment = [lines[start].split("#", 1)[1]]
    for line in lines[start + 1 :]:
        if not line.lstrip().startswith("#"):
            break
        comment.append(line.split("#", 1)[1])
    listed = " ".join(comment).split("Left out", 1)[0]
    return [re.match(r"\s*(\w+)", part).group(1) for part in listed.split("|")]


def test_the_spec_docs_name_every_format_and_no_other():
    listed = _spec_md_formats()
    assert sorted(listed) == sorted(NAMES), (
        "docs/spec.md's `format =` line lists the formats of client/input_client/formats.py",
        listed,
    )


def _names_in(nodes) -> list[str]:
    """The format names among `nodes` that are string constants."""
    return [n.value for n in nodes if isinstance(n, ast.Constant) and n.value in NAMES]


def _names_compared(path: pathlib.Path) -> list[str]:
    """Every comparison with a format's name (`== "text"`, `in ("jsonl", ...)`) and every
    `case "text":` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            operands = []
            for operand in (node.left, *node.comparators):
                listed = isinstance(operand, (ast.Tuple, ast.List, ast.Set))
                operands += operand.elts if listed else [operand]
            named = _names_in(operands)
        elif isinstance(node, ast.MatchValue):
            named = _names_in([node.value])
        else:
            continue
        if named:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_format_name_is_compared_where_the_table_is_looked_up():
    """What a format does is its row's (`refuses`, `check`, `reads`) or its reader's, found by
    name: a branch on a name in these modules would be a second place to add a format to."""
    found = [hit for path in LOOKUPS for hit in _names_compared(path)]
    assert not found, f"look the format up in input_client.formats (or its reader) instead: {found}"


def _imports_of(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_spec_checks_and_the_sources_read_the_one_table():
    checks, sources = LOOKUPS[1], LOOKUPS[0]
    assert "input_client.formats" in _imports_of(checks)
    assert "input_client.formats" in _imports_of(sources)  # the keys each format reads
    assert "input_server.data.formats" in _imports_of(sources)  # each format's reader


def test_no_module_keeps_its_own_list_of_formats():
    """A literal list of three or more format names outside the table is a copy of it that a
    new format would miss (the server's registry is a dict of readers, checked above)."""
    found = []
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            if path == TABLE or "_proto" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                listed = isinstance(node, (ast.Tuple, ast.List, ast.Set))
                if listed and len(set(_names_in(node.elts))) >= 3:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"read input_client.formats.NAMES instead: {found}"
