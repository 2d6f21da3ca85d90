"""Phase 2, the plan: the k-means sample and tree, the spills and group objects, the groups
and their budgets."""
