"""Model specs, memory estimation from Hugging Face configs, placement, the launch plan."""
