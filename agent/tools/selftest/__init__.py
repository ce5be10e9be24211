"""`kvscope selftest` and `kvscope demo`: the reference engine with the ordinary agent attached.

harness.py starts engine + agent in-process and captures both sides; checks.py compares them;
report.py prints and writes the verdicts; demo.py and chart.py make the human-facing report;
commands.py adds the two subcommands.
"""
