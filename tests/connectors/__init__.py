"""Tests of the connector conformance kit (sluice.testing.conformance) and of plugin scaffolding."""
