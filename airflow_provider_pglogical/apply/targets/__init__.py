"""Targets: where a batch's changes are applied. ``base.Target`` is the interface; one folder per target."""
