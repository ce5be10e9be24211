"""The correlation analysis: joins engine, host and per-request data and attributes TTFT.

Modules, in data-flow order: `nnls` and `costmodel` (the fitted prefill and fetch cost), `attribution`
(the arithmetic of a window and of a request), `aggregate` (each window of the store's engine series,
read through a StoreReader), `per_request` (each request record), `counterfactuals`, `cross_layer` and
`stall` and `paths` (fetch stall, noisy neighbour, saturation), `state` (the models and output series
the stages share), and `analysis` (the analysis the agent runs, with its spec). The request records
themselves are the core's (agent/core/records.py). The arithmetic is shared/design/correlation.md;
docs/correlation.md says what each exported number means.
"""
