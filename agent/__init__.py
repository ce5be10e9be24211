"""kvscope's core: interfaces, readings, catalogue, configuration, store, scheduler, wiring and CLI."""
