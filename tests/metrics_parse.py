"""Reads a /metrics answer on stdin with the Prometheus text parser of PyPI's prometheus-client
and prints every sample as JSON: a malformed answer raises, and the test fails with it."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families

samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        samples.append(
            {
                "family": family.name,
                "type": family.type,
                "name": sample.name,
                "labels": sample.labels,
                "value": sample.value,
            }
        )
json.dump(samples, sys.stdout)
