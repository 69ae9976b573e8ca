"""Changelog (generalized incremental) checkpoints, after Flink's FLIP-158, for both keyed backends.

A checkpoint persists only the state changes since the last one (a *segment* per checkpoint); a full
*materialization* of the state is written in the background on an interval; restore is the
materialization plus the segments after it, replayed in order by key group. See
:class:`~sluice.state.changelog.backend.ChangelogKeyedStateBackend`.
"""

from sluice.state.changelog.backend import ChangelogKeyedStateBackend

__all__ = ["ChangelogKeyedStateBackend"]
