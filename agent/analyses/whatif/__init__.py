"""What-if tier sizing: the share of looked-up tokens each tier would serve, and TTFT, at other tier sizes.

An analysis (analysis.py) that replays the KV events' sampled access stream through models of the tier
hierarchy (hierarchy.py) and re-estimates TTFT with the correlation analysis' cost model (predict.py);
the profile it serves and records (profile.py) is what `kvscope what-if` (commands.py) reads.
"""
