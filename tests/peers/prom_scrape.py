"""Scrapes a Prometheus endpoint and parses it with PyPI prometheus-client's parser for the
text it was served (OpenMetrics text, or the classic Prometheus text format).

Usage: prom_scrape.py URL. Prints one JSON object: {"content_type": ..., "samples": [{"name",
"labels", "value"}], "families": {name: type}}. Exits non-zero when the text does not parse.
"""
import json
import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus

with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
    ctype = r.headers.get("content-type", "")
    text = r.read().decode("utf-8")
samples, families = [], {}
parse = openmetrics if ctype.startswith("application/openmetrics-text") else prometheus
for family in parse(text):
    families[family.name] = family.type
    for s in family.samples:
        samples.append({"name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps({"content_type": ctype, "samples": samples, "families": families}))
