"""Target adapters: where compacted net changes are written."""
