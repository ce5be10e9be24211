"""Running the pipeline: the scheduler and its jobs, OS signals, log lines."""
