"""The `none` framework: one plain model call per turn, no tools."""
