"""movement lowerings."""
