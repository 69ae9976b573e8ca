"""The session's SparkContext fixture (``spark``) lives in tests/conftest.py, shared with tests/faults."""
