"""What the lake targets (Delta, Iceberg) share above their own commits."""
