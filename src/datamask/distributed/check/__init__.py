"""Phase 1 of a sharded run, the check: one scan of every shard (ids, widths, quality,
lengths), the id buckets, the claim."""
