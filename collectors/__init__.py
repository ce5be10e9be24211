"""One module per source. Each turns what its source emits into readings for the agent's store."""
