"""The reference tier pipeline: a small tiered KV cache and inference loop that moves real bytes.

It speaks vLLM's dialect (/metrics names, KV events, OpenAI endpoint, tracing span) and records the
ground truth of every request, so the agent can be checked end to end (architecture §5).
Modules, in data-flow order: geometry → blocks → tierstore (write_behind) → compute_cost (the true
prefill cost the engine spends) → engine → (vllm_dialect, kv_publisher, tracing, truth) → openai_server →
scenarios → noisy_neighbour (noise, attached_agent) → commands and serve_commands (its subcommands).
"""
