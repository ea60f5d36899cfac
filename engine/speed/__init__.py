"""Speed measured: a run's statistics, plain against lookahead on the same prompt, and the rows and tables of it."""
