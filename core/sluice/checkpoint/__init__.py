"""Checkpoints: the coordinator, barrier handling, subtask snapshots, channel state, storage."""

__all__: list[str] = []
