"""How tests/unit/test_deploy.py reads deploy/: the manifests as pods and containers, JobSet's
fields, the Dockerfile's stages, .dockerignore's patterns, and the server's and the launcher's
own argument parsers."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import pathlib
import posixpath
import re
import shlex
from collections.abc import Callable
from typing import NoReturn
from unittest import mock

import pytest
import yaml

from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
# The keys of a `kubernetes.io/tls` Secret (`kubectl create secret tls`; ca.crt as cert-manager
# adds it): what a Secret volume without `items` is taken to hold.
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")


class Command:
    """A command line: a container's, or the image's ENTRYPOINT + CMD."""

    argv: list[str]

    @property
    def role(self) -> str | None:
        """What it runs: "server" (`input-server serve`), "launcher" (`python -m
        input_client.maxtext.train`), else the program's name."""
        argv = self.argv
        if argv[:2] == ["input-server", "serve"]:
            return "server"
        if argv[1:3] == ["-m", "input_client.maxtext.train"] and argv[0].startswith("python"):
            return "launcher"
        return posixpath.basename(argv[0]) if argv else None

    def flags(self, name: str) -> list[str]:
        """Every value of `name` (`--name VALUE` or `--name=VALUE`), in order."""
        out = []
        for i, a in enumerate(self.argv):
            if a == name and i + 1 < len(self.argv):
                out.append(self.argv[i + 1])
            elif a.startswith(name + "="):
                out.append(a[len(name) + 1 :])
        return out

    def flag(self, name: str) -> str | None:
        values = self.flags(name)
        assert len(values) <= 1, f"{self}: {name} is given {len(values)} times: {values}"
        return values[0] if values else None

    def tcp_ports(self) -> list[int]:
        """The ports of its TCP --listen addresses."""
        return [
            int(a.rpartition(":")[2]) for a in self.flags("--listen") if not a.startswith("unix")
        ]


def socket_path(address: str) -> str | None:
    return re.sub(r"^unix:(//)?", "", address) if address.startswith("unix:") else None


# --- The manifests -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Doc:
    path: pathlib.Path
    index: int
    body: dict

    kind = property(lambda self: self.body.get("kind"))
    name = property(lambda self: (self.body.get("metadata") or {}).get("name"))
    namespace = property(lambda self: (self.body.get("metadata") or {}).get("namespace"))
    spec = property(lambda self: self.body.get("spec") or {})

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}[{self.index}] {self.kind} {self.name}"

    def pods(self) -> list[Pod]:
        if self.kind == "JobSet":
            return [
                Pod(self, f"spec.replicatedJobs[{i}].template.spec.template", j["template"]["spec"])
                for i, j in enumerate(self.spec.get("replicatedJobs") or [])
            ]
        if self.kind in ("Job", "StatefulSet", "Deployment", "DaemonSet", "ReplicaSet"):
            return [Pod(self, "spec.template", self.spec)]
        return []


@dataclasses.dataclass(frozen=True, eq=False)
class Pod:
    doc: Doc
    where: str
    owner: dict  # the spec holding the pod template: a Job's, a StatefulSet's, ...

    spec = property(lambda self: self.owner["template"].get("spec") or {})
    labels = property(lambda self: self.owner["template"].get("metadata", {}).get("labels", {}))
    security = property(lambda self: self.spec.get("securityContext") or {})

    def __str__(self) -> str:
        return f"{self.doc}: {self.where}"

    def containers(self) -> list[Container]:
        return [
            Container(self, f"{field}[{i}]", body)
            for field in ("initContainers", "containers")
            for i, body in enumerate(self.spec.get(field) or [])
        ]

    def volume(self, name: str) -> dict | None:
        return next((v for v in self.spec.get("volumes", []) if v["name"] == name), None)

    def secret_file(self, volume: dict, file: str) -> tuple[int, int] | None:
        """(owner uid, mode) of `file` in a Secret volume as kubelet writes it; None when the
        volume holds no such file. The files are root's; with fsGroup, kubelet gives them that
        group and adds its read bit (0400 becomes 0440: Kubernetes issue 57923)."""
        secret = volume.get("secret")
        items = {i["path"]: i for i in (secret or {}).get("items") or []}
        if secret is None or file not in (items or TLS_KEYS):
            return None
        mode = items.get(file, {}).get("mode", secret.get("defaultMode", 0o644))
        return 0, mode | (0o440 if self.security.get("fsGroup") is not None else 0)

    def token_copy(self, volume: dict, path: str) -> tuple[int | None, int] | None:
        """(owner uid, mode) of `path` when an init container writes it into the emptyDir
        `volume` (`install -m MODE SRC PATH`) from a Secret's file it can read; else None."""
        if "emptyDir" not in volume:
            return None
        for c in self.containers():
            if not (c.init and c.role == "install" and c.argv[-1] == path):
                continue
            src = c.argv[-2]
            where, at = c.volume_at(src)
            found = where and self.secret_file(where, posixpath.relpath(src, at))
            assert found, f"{c}: {src} is not a file of a Secret volume"
            uid, mode = uid_of(c), found[1]
            group = self.security.get("fsGroup") is not None and mode & 0o040
            assert mode & 0o004 or group or (uid == 0 and mode & 0o400), (
                f"{c}: uid {uid} cannot read {src} (mode {mode:04o}, owned by root)"
            )
            assert c.volume_at(path)[0] is volume, f"{c}: {path} is not in the server's volume"
            return uid, int(c.flag("-m") or c.flag("--mode") or "0755", 8)
        return None


@dataclasses.dataclass(frozen=True, eq=False)
class Container(Command):
    pod: Pod
    field: str
    body: dict

    init = property(lambda self: self.field.startswith("initContainers"))
    ours = property(lambda self: bool(re.search(r"(^|/)input-server:", self.body["image"])))

    @property
    def argv(self) -> list[str]:
        command = self.body.get("command") or (dockerfile().entrypoint if self.ours else [])
        return [*command, *self.body.get("args", [])]

    def __str__(self) -> str:
        return f"{self.pod}.spec.{self.field} ({self.body.get('name')})"

    def volume_at(self, path: str) -> tuple[dict | None, str | None]:
        """The volume mounted deepest above `path` in this container, and its mountPath."""
        best = (None, None)
        for m in self.body.get("volumeMounts", []):
            at = m["mountPath"].rstrip("/")
            if path.startswith(at + "/") and len(at) > len(best[1] or ""):
                best = (self.pod.volume(m["name"]), at)
        return best

    def port(self, port: int | str) -> int | None:
        """A containerPort by number or name."""
        named = {p.get("name"): p["containerPort"] for p in self.body.get("ports", [])}
        return named.get(port) if isinstance(port, str) else port


def uid_of(c: Container) -> int | None:
    """The uid a container runs as: its own securityContext's, the pod's, or our image's."""
    for sc in (c.body.get("securityContext") or {}, c.pod.security):
        if sc.get("runAsUser") is not None:
            return sc["runAsUser"]
    return dockerfile().uid if c.ours else None


def load_docs() -> list[Doc]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        with open(path) as f:  # a YAML error then names the file and the line
            docs += [Doc(path, i, b) for i, b in enumerate(yaml.safe_load_all(f)) if b]
    return docs


# --- JobSet: no schema bundled; its v1alpha2 fields and their JSON types -------------------------
# From kubernetes-sigs/jobset, api/jobset/v1alpha2/jobset_types.go (JobSet, JobSetSpec,
# ReplicatedJob, Network, SuccessPolicy, FailurePolicy, StartupPolicy, Coordinator).

JOBSET = {"apiVersion": str, "kind": str, "metadata": dict, "spec": dict}
JOBSET_SPEC = {
    "replicatedJobs": list,
    "network": dict,
    "successPolicy": dict,
    "failurePolicy": dict,
    "startupPolicy": dict,
    "suspend": bool,
    "coordinator": dict,
    "managedBy": str,
    "ttlSecondsAfterFinished": int,
    "volumeClaimPolicies": list,
}
JOBSET_PARTS = {
    "network": {"enableDNSHostnames": bool, "subdomain": str, "publishNotReadyAddresses": bool},
    "successPolicy": {"operator": str, "targetReplicatedJobs": list},
    "failurePolicy": {"maxRestarts": int, "restartStrategy": str, "rules": list},
    "startupPolicy": {"startupPolicyOrder": str},
    "coordinator": {"replicatedJob": str, "jobIndex": int, "podIndex": int},
}
REPLICATED = {"name": str, "groupName": str, "template": dict, "replicas": int, "dependsOn": list}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _fields(obj, fields: dict, where: str) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: must be a mapping, got {obj!r}"]
    out = [f"{where}.{k}: not a field of JobSet v1alpha2" for k in obj if k not in fields]
    for k, kind in fields.items():
        v = obj.get(k)
        if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
            out.append(f"{where}.{k}: must be {kind.__name__}, got {v!r}")
    return out


def jobset_problems(body: dict) -> list[str]:
    """What in a JobSet document JobSet v1alpha2 would not take (its pod templates aside)."""
    out = _fields(body, JOBSET, "JobSet")
    if body.get("apiVersion") != "jobset.x-k8s.io/v1alpha2":
        out.append(f"apiVersion: must be jobset.x-k8s.io/v1alpha2, got {body.get('apiVersion')}")
    spec = body.get("spec") or {}
    out += _fields(spec, JOBSET_SPEC, "spec")
    out += [p for k, f in JOBSET_PARTS.items() if k in spec for p in _fields(spec[k], f, k)]
    jobs = spec.get("replicatedJobs") or []
    if not jobs:
        out.append("spec.replicatedJobs: at least one is needed")
    for i, job in enumerate(jobs):
        where = f"spec.replicatedJobs[{i}]"
        out += _fields(job, REPLICATED, where)
        if not DNS_LABEL.fullmatch(str(job.get("name"))):
            out.append(f"{where}.name: must be a DNS label, got {job.get('name')!r}")
        if "template" not in job or not isinstance(job.get("replicas"), int) or job["replicas"] < 1:
            out.append(f"{where}: needs a template and replicas >= 1, said here")
    return out


# --- The Dockerfile ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Image:
    stages: list[list[tuple[int, str, str]]]  # per FROM: (line, INSTRUCTION, the rest)
    bases: list[tuple[int, str]]  # per FROM: (line, image), global ARGs substituted

    def all(self, op: str) -> list[str]:
        """The final stage's `op` instructions, each but its name."""
        return [rest for _, o, rest in self.stages[-1] if o == op]

    def last(self, op: str) -> str | None:
        return (self.all(op) or [None])[-1]

    @property
    def uid(self) -> int | None:
        user = (self.last("USER") or "").split(":")[0]
        return int(user) if user.isdigit() else None

    def exec_form(self, op: str) -> list[str]:
        rest = self.last(op) or "[]"
        return json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]

    entrypoint = property(lambda self: self.exec_form("ENTRYPOINT"))
    exposed = property(
        lambda self: {int(p.split("/")[0]) for p in " ".join(self.all("EXPOSE")).split()}
    )

    @property
    def command(self) -> ImageCommand:
        return ImageCommand([*self.entrypoint, *self.exec_form("CMD")])


class ImageCommand(Command):
    """The image's ENTRYPOINT + CMD: what `docker run IMAGE` runs."""

    def __init__(self, argv: list[str]):
        self.argv = argv

    def __str__(self) -> str:
        return "deploy/Dockerfile's ENTRYPOINT + CMD"


@functools.cache
def dockerfile() -> Image:
    instructions, buf, start = [], "", 0
    for n, raw in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):  # comments, within a continued one too
            continue
        start = start if buf else n
        buf += " " + line.removesuffix("\\").strip()
        if not line.endswith("\\"):
            op, _, rest = buf.strip().partition(" ")
            instructions.append((start, op.upper(), rest.strip()))
            buf = ""
    args, stages, bases = {}, [], []
    for n, op, rest in instructions:
        if op == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif op == "FROM":
            sub = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), rest.split()[0])
            stages.append([])
            bases.append((n, sub))
        elif stages:
            stages[-1].append((n, op, rest))
    return Image(stages, bases)


def ignored_by_dockerignore(path: str) -> bool:
    """Whether .dockerignore leaves `path` out of the build context: the last pattern that
    matches it or a folder above it decides (`!` keeps); `*` stays in a folder, `**` does not."""
    ignored = False
    parts = path.split("/")
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        regex = _glob(posixpath.normpath(pattern.lstrip("!").lstrip("/")))
        if any(regex.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            ignored = not pattern.startswith("!")
    return ignored


def _glob(pattern: str) -> re.Pattern:
    table = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    tokens = re.split(r"(\*\*/?|\*|\?|\[[^\]]*\])", pattern)
    return re.compile("".join(table.get(t, t if t[:1] == "[" else re.escape(t)) for t in tokens))


# --- The real parsers ----------------------------------------------------------------------------


class _Parsed(BaseException):
    """Stops a command right after argparse has parsed it; a BaseException, so the commands'
    own `except` clauses let it through."""


def _parse(main: Callable[[list[str]], object], argv: list[str], where: str) -> argparse.Namespace:
    """`main(argv)` up to its `parse_args`, which raises the namespace: run through `main`
    rather than the parser it builds (`input_server.cli.build_parser`), so what is checked is
    the parsing `main` itself does."""
    from input_server import cli

    real = argparse.ArgumentParser.parse_args
    real_arguments = cli.parse_arguments  # main's own: `-v` anywhere on the line

    def spy(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    def arguments_spy(parser, argv):
        raise _Parsed(real_arguments(parser, argv))

    err = io.StringIO()
    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", spy),
        mock.patch.object(cli, "parse_arguments", arguments_spy),
    ):
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                main(argv)
            except _Parsed as parsed:
                return parsed.args[0]
            except SystemExit as e:
                why = (err.getvalue().strip().splitlines() or [f"exit status {e.code}"])[-1]
            else:
                why = "it returned without parsing its arguments"
    pytest.fail(f"{where}: `{shlex.join(argv)}` is refused: {why}")


def parse_server(argv: list[str], where: str) -> argparse.Namespace:
    """`input-server ...` through `input_server.cli.main`'s parser, stopped before serving."""
    from input_server import cli

    assert argv[:1] == ["input-server"], f"{where}: not an input-server command: {argv}"
    return _parse(cli.main, argv[1:], where)


def parse_launcher(argv: list[str], where: str) -> argparse.Namespace:
    """`python -m input_client.maxtext.train ...` through `train.main`'s parser, stopped before
    it reads a spec, dials a server or imports MaxText."""
    from input_client.maxtext import train

    # The launcher's options come anywhere among MaxText's (`parse_known_intermixed_args`, not
    # `parse_args`): its own `parse_args` is the parser `main` runs first.
    return _parse(lambda args: _raise_parsed(train.parse_args(args)), argv[3:], where)


def _raise_parsed(namespace: argparse.Namespace) -> NoReturn:
    raise _Parsed(namespace)
