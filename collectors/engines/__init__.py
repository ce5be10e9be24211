"""Inference engines' /metrics pages (vLLM, SGLang, LMCache, Dynamo, KVBM), normalised to the contract,
and their autodetection."""
