"""Model artefacts: checkpoints (real or seeded), tokenizers, component loading."""
