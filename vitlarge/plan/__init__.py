"""What a config means in steps for a world size: phases (`phases`), the plan (`plan`) and the lr schedule (`schedule`)."""
