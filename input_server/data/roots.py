"""Which files a request may read: paths resolve (links followed) into the server's data roots.

A request's source paths, globs and tokenizer model each resolve to a real path, which must
lie inside one of the roots and be a regular file outside the kernel's pseudo-filesystems, or
the stream is refused with PERMISSION_DENIED naming the path as the client wrote it (a folder
inside the roots is the spec's mistake, INVALID_ARGUMENT, said with the way out). A glob's
fixed part must lie inside a root too, and its walk never enters a link that leads out or
reports what it skipped: a client learns nothing of files outside the roots, not even whether
they exist. The operator's own specs (`serve --pipelines`, the CLI's tools) use `OPERATOR`,
which reads what the server process can.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import glob
import itertools
import os
import re
import stat
import time

from input_server import cancel
from input_server.data.order import OrderBudget
from input_server.errors import (
    DataNotFoundError,
    InputServerError,
    InvalidSpecError,
    NotAFileError,
    UnreadableError,
    shorten,
)

_GLOB_CHARS = frozenset("*?[")
# Bounds on a request's globs: a glob's parts (each `**` multiplies the paths a walk can take)
# and the directory entries all of a request's walks may look at together (a walk of a whole
# disk is not a data set; counted per glob, 200 copies of one 4 KiB request walked a
# 20,000-entry folder 200 times, 4.7 s of CPU).
MAX_GLOB_PARTS = 32
MAX_GLOB_VISITS = 2_000_000
# And the CPU they may take: entries cost unequally (an entry a `**` walks is resolved and
# checked, ~7 us; one a `*` only matches, ~0.2 us), so 49 `**` globs over a 20,000-entry folder
# took 6.9 s within the visit bound. A real data set's globs take milliseconds.
MAX_GLOB_CPU_S = 2.0
# Kernel pseudo-filesystems: their "regular files" are live state (a process's environment,
# memory maps), never data.
_PSEUDO = ("/proc", "/sys", "/dev")


def _has_glob(part: str) -> bool:
    return bool(_GLOB_CHARS & set(part))


@dataclasses.dataclass(frozen=True)
class DataAccess:
    """The files a pipeline may read, and how many and how large.

    Attributes:
      roots: real paths of folders; None reads anything the process can (the operator's).
      max_files: the most files the source's paths may name after globbing; None = no cap.
      max_document_bytes: a longer record ends the stream with INVALID_ARGUMENT; None = no cap.
      max_decompressed_bytes: the most the compressed files of every reader in the process
        may expand to in memory, together (`records.DECOMPRESSED`); past it,
        RESOURCE_EXHAUSTED naming the file; None = no cap (and not counted).
      order_budget: what the stream's shuffled document order may hold (a request's, from the
        server's --stream-memory-mb: `service`); None = no cap.
      tokenizing_budget: what the documents a process tokenizes at once may take, estimated
        before the work (`tokenizers.memory`); one that alone would take more is refused
        with RESOURCE_EXHAUSTED. The server's --stream-memory-mb; None = not counted.
    """

    roots: tuple[str, ...] | None = None
    max_files: int | None = None
    max_document_bytes: int | None = None
    max_decompressed_bytes: int | None = None
    order_budget: OrderBudget | None = None
    tokenizing_budget: int | None = None

    def __post_init__(self):
        if self.roots is not None:
            object.__setattr__(self, "roots", tuple(os.path.realpath(r) for r in self.roots))

    # --- single files ------------------------------------------------------------------------

    def file(self, path: str, key: str) -> str:
        """The path to open for `path`, named under `key` (e.g. `tokenizer.model`) in errors.

        Raises:
          UnreadableError: outside the roots, or not a regular file (PERMISSION_DENIED).
          NotAFileError: a folder (INVALID_ARGUMENT), said with the way out.
          DataNotFoundError: inside the roots, and missing.
        """
        if self.roots is None:
            if os.path.isdir(path):  # the operator's own spec: any path may be told of
                raise not_a_file(key, path, path)
            return path
        real = self._real(path)  # non-strict: never raises, even for a name too long
        if not self.inside(real):
            raise self._outside(key, path)
        try:
            st = os.stat(real)
        except PermissionError:
            raise UnreadableError(
                f"`{key}`: the server may not read {shorten(path)!r} (permission denied)."
            ) from None
        except OSError:  # missing, or a name too long to exist
            raise DataNotFoundError(f"`{key}`: no such file {shorten(path)!r}.") from None
        if stat.S_ISDIR(st.st_mode):  # inside the roots: what the path is may be said
            raise not_a_file(key, path, real)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableError(
                f"`{key}`: {shorten(path)!r} is not a regular file; only regular files are read."
            )
        return real

    def _real(self, path: str) -> str:
        assert self.roots is not None
        # `..` applies to the path as written (normpath) before links are followed: applied
        # after a link outside the roots, it would tell whether that path is a link.
        return os.path.realpath(os.path.normpath(os.path.join(self.roots[0], path)))

    def inside(self, real: str) -> bool:
        """Whether the resolved path `real` lies under a data root (and not in /proc, /sys…)."""
        assert self.roots is not None
        if any(real == p or real.startswith(p + "/") for p in _PSEUDO):
            return False
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in self.roots)

    @staticmethod
    def _outside(key: str, path: str) -> UnreadableError:
        return UnreadableError(
            f"`{key}`: {shorten(path)!r} is outside the server's data "
            f"roots (or not a regular file there); ask the operator for "
            f"--data-root."
        )

    # --- the source's paths ------------------------------------------------------------------

    def expand(self, patterns: tuple[str, ...] | list[str]) -> list[str]:
        """The files `patterns` name, in order (each glob's matches sorted); each pattern must
        name at least one.

        Raises:
          DataNotFoundError, UnreadableError: as `file`, or a glob matches nothing.
          InvalidSpecError: more than `max_files` files.
        """
        return [real for real, _ in self.expand_named(patterns)]

    def expand_named(
        self, patterns: tuple[str, ...] | list[str], *, ends: list[int] | None = None
    ) -> list[tuple[str, str]]:
        """As `expand`, each file with its name as the client wrote it (`(real, written)`): a
        glob's match is its written folder and the names it matched, links unresolved, so
        messages about the file tell the client nothing of where links lead. `ends` gets the
        number of files so far after each pattern."""
        files: list[tuple[str, str]] = []
        budget = _Budget()
        walked: dict[str, list[tuple[str, str]]] = {}  # a pattern named twice is walked once
        resolved: dict[str, str] = {}  # and a plain path resolved once
        for pattern in patterns:
            cancel.check()
            if _has_glob(pattern):
                try:
                    matched = walked.get(pattern)
                    if matched is None:
                        matched = walked[pattern] = self._glob(pattern, budget)
                except RecursionError:  # folders nested deeper than Python's stack
                    raise InvalidSpecError(
                        f"`source.paths`: the glob {shorten(pattern)!r} "
                        f"reaches folders nested too deep."
                    ) from None
                if not matched:
                    raise DataNotFoundError(
                        f"`source.paths`: the glob {shorten(pattern)!r} matches no file."
                    )
                files.extend(matched)
            elif self.roots is None:
                if os.path.isdir(pattern):
                    raise not_a_file("source.paths", pattern, pattern)
                if not os.path.isfile(pattern):
                    raise DataNotFoundError(f"`source.paths`: no such file {shorten(pattern)!r}.")
                files.append((pattern, pattern))
            else:
                # A plain path costs a resolve and a stat: counted with the globs' work, and
                # resolved once however often it is named (40,000 copies took 2.5 s).
                budget.charge(1, pattern)
                real = resolved.get(pattern)
                if real is None:
                    real = resolved[pattern] = self.file(pattern, "source.paths")
                files.append((real, pattern))
            self.check_count(len(files))
            if ends is not None:
                ends.append(len(files))
        return files

    def expand_each(
        self, groups: list[tuple[str, ...]], keys: list[str] | None = None
    ) -> list[list[tuple[str, str]]]:
        """`expand_named` of several components' patterns under one request's budget (glob
        work, file count): each component's files. A refusal names the component's key
        (`keys[i]`, e.g. `source[2]`) where it says `source`."""
        ends: list[int] = []
        flat = [p for g in groups for p in g]
        try:
            files = self.expand_named(flat, ends=ends)
        except InputServerError:
            if keys is None or len(ends) >= len(flat):  # after every pattern: the count
                raise
            failed = len(ends)  # the pattern being expanded
            group = next(
                i for i, end in enumerate(itertools.accumulate(map(len, groups))) if failed < end
            )
            with keyed(keys[group]):
                raise
        out, first, i = [], 0, 0
        for g in groups:
            i += len(g)
            last = ends[i - 1]
            out.append(files[first:last])
            first = last
        return out

    def check_count(self, n: int) -> None:
        """Refuses a spec whose paths name more than the server's --max-files."""
        if self.max_files is not None and n > self.max_files:
            raise InvalidSpecError(
                f"`source.paths` name more than {self.max_files:,} files "
                f"(the server's --max-files); use fewer or larger files."
            )

    def _glob(self, pattern: str, budget: _Budget) -> list[tuple[str, str]]:
        if self.roots is None:
            return [
                (p, p) for p in sorted(glob.iglob(pattern, recursive=True)) if os.path.isfile(p)
            ]
        written = pattern.split("/")
        wild = next(i for i, p in enumerate(written) if _has_glob(p))
        if ".." in written[wild:]:
            # normpath would fold `*/..` away (a different question: glob's `*/..` needs a
            # folder to match the `*`), and `..` after a link would tell where it leads.
            raise InvalidSpecError(
                f"`source.paths`: the glob {shorten(pattern)!r} has `..` after a wildcard; "
                f"write the folder before the wildcard."
            )
        parts = os.path.normpath(os.path.join(self.roots[0], pattern)).split("/")
        fixed = next(i for i, p in enumerate(parts) if _has_glob(p))
        base = os.path.realpath("/".join(parts[:fixed]) or "/")
        if not self.inside(base):
            raise self._outside("source.paths", pattern)
        rest = [
            p
            for i, p in enumerate(parts[fixed:])
            if p and not (p == "**" and i and parts[fixed + i - 1] == "**")
        ]  # `**/**` = `**`
        if len(rest) > MAX_GLOB_PARTS:
            raise InvalidSpecError(
                f"`source.paths`: the glob {shorten(pattern)!r} has more than "
                f"{MAX_GLOB_PARTS} parts."
            )
        walk = _Walk(self, pattern, budget)
        walk.match(base, rest, "/".join(written[:wild]))
        return sorted(walk.found.items())


class _Budget:
    """The directory entries a request's walks have looked at, all its globs together, and
    what they learned of the disk on the way: many globs over one folder list it once and
    resolve each entry once (200 globs over a 5,000-entry folder took 7.9 s without)."""

    def __init__(self):
        self.visits = 0
        self._cpu_start = time.thread_time()
        self._listings: dict[str, list[str]] = {}
        self._real: dict[str, str] = {}
        self._kind: dict[str, str] = {}

    def listing(self, folder: str) -> list[str]:
        names = self._listings.get(folder)
        if names is None:
            try:
                with os.scandir(folder) as it:
                    names = [e.name for e in it]
            except OSError:  # unreadable or vanished: as glob does, nothing there
                names = []
            self._listings[folder] = names
        return names

    def charge(self, entries: int, pattern: str) -> None:
        """Counts `entries` more looked at by the walk of `pattern`, within the bounds."""
        self.visits += entries
        if self.visits > MAX_GLOB_VISITS:
            raise InvalidSpecError(
                f"`source.paths`: the globs look at more than {MAX_GLOB_VISITS:,} directory "
                f"entries in all (at {shorten(pattern)!r}); name narrower folders."
            )
        if time.thread_time() - self._cpu_start > MAX_GLOB_CPU_S:
            raise InvalidSpecError(
                f"`source.paths`: the globs take more than {MAX_GLOB_CPU_S:g} s of CPU in all "
                f"(at {shorten(pattern)!r}); name narrower folders or fewer globs."
            )

    def real(self, path: str) -> str:
        real = self._real.get(path)
        if real is None:
            real = self._real[path] = os.path.realpath(path)
        return real

    def kind(self, real: str) -> str:
        """ "dir", "file" or "" (anything else, or gone) for a real path."""
        kind = self._kind.get(real)
        if kind is None:
            try:
                mode = os.stat(real).st_mode
            except OSError:
                mode = 0
            kind = self._kind[real] = (
                "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else ""
            )
        return kind


class _Walk:
    """One glob's walk inside the roots: real paths of regular files, each once; folders are
    entered through links only when the link stays inside, and each folder once per `**`."""

    def __init__(self, access: DataAccess, pattern: str, budget: _Budget):
        self.access, self.pattern = access, pattern
        self.found: dict[str, str] = {}  # real path: the path as written, links unresolved
        self.budget = budget

    def match(
        self, folder: str, rest: list[str], shown: str, seen: frozenset = frozenset()
    ) -> None:
        """Matches `rest` (pattern components) under `folder` (a real path inside), which the
        client's pattern calls `shown`."""
        cancel.check()
        head, tail = rest[0], rest[1:]
        if head == "**":
            try:
                st = os.stat(folder)
            except OSError:
                return
            if (st.st_dev, st.st_ino) in seen:
                return  # a link back up: a loop
            seen = seen | {(st.st_dev, st.st_ino)}
            self.match(folder, tail or ["*"], shown, seen)  # `**` matching no folder
            for path in self._entries(folder, "*"):
                self.budget.charge(1, self.pattern)  # resolved and checked: a second visit
                real = self.budget.real(path)
                if self.access.inside(real) and self.budget.kind(real) == "dir":
                    self.match(real, rest, os.path.join(shown, os.path.basename(path)), seen)
            return
        if _has_glob(head):
            paths = self._entries(folder, head)
        else:
            paths = (
                [os.path.join(folder, head)] if os.path.lexists(os.path.join(folder, head)) else []
            )
        for path in paths:
            real = self.budget.real(path)
            if not self.access.inside(real):
                continue  # silently: the client may not learn it exists
            named = os.path.join(shown, os.path.basename(path))
            if tail:
                if self.budget.kind(real) == "dir":
                    self.match(real, tail, named, seen)
            elif real not in self.found and self.budget.kind(real) == "file":
                self.found[real] = named
                self.access.check_count(len(self.found))

    def _entries(self, folder: str, pattern: str) -> list[str]:
        """Names in `folder` matching `pattern` (hidden ones only for a pattern that starts
        with a dot, as glob does), counted against the request's MAX_GLOB_VISITS."""
        names = self.budget.listing(folder)
        self.budget.charge(len(names), self.pattern)
        matches = _matcher(pattern)
        hidden = pattern.startswith(".")
        return [
            os.path.join(folder, n)
            for n in names
            if matches(n) and (hidden or not n.startswith("."))
        ]


@functools.lru_cache(maxsize=256)
def _matcher(pattern: str):
    """fnmatchcase's test for `pattern`, compiled once (fnmatchcase caches only 32 patterns)."""
    return re.compile(fnmatch.translate(pattern)).match


OPERATOR = DataAccess()


@contextlib.contextmanager
def keyed(key: str):
    """Within: an error whose message names a key of `source` names it under `key` instead
    (`source[2].paths` for a mixture's third component)."""
    try:
        yield
    except InputServerError as e:
        said = str(e)
        if key == "source" or "`source." not in said:
            raise
        try:
            renamed = type(e)(said.replace("`source.", f"`{key}."))
        except TypeError:  # an error made of more than its message (`RefusedError`)
            raise e from None
        raise renamed from e


# Names read from a folder to say what it holds: enough to name its formats, and bounded
# work for a folder of millions of shards.
_NAMES_READ = 1000
# What a folder holding a Hugging Face tokenizer has (`input_client.model_files.HF_FILES`).
_HF_NAMES = ("tokenizer.json", "tokenizer_config.json")


def not_a_file(key: str, path: str, real: str) -> NotAFileError:
    """The error for a folder `path` (resolved: `real`, inside the roots) named under `key`
    where a file is expected, with the way out: a glob of the files in it (a source), or
    the Hugging Face kind (a tokenizer folder holding tokenizer.json)."""
    names = _names_in(real)
    shown = shorten(path)
    if key.startswith("tokenizer"):
        if any(n in names for n in _HF_NAMES):
            return NotAFileError(
                f"`{key}`: {shown!r} is a folder holding a Hugging Face tokenizer "
                f'(tokenizer.json); this is a Hugging Face folder: kind = "huggingface".'
            )
        models = sorted(n for n in names if n.endswith(".model"))
        named = f": {os.path.join(path, models[0])!r}?" if models else "."
        return NotAFileError(f"`{key}`: {shown!r} is a folder; name the model file in it{named}")
    counts: dict[str, int] = {}
    for n in names:
        suffix = os.path.splitext(n)[1]
        if suffix and not n.startswith("."):
            counts[suffix] = counts.get(suffix, 0) + 1
    ranked = sorted(counts, key=lambda x: (-counts[x], x))
    glob_ = f"{path.rstrip('/')}/*{ranked[0] if ranked else ''}"
    holds = ", ".join(f"{counts[x]} {x}" for x in ranked[:3])
    held = f" (it holds {holds} files{' and more' if len(names) >= _NAMES_READ else ''})"
    return NotAFileError(
        f"`{key}`: {shown!r} is a folder, and paths name files; a glob reads the files in "
        f"it: {shorten(glob_)!r}{held if ranked else ''}."
    )


def _names_in(folder: str) -> list[str]:
    """Up to `_NAMES_READ` names in `folder`, never stat-ed: a link among them may lead out
    of the roots, and where it leads is not the client's to learn."""
    try:
        with os.scandir(folder) as entries:
            return [e.name for e in itertools.islice(entries, _NAMES_READ)]
    except OSError:
        return []
