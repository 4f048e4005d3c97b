"""Token- and chunk-level credit assignment as pure torch functions."""
