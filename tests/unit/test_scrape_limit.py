"""The metrics page's scrape limit as decisions: whose bucket a peer's address draws on, the
buckets (bursts, pipelined requests, the peers remembered) and the 429 they answer with."""

from __future__ import annotations

import pytest

from input_server.serving.metrics import ScrapeLimit, scrape_key, too_many


def test_an_ipv6_peer_is_its_64_and_an_ipv4_peer_its_address():
    assert scrape_key(("2001:db8::1", 1, 0, 0)) == scrape_key(("2001:db8::ffff:1", 2, 0, 0))
    assert scrape_key(("2001:db8::1", 1, 0, 0)) != scrape_key(("2001:db8:0:1::1", 1, 0, 0))
    assert scrape_key(("10.0.0.1", 1)) != scrape_key(("10.0.0.2", 1))
    assert scrape_key(("fe80::1%lo", 1, 0, 1)) == scrape_key(("fe80::2", 1, 0, 1))


def test_an_ipv4_peer_of_a_dual_stack_socket_is_its_ipv4_address_not_one_64_for_all():
    assert scrape_key(("::ffff:10.0.0.1", 5, 0, 0)) == scrape_key(("10.0.0.1", 6))
    assert scrape_key(("::ffff:10.0.0.1", 5, 0, 0)) != scrape_key(("::ffff:10.0.0.2", 5, 0, 0))


def test_a_burst_is_answered_and_the_next_scrape_told_when_to_come_back():
    limit = ScrapeLimit(per_s=0.5, burst=3)
    assert [limit.admit("a") for _ in range(3)] == [None] * 3
    wait = limit.admit("a")
    assert wait is not None and 0 < wait <= 2.0, wait
    assert limit.admit("b") is None  # another peer has a bucket of its own


def test_pipelined_requests_take_a_token_each():
    limit = ScrapeLimit(per_s=0.01, burst=5)
    assert limit.admit("a", requests=5) is None  # the first of them answered
    assert limit.admit("a") is not None


def test_the_least_recently_seen_peer_is_forgotten_past_the_bound():
    limit = ScrapeLimit(per_s=0.01, burst=1, peers=2)
    assert limit.admit("a") is None
    assert limit.admit("a") is not None
    limit.admit("b")
    limit.admit("c")  # "a" is the least recent: forgotten, with a full bucket again
    assert len(limit) == 2
    assert limit.admit("a") is None


@pytest.mark.parametrize(("wait_s", "header"), [(0.01, 1), (1.0, 1), (2.5, 3)])
def test_retry_after_is_whole_seconds_rounded_up(wait_s, header):
    head, _, body = too_many(wait_s).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.0 429 Too Many Requests"
    assert f"Retry-After: {header}" in lines
    assert f"Content-Length: {len(body)}" in lines


@pytest.mark.parametrize("bad", [{"per_s": 0}, {"burst": 0}, {"peers": 0}])
def test_a_limit_that_could_answer_nothing_is_refused(bad):
    with pytest.raises(ValueError, match="ScrapeLimit needs"):
        ScrapeLimit(**bad)
