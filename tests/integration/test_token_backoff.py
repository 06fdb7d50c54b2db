"""Wrong tokens slow their sender and no one else (issue 39 item 6): a real `input-server serve`
takes a flood of wrong tokens on its TCP port (1,442 checks a second on one channel before)
while another client, on its Unix socket, gets its answers at once; the guesser's own right
token waits out its backoff like its guesses, so guesses sent side by side learn nothing."""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import grpc
import pytest

from input_client.proto import pb, pb_grpc
from input_server.serving.backoff import Backoff, peer_key
from tests.support import serve_cli, write_token_file

FLOOD_S = 4.0
NOBODY = 65534
# A guesser that is really another user: it imports while root's files are readable, then
# switches to `nobody` before it connects (as tests/system/test_other_users.py does).
_OTHER_USER_GUESSER = textwrap.dedent("""
    import collections, json, os, sys, threading, time, uuid
    import grpc, grpc._channel
    from input_client.proto import pb, pb_grpc

    target, seconds = sys.argv[1], float(sys.argv[2])
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    codes, stop = collections.Counter(), threading.Event()

    def guess():
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.InputServiceStub(channel)
            while not stop.is_set():
                md = [("authorization", "Bearer " + uuid.uuid4().hex)]
                try:
                    stub.GetInfo(pb.GetInfoRequest(), timeout=10, metadata=md)
                    codes["OK"] += 1
                except grpc.RpcError as e:
                    codes[e.code().name] += 1

    threads = [threading.Thread(target=guess) for _ in range(2)]
    [t.start() for t in threads]
    print("started", flush=True)
    time.sleep(seconds)
    stop.set()
    [t.join() for t in threads]
    print(json.dumps(codes), flush=True)
""")
# FREE_FAILURES checks at once, then one each 0.05, 0.1, 0.2 ... s: 11 in 4 s, a few more
# allowed for a slow host's clock between the calls.
MOST_CHECKS = 15


def get_info(stub, token: str | None) -> grpc.StatusCode:
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        stub.GetInfo(pb.GetInfoRequest(), timeout=10, metadata=metadata)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def guess(target: str, stop: threading.Event, codes: collections.Counter) -> None:
    """A guesser on one channel, as fast as the server answers (several such share it)."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        while not stop.is_set():
            codes[get_info(stub, uuid.uuid4().hex)] += 1


class Guarded(tuple):
    """(tcp target, socket file target, token), and every target the server printed."""

    targets: list[str]


@pytest.fixture
def guarded_cli(tmp_path, short_tmp):
    """`input-server serve` in its own process on loopback TCP, an abstract socket (both behind
    a token) and a socket file: (tcp target, socket file target, token), `.targets` all."""
    token_file, token = write_token_file(tmp_path)
    abstract = f"unix-abstract:input-server-backoff-{uuid.uuid4().hex[:12]}"
    sock = f"unix://{short_tmp}/s.sock"
    child, targets = serve_cli(
        *("--listen", "127.0.0.1:0", "--listen", abstract, "--listen", sock),
        *("--token-file", token_file),
        log=str(tmp_path / "serve.log"),
    )
    try:
        tcp = next(t for t in targets if t.startswith("127.0.0.1:"))
        guarded = Guarded((tcp, sock, token))
        guarded.targets = targets
        yield guarded
    finally:
        child.kill()


def test_a_guessers_checks_drop_to_a_bound_while_another_peer_is_answered_at_once(guarded_cli):
    tcp, sock, token = guarded_cli
    codes: collections.Counter = collections.Counter()
    stop = threading.Event()
    guessers = [threading.Thread(target=guess, args=(tcp, stop, codes)) for _ in range(4)]
    latencies, answers = [], collections.Counter()
    with grpc.insecure_channel(sock) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        assert get_info(stub, token) == grpc.StatusCode.OK  # connected before the flood
        started = time.monotonic()
        for t in guessers:
            t.start()
        try:
            while time.monotonic() - started < FLOOD_S:
                t0 = time.perf_counter()
                answers[get_info(stub, token)] += 1
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)
        finally:
            stop.set()
            for t in guessers:
                t.join(30)
        took = time.monotonic() - started
        # The guesser's peer, now with the right token: refused unchecked like its guesses.
        with grpc.insecure_channel(tcp) as own:
            own_stub = pb_grpc.InputServiceStub(own)
            assert get_info(own_stub, token) == grpc.StatusCode.RESOURCE_EXHAUSTED
            # No token at all is no guess: answered as before, not held back.
            assert get_info(own_stub, None) == grpc.StatusCode.UNAUTHENTICATED
    checks = codes[grpc.StatusCode.UNAUTHENTICATED]
    print(
        f"guesser: {checks / took:.1f} checks/s, {sum(codes.values()) / took:.0f} calls/s; "
        f"other peer: median {1e3 * statistics.median(latencies):.1f} ms, "
        f"max {1e3 * max(latencies):.1f} ms over {len(latencies)} calls"
    )
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert checks <= MOST_CHECKS, codes  # was ~1,442 a second
    assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] >= 50, codes  # it kept on trying
    assert answers == {grpc.StatusCode.OK: len(latencies)}, answers
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0, latencies


def test_a_guesser_on_the_abstract_socket_never_delays_the_socket_files_clients(guarded_cli):
    """Issue 50, finding 3: all Unix peers were one backoff ("unix:" to gRPC), so one wrong
    guess every 20 ms on the abstract socket locked the owner's trainer on the socket file out
    for the whole attack. The abstract sockets are served apart (`TokenPolicy.split`): the
    socket file's clients, with the token or without (its file mode is their guard), are
    answered throughout, while the guesser stays in its backoff."""
    tcp, sock, token = guarded_cli
    abstract = next(t for t in guarded_cli.targets if t.startswith("unix-abstract:"))
    codes: collections.Counter = collections.Counter()
    stop = threading.Event()
    guessers = [threading.Thread(target=guess, args=(abstract, stop, codes)) for _ in range(2)]
    answers = collections.Counter()
    with grpc.insecure_channel(sock) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        started = time.monotonic()
        for t in guessers:
            t.start()
        try:
            while time.monotonic() - started < FLOOD_S:
                answers[get_info(stub, token)] += 1
                answers[get_info(stub, None)] += 1
                time.sleep(0.02)
        finally:
            stop.set()
            for t in guessers:
                t.join(30)
    with grpc.insecure_channel(abstract) as own:  # the guesser's peer: still in its backoff
        assert get_info(pb_grpc.InputServiceStub(own), token) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] >= 50, codes  # the guesser was held back
    assert answers == {grpc.StatusCode.OK: sum(answers.values())}, answers


def test_the_backoff_doubles_forgets_and_remembers_a_bounded_number_of_peers():
    backoff = Backoff(free=2, base_s=0.2, max_s=0.4, forget_s=1.0, peers=8)
    assert [backoff.admit("a", False) for _ in range(3)] == [None] * 3  # 2 free, the 3rd sets it
    wait = backoff.admit("a", True)
    assert wait is not None and 0.1 < wait <= 0.2  # the right token waits too
    assert backoff.admit("b", True) is None  # another peer does not
    time.sleep(wait)
    assert backoff.admit("a", False) is None  # checked again; now 0.4 s (the max)
    assert 0.3 < backoff.admit("a", True) <= 0.4
    for i in range(100):
        backoff.admit(f"ipv4:10.0.0.{i}", False)
    assert len(backoff) == 8
    time.sleep(1.0)  # forgotten: its next wrong token is free again
    assert backoff.admit("ipv4:10.0.0.99", False) is None
    assert backoff.admit("ipv4:10.0.0.99", False) is None


def test_a_peer_is_its_host_an_ipv6_one_by_its_64_and_unix_sockets_are_one():
    """Without `LoopbackOwners` (or where /proc cannot tell), loopback is one host too."""
    assert peer_key("ipv4:127.0.0.1:5555") == peer_key("ipv4:127.0.0.1:6666") == "ipv4:127.0.0.1"
    assert peer_key("ipv6:%5B2001:db8:1:2::7%5D:80") == "ipv6:2001:db8:1:2::/64"
    assert peer_key("ipv6:%5B2001:db8:1:2:ffff::1%5D:81") == "ipv6:2001:db8:1:2::/64"
    assert peer_key("ipv6:%5B2001:db8:1:3::7%5D:80") != peer_key("ipv6:%5B2001:db8:1:2::7%5D:80")
    assert peer_key("unix:") == peer_key("unix:/tmp/s.sock") == "unix"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_on_loopback_a_guessing_user_slows_only_itself(guarded_cli):
    """Both on 127.0.0.1: the key is the user owning the client's socket (/proc/net/tcp)."""
    tcp, _, token = guarded_cli
    child = subprocess.Popen(
        [sys.executable, "-c", _OTHER_USER_GUESSER, tcp, str(FLOOD_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "started"
        latencies, answers = [], collections.Counter()
        with grpc.insecure_channel(tcp) as channel:
            stub = pb_grpc.InputServiceStub(channel)
            deadline = time.monotonic() + FLOOD_S - 0.5
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                answers[get_info(stub, token)] += 1
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)
        codes = json.loads(child.stdout.readline())
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    print(
        f"nobody: {codes}; root on loopback: median {1e3 * statistics.median(latencies):.1f} "
        f"ms, max {1e3 * max(latencies):.1f} ms over {len(latencies)} calls"
    )
    assert codes.get("UNAUTHENTICATED", 0) <= MOST_CHECKS, codes
    assert codes.get("RESOURCE_EXHAUSTED", 0) >= 50, codes
    assert answers == {grpc.StatusCode.OK: len(latencies)}, answers
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0, latencies
