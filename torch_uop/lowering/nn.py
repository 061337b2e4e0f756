"""nn lowerings."""
