"""The HTTP stack every kvscope endpoint runs on: the asyncio server and its admission policy, request
parsing, TLS and basic auth from Prometheus' web-config file."""
