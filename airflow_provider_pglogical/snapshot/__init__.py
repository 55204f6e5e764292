"""Initial snapshots consistent with the slot, and per-table snapshots (added tables, resyncs) later."""
