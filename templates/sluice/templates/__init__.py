"""Job templates for ``sluice new`` (Jinja files shipped as package data)."""
