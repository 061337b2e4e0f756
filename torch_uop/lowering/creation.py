"""creation lowerings."""
