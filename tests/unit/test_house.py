"""The rules the tree keeps: who may import whom, no cycles, small modules, no shadowed stdlib."""

from __future__ import annotations

import ast
import inspect
import pathlib
import sys

from tests.support import ROOT

PACKAGES = {"input_client": ROOT / "client" / "input_client", "input_server": ROOT / "input_server"}
# A module holds one concept and is split where its meaning splits, never to meet a count
# (issue 41: a 400-line cap shaped splits). The ceiling is a backstop well past any one
# concept's size here; the rule that counts is the docstring test below: every module says,
# first thing, the one thing it holds.
MAX_LINES = 600


def _modules() -> dict[str, pathlib.Path]:
    """Every hand-written module of both packages by dotted name (generated stubs aside)."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            if "_proto" in rel.parts or rel.name.endswith("_pb2") or rel.name.endswith("_grpc"):
                continue
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[tuple[str, int]]:
    """(imported module, line) for every import in the file, lazy ones (in functions) too;
    `from pkg import sub` names the submodule when there is one."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")
                if path.name != "__init__.py":
                    base.pop()
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.add((sub if sub in MODULES else module, node.lineno))
    return found


def _project_edges() -> dict[str, set[str]]:
    return {m: {i for i, _ in _imports(m, p) if i in MODULES} for m, p in MODULES.items()}


def test_the_client_never_imports_the_server():
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line} imports {i}"
        for m in MODULES
        if m.startswith("input_client")
        for i, line in _imports(m, MODULES[m])
        if i.split(".")[0] == "input_server"
    ]
    assert not bad, bad


def test_the_server_uses_only_public_names_of_the_client():
    bad = []
    for m, path in MODULES.items():
        if not m.startswith("input_server"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("input_client"):
                private = [p for p in node.module.split(".") if p.startswith("_")]
                private += [a.name for a in node.names if a.name.startswith("_")]
                if private:
                    bad.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.module} "
                        f"{[a.name for a in node.names]}"
                    )
            elif isinstance(node, ast.Import):
                bad += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name.startswith("input_client") and "._" in a.name
                ]
    assert not bad, bad


def test_no_import_cycle_between_the_projects_modules():
    edges = _project_edges()
    # A package's __init__ re-exporting its own submodules is its public face, not a cycle
    # (the submodules never import it back).
    for m in edges:
        if MODULES[m].name == "__init__.py":
            edges[m] = {i for i in edges[m] if not i.startswith(m + ".")}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                cycles.append(path[path.index(n) :] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_no_hand_written_module_is_over_the_limit():
    big = {
        str(p.relative_to(ROOT)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"split these where their meaning splits (at most {MAX_LINES} lines): {big}"


def test_every_module_says_the_one_thing_it_holds():
    """A module opens with a docstring whose first line names its concept: a module that
    cannot say what it holds in a line holds more than one thing."""
    mute = {
        str(p.relative_to(ROOT))
        for p in MODULES.values()
        if p.name != "__init__.py"
        and not (ast.get_docstring(ast.parse(p.read_text())) or "").strip().splitlines()
    }
    assert not mute, f"say in a docstring's first line what each of these holds: {sorted(mute)}"


def test_no_module_is_named_like_a_standard_library_module():
    stdlib = set(sys.stdlib_module_names)
    clash = [m for m in MODULES if m.split(".")[-1] in stdlib]
    assert not clash, clash


def test_the_pipeline_takes_its_parallelism_from_the_caller():
    from input_server.batching.pipeline import Pipeline

    parallelism = inspect.signature(Pipeline.stream).parameters["parallelism"]
    assert parallelism.kind is inspect.Parameter.KEYWORD_ONLY
    assert parallelism.default is inspect.Parameter.empty  # no hidden default that tunes
    batching = [m for m in MODULES if m.startswith("input_server.batching")]
    reaches = {i for m in batching for i, _ in _imports(m, MODULES[m])}
    assert not {i for i in reaches if i.startswith("input_server.autotune")}, reaches


def test_serving_never_imports_the_commands():
    """The serving path never reaches the commands (`cli/`), the benchmark or the test
    fixtures: a server runs without them, and they may change without touching it."""
    serving = [
        m
        for m in MODULES
        if m.startswith(
            (
                "input_server.serving",
                "input_server.batching",
                "input_server.data",
                "input_server.autotune",
            )
        )
    ]
    commands = ("input_server.cli", "input_server.benchmark", "input_server.testing")
    assert not {m for m in _reached(serving) if m.startswith(commands)}


def test_no_command_needs_the_test_fixtures():
    """`testing/` holds stand-ins and fixtures; what a command needs (`tokenizer train`'s
    trainer, the demo's corpus, `bench --kinds`' models) is the product's, in `data/`."""
    commands = [m for m in MODULES if m.startswith(("input_server.cli", "input_server.benchmark"))]
    assert not {m for m in _reached(commands) if m.startswith("input_server.testing")}


def _reached(start: list[str]) -> set[str]:
    """Every project module `start`'s modules import, directly or not (lazy imports too)."""
    edges = _project_edges()
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += edges.get(m, ())
    return seen


def test_nothing_outside_the_client_reads_its_private_parts():
    """The server's commands and the scripts use the client's public face (`InputClient`'s
    methods), never its channel or stub: what they rely on would otherwise change unseen."""
    import re

    private = re.compile(r"\b(?:client|c|it|self\._client)\._(?!_)[a-z]\w*")
    files = [p for m, p in MODULES.items() if m.startswith("input_server")]
    files += sorted((ROOT / "scripts").rglob("*.py"))
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert not found, found


def _script_files() -> list[pathlib.Path]:
    return sorted((ROOT / "scripts").rglob("*.py"))


def _is_sys_path(node: ast.AST) -> bool:
    """`sys.path`, or a part of it (`sys.path[0]`, `sys.path[:1]`)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def test_no_script_imports_the_tests():
    """Scripts use the installed package (`input_server.testing` for what they share with the
    tests): `tests/` is no package a user of a script has."""
    bad = []
    for path in _script_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bad += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {n}"
                for n in names
                if n == "tests" or n.startswith("tests.")
            ]
    assert not bad, bad


def test_no_script_changes_sys_path():
    """A script runs as a file: its own folder is on the path (for its siblings), the package
    is installed; a path patched by hand would hide an import that works nowhere else."""
    bad = []
    for path in _script_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                changed = any(_is_sys_path(t) for t in targets)
            elif isinstance(node, ast.Delete):
                changed = any(_is_sys_path(t) for t in node.targets)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                changed = _is_sys_path(node.func.value) and node.func.attr in {
                    "append", "extend", "insert", "remove", "pop", "clear", "__setitem__",
                }  # fmt: skip
            else:
                continue
            if changed:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not bad, bad


# A function past this does more than one thing: name its steps.
MAX_FUNCTION_LINES = 80
# The few allowed past it, each with why (at most 4: the list is a debt, not a door).
LONG_FUNCTIONS: dict[str, str] = {}


def _functions() -> dict[str, int]:
    """Lines of every function and method of both packages, by dotted name."""
    out = {}
    for module, path in MODULES.items():

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}.{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        out[name] = child.end_lineno - child.lineno + 1
                    walk(child, name)

        walk(ast.parse(path.read_text(), str(path)), module)
    return out


def test_no_function_is_over_the_limit():
    functions = _functions()
    long = {n: lines for n, lines in functions.items() if lines > MAX_FUNCTION_LINES}
    unexcused = {n: lines for n, lines in long.items() if n not in LONG_FUNCTIONS}
    assert not unexcused, f"name the steps of (at most {MAX_FUNCTION_LINES} lines): {unexcused}"
    assert len(LONG_FUNCTIONS) <= 4
    # An excuse outlives its function's length: drop it (the list only shrinks).
    stale = [n for n in LONG_FUNCTIONS if functions.get(n, 0) <= MAX_FUNCTION_LINES]
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines (or gone): {stale}"


SERVING = PACKAGES["input_server"] / "serving"


def test_serving_never_probes_a_stream_for_attributes():
    """Every stream is one type (a fixed count's is a switching stream never switched): code
    that asks a stream what it has (`getattr`/`hasattr`) is code for a second kind."""
    bad = []
    for path in sorted(SERVING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr"}
                and node.args
                and "stream" in ast.unparse(node.args[0]).lower()
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, bad


_CONTAINERS = {"dict", "list", "set", "defaultdict", "deque", "OrderedDict", "Counter", "count"}


def _holds_per_item_state(value: ast.AST) -> bool:
    """A container, or a counter of ids: what state kept per stream looks like."""
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in _CONTAINERS
    return False


def test_the_servicer_keeps_no_per_stream_state():
    """The servicer is glue: a stream's state is its `Stream`'s, the list of them `Streams`'.
    None of its methods assigns a container (the named pipelines aside) or counts anything."""
    tree = ast.parse((SERVING / "service.py").read_text())
    (servicer,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InputServicer"
    ]
    bad = []
    for node in ast.walk(servicer):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
            bad.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and ast.unparse(t.value) == "self"
                    and t.attr != "_pipelines"
                    and _holds_per_item_state(node.value)
                ):
                    bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not bad, bad


def test_no_module_imports_another_modules_private_name():
    """`from M import _name` where `_name` is a function, class or constant of M, not a module:
    a private name is its module's own (issue 41). Scripts are held to it too."""
    files = [*MODULES.values(), *(ROOT / "scripts").rglob("*.py")]
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            for a in node.names:
                if not a.name.startswith("_") or a.name.startswith("__"):
                    continue
                if f"{node.module}.{a.name}" in MODULES:  # a package's private module
                    continue
                if (node.module or "").startswith("google.protobuf") or "setuptools" in (
                    node.module or ""
                ):
                    continue  # generated stubs and the build backend: outside code's names
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}")
    assert not bad, bad


TESTS = ROOT / "tests"


def _test_imports(path: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import of a module of `tests` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
    return [(n, m, names) for n, m, names in found if m == "tests" or m.startswith("tests.")]


def test_tests_share_helpers_only_through_the_support_package():
    """A test module (or a conftest) imports another's helpers from `tests.support`, by their
    public names; never from another test module or a conftest, which pytest also loads
    under its own name (two copies of one module, its fixtures found twice)."""
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module, names in _test_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if module != "tests.support" and not module.startswith("tests.support."):
                bad.append(f"{where} imports {module} {names}")
            bad += [f"{where} imports {module}.{n}" for n in names if n.startswith("_")]
    assert not bad, bad


# Third-party or standard-library private attributes read on purpose, each with its reason.
# The project's own objects are never in here: their collaborators get public methods.
OUTSIDE_PRIVATES = {
    # Grain queues shared-memory frees on a class-level pool it offers no public door to;
    # waiting on it is how a closed stream's memory is known to be gone.
    ("input_server/batching/grain_adapter.py", "SharedMemoryArray._del_thread_pool"),
    # os._exit is the standard way to end a process without running its cleanup.
    ("input_server/cli/serve.py", "os._exit"),
    ("client/input_client/_pod_start.py", "os._exit"),
    # tiktoken's Rust core: its encode_to_tiktoken_buffer returns ids without Python lists.
    ("input_server/data/tokenizers/tiktoken.py", "self.model()._core_bpe"),
    ("input_server/data/tokenizers/tiktoken.py", "enc._core_bpe"),
    # etils' lazy `__import__`, the function its `lazy_imports` puts in `builtins` for every
    # thread: `warm._lazy_here` puts it there for Grain's loading thread alone (issue 50).
    ("input_server/serving/warm.py", "sys.modules[epy.lazy_imports.__module__]._lazy_import"),
    # The one way to read other threads' stacks from inside a process (where py-spy cannot
    # reach it: gVisor).
    ("scripts/bench/sampled.py", "sys._current_frames"),
}


def test_no_object_touches_another_objects_private_attribute():
    """`x._name` is read or written only where `x` is `self` or `cls` (issue 41): a class's
    collaborators use its public methods, so what it keeps private it may change."""
    files = [*MODULES.values(), *(ROOT / "scripts").rglob("*.py")]
    bad = []
    for path in files:
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") and node.attr.endswith("__"):
                continue  # dunders: the language's own protocol
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                continue
            if (rel, ast.unparse(node)) in OUTSIDE_PRIVATES:
                continue
            bad.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, bad
    gone = {(f, a) for f, a in OUTSIDE_PRIVATES if not (ROOT / f).exists()}
    assert not gone, f"excuses for files that are gone: {gone}"


# Where serving/ and batching/ look an attribute up by name, each with its reason: never to
# ask one of the project's own objects what it has (that is what an interface says).
PROBES = {
    # A gRPC handler's behaviour sits in the attribute its kind names (unary_unary, …).
    ("serving/auth.py", "getattr(handler, kind)"),
    ("serving/auth.py", "getattr(grpc, f'{kind}_rpc_method_handler')"),
    # The config's own fields, checked by name in one loop.
    ("serving/config.py", "getattr(self, name)"),
    ("serving/config.py", "getattr(self, flag)"),
    # memfd_create is Linux-only.
    ("serving/tls.py", "hasattr(os, 'memfd_create')"),
    # A log record carries `extra=` fields only when a caller gave them.
    ("serving/logs.py", "getattr(record, 'event', None)"),
    ("serving/logs.py", "getattr(record, 'fields', None)"),
}


def test_serving_and_batching_ask_no_object_what_it_has():
    """No `getattr`/`hasattr` on the project's own objects in serving/ and batching/ (issue
    41): a probe by name is an interface nobody wrote down. Outside objects, listed above."""
    found = set()
    for package in ("serving", "batching"):
        for path in sorted((PACKAGES["input_server"] / package).glob("*.py")):
            rel = f"{package}/{path.name}"
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in {"getattr", "hasattr"}
                ):
                    found.add((rel, ast.unparse(node)))
    assert found <= PROBES, f"probes by name: {sorted(found - PROBES)}"
    assert PROBES <= found, f"excuses for probes that are gone: {sorted(PROBES - found)}"
