"""A server's Prometheus page as a scraper reads it: its samples by name and labels."""

from __future__ import annotations

import time
import urllib.error
import urllib.request


def scrape(port: int, host: str = "127.0.0.1") -> dict[tuple[str, tuple], float]:
    """The page's samples: (name, sorted labels) -> value. A 429 (a test polling past the
    page's rate per peer) is waited out as its Retry-After says, as a scraper does."""
    from prometheus_client.parser import text_string_to_metric_families

    for attempt in range(10):
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            break
        except urllib.error.HTTPError as e:
            if e.code != 429 or attempt == 9:
                raise
            time.sleep(int(e.headers["Retry-After"]))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
