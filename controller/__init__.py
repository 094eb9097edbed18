"""Everything cluster-wide: CEL, the structured-parameters allocator, scoring, explanations, the claim controller."""
