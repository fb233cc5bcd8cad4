"""A real HTTP scrape of a running server's /metrics, parsed by prometheus_client's parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from lmserve.server.front.process.app import BackgroundServer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: BackgroundServer) -> Samples:
    """Every sample: (metric name, its labels) -> value."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
