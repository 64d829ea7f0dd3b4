"""Shared test utilities: slow float64 references and tiny model configs."""
