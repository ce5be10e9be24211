"""KV-cache events over ZMQ: decoding, sequence numbers, the socket thread, residency and reuse."""
