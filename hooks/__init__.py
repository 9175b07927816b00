"""Observers of a training run, one per file. The trainer calls the events of `hooks.base.Hook`."""
