"""Phase 3, the groups: the one group step (any method, exactly k rows), a token budget's
rounds, --given's floors."""
