"""Delta Lake target (delta-rs): mirror tables and change feeds, watermarks in the Delta log (docs/delta.md)."""
