"""The correlation engine: joins engine, host and per-request streams and attributes TTFT.

Modules, in data-flow order: `records` (the per-request record and the buffer receivers fill),
`nnls` and `costmodel` (the fitted prefill and fetch cost), `attribution` (aggregate and per
request), `counterfactuals`, `signals` (fetch stall, noisy neighbour, saturation), and `engine`
(the collector the agent runs). The arithmetic is shared/design/correlation.md; docs/correlation.md
says what each exported number means.
"""
