"""The document order's one interface (`data.order.Order`, issue 52): a shard's order, a
mixture's and a resharded state's each answer it, so no code asks which class an order is."""

from __future__ import annotations

import ast

import pytest

from input_client.elastic import reshard
from input_server.batching.resume import Position, parse_state
from input_server.data.elastic import ReshardedOrder
from input_server.data.mixture import MixtureOrder, order_for
from input_server.data.order import DocumentOrder, Order
from tests.support import ROOT
from tests.support.elastic import Stream, spec_of

ORDER_CLASSES = {"Order", "DocumentOrder", "MixtureOrder", "ReshardedOrder"}
# Two small corpora: one source, and a mixture of two (documents of 5 to 34 tokens).
ONE = [[5 + (r * 7) % 30 for r in range(40)]]
TWO = [*ONE, [3 + (r * 11) % 29 for r in range(30)]]


def _class_checks(tree: ast.AST) -> list[str]:
    """Every `isinstance`/`issubclass` (and `type(x) is`/`==`) in `tree` that names an order
    class: what the protocol is there to make unnecessary."""

    def names(node: ast.AST) -> set[str]:
        return {
            n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Name | ast.Attribute)
        }

    found = []
    for node in ast.walk(tree):
        asked = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"isinstance", "issubclass"}
            and len(node.args) == 2
        ):
            asked = node.args[1]
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Call)
            and isinstance(node.left.func, ast.Name)
            and node.left.func.id == "type"
            and all(isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops)
        ):
            asked = ast.Tuple(elts=node.comparators)
        if asked is not None and names(asked) & ORDER_CLASSES:
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize(
    "code, caught",
    [
        ("isinstance(o, MixtureOrder)", True),
        ("not isinstance(o.order, DocumentOrder)", True),
        ("isinstance(o, (int, elastic.ReshardedOrder))", True),
        ("isinstance(o, Order | None)", True),
        ("type(o) is MixtureOrder", True),
        ("isinstance(o, dict)", False),
        ("o.at is not None", False),
    ],
)
def test_the_rule_catches_a_class_check_on_an_order(code, caught):
    assert bool(_class_checks(ast.parse(code))) == caught


def test_no_server_code_asks_an_order_its_class():
    """Ask the order (`Order`'s members), never which kind it is: a second kind told apart by
    `isinstance` is a branch every new kind must find."""
    bad = []
    for path in sorted((ROOT / "input_server").rglob("*.py")):
        for check in _class_checks(ast.parse(path.read_text(), str(path))):
            bad.append(f"{path.relative_to(ROOT)}: {check}")
    assert not bad, bad


def _spec(lengths, shard=(0, 1)):
    return spec_of(
        lengths, shard=shard, packing="concat_then_split", long_documents="split",
        seq_len=8, size=2, epochs=0,
    )  # fmt: skip


def _resharded(lengths, take=(2, 3)) -> tuple[Stream, list]:
    """The one new host's stream of a run of `len(take)` old hosts, each after `take[i]`
    batches (stopped inside a document: heads), and the old hosts' states."""
    states = []
    for i, batches in enumerate(take):
        s = Stream(_spec(lengths, (i, len(take))), lengths)
        for _ in range(batches):
            s.next()
        states.append(s.state)
    return Stream(_spec(lengths), lengths, reshard(states, 1)[0]), states


def _fresh(lengths) -> Order:
    return order_for(_spec(lengths), Stream(_spec(lengths), lengths).records)


STREAMS = {
    "one source": lambda: Stream(_spec(ONE), ONE),
    "mixture": lambda: Stream(_spec(TWO), TWO),
    "resharded": lambda: _resharded(ONE)[0],
    "resharded mixture": lambda: _resharded(TWO)[0],
}
KINDS = {kind: lambda kind=kind: STREAMS[kind]().order for kind in STREAMS}


def test_the_three_classes_are_orders():
    """Each subclasses the protocol (taking its one-source defaults), not only its shape."""
    for cls in (DocumentOrder, MixtureOrder, ReshardedOrder):
        assert Order in cls.__mro__, cls


@pytest.mark.parametrize("kind", KINDS)
def test_an_orders_components_make_it_again(kind):
    """One source is its own component; a mixture's are one-source orders, and the same
    mixture over them reads the same documents."""
    order = KINDS[kind]()
    mixed = "mixture" in kind
    parts = order.components
    assert len(parts) == (2 if mixed else 1)
    assert (order.at is not None) == mixed
    if not mixed:
        assert parts == [order]
    for part in parts:
        assert part.components == [part] and part.at is None
        assert part.resharded == ("resharded" in kind)
    assert order.resharded == ("resharded" in kind)
    again = order.with_components(parts)
    assert again.at == order.at
    assert again.source_indices(0, 60).tolist() == order.source_indices(0, 60).tolist()


@pytest.mark.parametrize("kind", ["one source", "mixture"])
def test_a_position_and_its_interleave_come_back_from_the_state(kind):
    """What resume needs of an order: its interleave (`at`) rides in the state and is read
    back, with the ordinal and offset, by the order it was made from."""
    order = KINDS[kind]()
    pos = Position(seq=5, doc=17, offset=3, mix=order.at)
    fingerprint = "f" * 16
    back = parse_state(
        pos.state(fingerprint),
        fingerprint=fingerprint,
        num_docs=len(order),
        mixture=order if order.at is not None else None,
    )
    assert back == pos


@pytest.mark.parametrize("kind", STREAMS)
def test_a_stream_of_each_kind_reads_on_from_its_state(kind):
    """The state a batch carries (the order's interleave in it, and a resharded state's
    layout) makes the same order again: the batches after it are the same."""
    s = STREAMS[kind]()
    for _ in range(3):
        s.next()
    again = Stream(s.spec, s.lengths, s.state)
    assert type(again.order) is type(s.order) and again.order.at == s.order.at
    for _ in range(6):
        assert again.next().tolist() == s.next().tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_each_component_stands_where_the_stream_does(kind):
    """`component_positions(doc, offset)`: each component's next document is the count of its
    documents before `doc`, and only the one `doc` lies in has the offset."""
    order = KINDS[kind]()
    doc, offset = 23, 4
    where = order.component_positions(doc, offset)
    if order.at is None:
        assert where == [(doc, offset)]
        return
    comp, ordinal = order.locate(0, doc + 1)
    for c, (nxt, head) in enumerate(where):
        mine = ordinal[:doc][comp[:doc] == c]
        assert nxt == (int(mine[-1]) + 1 if len(mine) else order.at.bases[c])
        assert head == (offset if c == comp[doc] else 0)


@pytest.mark.parametrize("lengths", [ONE, TWO], ids=["one source", "mixture"])
def test_the_heads_old_hosts_used_follow_the_order(lengths):
    """A resharded order's heads are the documents the old hosts stood inside (one new host:
    all of them), and a mixture's map through its interleave to its components' own."""
    stream, states = _resharded(lengths)
    order = stream.pos.order
    assert _fresh(lengths).used_heads() == {}
    heads = order.used_heads()
    assert heads, "no old host stood inside a document: nothing tested"
    assert sorted(heads.values()) == sorted(s["offset"] for s in states if s["offset"])
    for x, h in heads.items():
        if order.at is None:
            assert order.heads[x] == h
            continue
        comp, ordinal = order.locate(x, x + 1)
        assert order.components[int(comp[0])].used_heads()[int(ordinal[0])] == h


@pytest.mark.parametrize("kind", KINDS)
def test_past_what_it_was_dealt_an_order_is_its_own_shards(kind):
    """`settled_at`: a shard's order is its own; a resharded one is its shard's once past its
    dealt documents (None before), where the shard's own order reads the same documents."""
    order = KINDS[kind]()
    if kind == "one source":
        assert order.settled_at(9) == (9, None)
        return
    own, past = order.components, 9  # a fresh mixture is its shards' own from the start
    if order.resharded:
        assert order.settled_at(0) is None
        own = [p.fresh for p in order.components]
        period = sum(order.at.quotas) if order.at is not None else 1
        past = 10 + period * max(p.dealt for p in order.components)  # each component past it
    doc, at = order.settled_at(past)
    plain = order.with_components(own).moved(at)
    assert plain.source_indices(doc, doc + 30).tolist() == (
        order.source_indices(past, past + 30).tolist()
    )
