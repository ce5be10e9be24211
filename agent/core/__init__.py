"""The core: the pipeline's interfaces, readings, records, the metric catalogue and contract, the tier
model and the store. Everything else imports it; it imports nothing of kvscope's but itself."""
