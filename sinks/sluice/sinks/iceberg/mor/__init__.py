"""Iceberg merge-on-read upserts (``IcebergSink(write_mode="merge-on-read")``): new row versions as data files,
old ones removed by position-delete files, positions from a primary-key index in the writers' keyed state."""
