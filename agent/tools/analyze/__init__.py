"""`kvscope analyze`: offline reports from AIPerf runs, kvscope recordings and a baseline (docs/analyze.md)."""
