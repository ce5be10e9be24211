"""The sources, one folder per family: host/, sharedfs/, gpu/, engines/, kv_events/, requests/, and scrape/
(what the page-scraping adapters share). Each collector module defines a `SPEC` (registry.py lists them)
and turns what its source emits into readings for the agent's store."""
