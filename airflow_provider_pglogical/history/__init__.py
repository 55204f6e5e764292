"""Run history: one small record per decode/apply run beside the staging area, the report drawn from it and the
slot-health judgement behind ``pglogical check``."""
