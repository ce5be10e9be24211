"""The composition: the wiring from a Config to a running agent, the `kvscope` command, flags and preflight."""
