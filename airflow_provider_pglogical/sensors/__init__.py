"""Sensors and checks over a replication slot's position and retained WAL."""
