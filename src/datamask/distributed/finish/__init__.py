"""Phase 5, the finish: every document's nearest kept document (the cover) and the keep
lists by input shard."""
