"""OpenLineage: dataset naming for sources, staged logs and targets, and the operators' facets."""
