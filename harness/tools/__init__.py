"""Developer tools over the CLI: the GPU rehearsal, the replay of recorded runs."""
