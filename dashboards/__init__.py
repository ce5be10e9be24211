"""Grafana dashboards as code (Grafana's Foundation SDK, pinned to the Grafana 11.6 build), the generated
JSON under grafana/, and the Prometheus recording and alert rules under rules/ with their promtool tests.

Building needs the `dashboards` extra; the sidecar never imports this package.
"""
