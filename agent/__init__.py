"""kvscope agent core: tier model, configuration, store, scheduler and CLI."""

__version__ = "0.1.0"
