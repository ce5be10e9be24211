"""Exporters read the store (and correlation results) and never talk to collectors."""
