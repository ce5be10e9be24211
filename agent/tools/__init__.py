"""Tools the sidecar never loads: the reference tier pipeline, the self-test and demo, offline reports."""
