"""What a step costs and how many threads to spend: the cost curve, its measurement, CPU contention."""
