"""The streaming engine: chunks of whole sequences in, mergeable fixed-size state, metrics out."""
