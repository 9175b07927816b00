"""Checkpoints: writing and verifying them (`store`), the sharded (DCP) state (`sharded`), choosing and restoring one (`resume`), the timm export (`export`) and fine-tuning weights (`init_from`)."""
