"""Small helpers shared across vlhub's sub-packages."""
