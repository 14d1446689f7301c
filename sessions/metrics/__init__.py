"""Live GPU metrics: the agent that samples, the frames it publishes, history, consumers and /metrics."""
