"""Configuration: typed options bound from TOML, `KVSCOPE_*` variables and flags; the optional extras."""
