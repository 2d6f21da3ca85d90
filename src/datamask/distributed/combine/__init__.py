"""Phase 4, one budget over the groups: the groups' prices, the allocation, the exchange
round, the central round, the similarity cap."""
