"""Speed measured: a run's statistics and plain against lookahead on the same prompt."""
