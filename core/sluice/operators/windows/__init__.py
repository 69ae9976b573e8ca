"""Window operators: assigners and aggregations (:mod:`.spec`), vectorized partial aggregation
(:mod:`.aggregates`), window assignment (:mod:`.assign`), state (:mod:`.store`), the operator
(:mod:`.operator`)."""

__all__: list[str] = []
