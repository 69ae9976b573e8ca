"""The runtime: tasks and their roles, channels, jobs and attempts, the local and Spark runtimes."""

__all__: list[str] = []
