"""Apache Iceberg target (pyiceberg): mirror tables and change feeds, watermarks committed with the data (docs/iceberg.md)."""
