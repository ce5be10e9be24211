"""Host sources: block devices, network interfaces, RDMA ports, the agent's own process."""
