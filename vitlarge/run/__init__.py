"""A whole run, what train.py calls: `training.build_run` and `TrainingRun.fit`, and ``--dry-run`` (`dry_run`)."""
