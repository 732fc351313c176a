"""Local training: one loop with hooks, batching, optimizer-state transport."""
