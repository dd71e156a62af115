"""Playing episodes of a registered environment with a team (evaluation)."""
