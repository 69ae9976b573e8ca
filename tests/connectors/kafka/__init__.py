"""Tests of the Kafka source connector (marker ``kafka``; a real tansu broker per session)."""
