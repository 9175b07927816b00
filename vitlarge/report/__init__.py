"""Reading a run afterwards: its metrics file (`metrics_log`) and its picture (`plot`)."""
