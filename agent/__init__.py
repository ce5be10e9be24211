"""The agent: its core and the layers around it, one folder each.

- ``core``: the pipeline's interfaces, readings, records, catalogue, contract, tier model and store;
- ``config``, ``http``, ``runtime``: configuration, the HTTP stack, the scheduler, signals and logs;
- ``analyses``: correlation and what-if, which read the store and records;
- ``app``: the wiring from a Config to a running agent, and the ``kvscope`` command;
- ``tools``: the reference pipeline, self-test, demo and offline reports (never loaded by the sidecar).
"""
